//! What `record` and `record --pid` prepare before anything runs: the
//! trace file (a path that cannot be created is a usage error, exit 2), the
//! daemon's options, the client library, the default output name.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use heapprofd_proto::wire::ClientConfig;

use super::bookkeeper::BookkeeperOptions;
use super::server::DaemonOptions;
use crate::cli::record_args::RecordArgs;
use crate::cli::usage_error::UsageError;
use crate::service::contexts::apply_context_filters;

/// Creates the trace file and the daemon's options from the arguments
/// shared by `record -- CMD` and `record --pid`. A trace path that cannot be
/// created is a bad argument (exit 2), found before anything runs.
pub(super) fn daemon_options(
    args: &RecordArgs,
    socket: PathBuf,
    output: &Path,
) -> Result<DaemonOptions> {
    // The heaps first: a bad selection leaves no empty trace file behind.
    let mut client = ClientConfig::new(args.interval, args.ring_size());
    client.seed = args.seed;
    let heaps = args.heap_selection();
    heaps
        .check()
        .and_then(|()| heaps.apply(args.interval, &mut client))
        .and_then(|()| apply_context_filters(&args.context, &mut client))
        .map_err(UsageError)?;
    args.check_sampling().map_err(UsageError)?;
    client.cpu_period_ns = args.cpu_period_ns();
    (client.perf_event, client.perf_period) = args.perf_event();
    if args.no_heap {
        client.clear_heaps();
        client.flags &= !ClientConfig::FLAG_ALL_HEAPS;
    }
    // Not truncated here: an earlier trace at this path is cut by the
    // bookkeeping thread when it starts (`Book::open`), while CMD starts
    // (truncating one took 0.03-0.46 ms, here, on ext4).
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(output)
        .map_err(|e| {
            UsageError(format!(
                "cannot create the trace file {}: {e}; choose another path with -o",
                output.display()
            ))
        })?;
    if !args.no_stack_reuse {
        client.flags |= ClientConfig::FLAG_STACK_REUSE;
    }
    // The program `record` runs or names is the one profiled: its first
    // samples should not pay the free set's page faults.
    client.flags |= ClientConfig::FLAG_PREFAULT_FREE_SET;
    // A seeded run is for reproducible sampling, which a rate that follows
    // the daemon's pace would not be.
    if !args.fixed_interval && args.seed == 0 {
        client.flags |= ClientConfig::FLAG_ADAPTIVE_INTERVAL;
    }
    if !args.no_block_client {
        client.flags |= ClientConfig::FLAG_BLOCK_CLIENT;
        client.block_timeout_us = args
            .block_client
            .unwrap_or(Duration::from_secs(5))
            .as_micros() as u64;
    }
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, 4)
    });
    Ok(DaemonOptions {
        socket,
        client,
        workers,
        symbolize: !args.no_symbolize,
        symbol_store: args.symbol_store(),
        book: BookkeeperOptions {
            owns_interner: true,
            output: file,
            output_path: output.to_path_buf(),
            interval: libc_malloc_interval(&client),
            dump_at_max: args.dump_at_max,
            symbolize: !args.no_symbolize,
        },
    })
}

/// The interval libc.malloc's heap is declared with in the trace: its own,
/// or the default when it is not sampled (its profile stays empty).
pub(super) fn libc_malloc_interval(c: &ClientConfig) -> u64 {
    match c.interval_for(heapprofd_proto::wire::HEAP_LIBC_MALLOC_NAME) {
        0 => c.sampling_interval,
        n => n,
    }
}

/// Finds the client library: `--client-lib`, else next to this executable
/// (as `cargo build` leaves it), else in `../lib/heapprofd-rs/` beside the
/// executable's directory (as `scripts/install.sh` puts it).
pub(crate) fn find_client_lib(explicit: Option<&Path>) -> Result<PathBuf> {
    const NAME: &str = heapprofd_proto::attach::CLIENT_FILE_NAME;
    let candidates: Vec<PathBuf> = match explicit {
        Some(p) => vec![p.to_path_buf()],
        None => {
            let exe = std::env::current_exe().context("finding this executable's directory")?;
            match exe.parent() {
                Some(dir) => vec![dir.join(NAME), dir.join("../lib/heapprofd-rs").join(NAME)],
                None => vec![PathBuf::from(NAME)],
            }
        }
    };
    let Some(found) = candidates.iter().find(|c| c.is_file()) else {
        let tried: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
        bail!(
            "client library not found (looked for {}); build it with `cargo build --release` \
             (it is placed next to heapprofd-rs), install both with scripts/install.sh, \
             or pass --client-lib PATH",
            tried.join(" and ")
        );
    };
    // LD_PRELOAD needs an absolute path once CMD changes directory.
    std::fs::canonicalize(found).with_context(|| format!("resolving {}", found.display()))
}

/// The client library `record` preloads: the one installed system-wide
/// (`heapprofd-rs install`) if there is one and `explicit` is not given (every
/// process loads it anyway; a second copy beside it would stay inert), else
/// [`find_client_lib`].
pub(super) fn client_lib_to_preload(explicit: Option<&Path>) -> Result<PathBuf> {
    if explicit.is_none()
        && let Some(installed) = crate::install::installed::preloaded_library()?
    {
        return Ok(installed);
    }
    find_client_lib(explicit)
}

/// `heapprofd-<program>-<pid>-<YYYYmmdd-HHMMSS>.pftrace` in the current directory.
pub(super) fn default_output(program: &str) -> PathBuf {
    let name = Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("cmd");
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    PathBuf::from(format!(
        "heapprofd-{name}-{}-{}.pftrace",
        std::process::id(),
        local_timestamp()
    ))
}

/// Local time as `YYYYmmdd-HHMMSS` (nix has no `localtime_r`).
pub(crate) fn local_timestamp() -> String {
    // SAFETY: time/localtime_r write into the zeroed struct we pass.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return t.to_string();
        }
        format!(
            "{:04}{:02}{:02}-{:02}{:02}{:02}",
            tm.tm_year + 1900,
            tm.tm_mon + 1,
            tm.tm_mday,
            tm.tm_hour,
            tm.tm_min,
            tm.tm_sec
        )
    }
}
