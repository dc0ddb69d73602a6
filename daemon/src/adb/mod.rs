//! `heapprofd-rs android`: profile processes on an Android device over
//! adb and get the results on the host, as Perfetto's `tools/heap_profile`
//! does. The steps, in order: `adb` on PATH, one device (or
//! `ANDROID_SERIAL`'s), Android 10 or later, the device's ABI and the
//! build of heapprofd-rs for it ([`device_build`]); push it with the
//! profile's config ([`device_config`]) to `/data/local/tmp`; run the
//! profile on the device ([`on_device`], [`pushed`]; or the device's own
//! heapprofd through `perfetto`, [`perfetto`]) with progress on stderr;
//! pull the trace; symbolize it on the host and write the report, pprof
//! files and the `latest` link ([`outputs`]).
//!
//! Exit codes: 0 done, 2 bad usage (nothing to profile, an output
//! directory that cannot be made), 1 any failure (each names what failed
//! and what to do); a profile cut short by a lost device exits 1 after
//! pulling the partial trace, if any, flagged as such.

pub mod args;
pub mod device;
pub mod device_build;
pub mod device_config;
pub mod on_device;
pub mod outcome;
pub mod outputs;
pub mod perfetto;
pub mod progress;
pub mod pushed;
pub mod stop;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::cli::usage_error::UsageError;
use crate::env::Env;
pub use args::AndroidArgs;
use device::Device;
use on_device::DeviceRun;
use outcome::Outcome;

/// The file in a run's directory that says its trace is partial, and why.
pub const PARTIAL_NOTE: &str = "PARTIAL";

/// Runs `heapprofd-rs android`; the exit code.
pub fn run(args: &AndroidArgs, env: &Env) -> Result<i32> {
    if !args.has_target() {
        return Err(UsageError(
            "say what to profile: -n NAME[,NAME...], -p PID[,PID...] or --all".into(),
        )
        .into());
    }
    let config = device_config::trace_config(args);
    if args.print_config {
        print!("{config}");
        return Ok(0);
    }
    let adb = device::find_adb(env.path.as_deref())?;
    let dev = Device::connect(adb, env.android_serial.as_deref())?;
    let sdk = dev.check_android_version()?;
    let abi = dev.getprop("ro.product.cpu.abi")?;
    eprintln!("device {}: Android SDK {sdk}, ABI {abi}", dev.serial);
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let build = if args.perfetto {
        None
    } else {
        Some(device_build::find(
            &abi,
            args.device_build.as_deref(),
            &exe_dir,
        )?)
    };
    let (stamp, run_dir) = make_run_dir(&args.output)?;
    let config_file = run_dir.join("config.txt");
    std::fs::write(&config_file, &config)
        .with_context(|| format!("writing {}", config_file.display()))?;
    let raw = run_dir.join("raw.pftrace");
    let partial = run_dir.join("trace.partial.pftrace");
    let outcome = match &build {
        Some(build) => {
            let run = DeviceRun::new(&stamp);
            pushed::push(&dev, build, &run, &config_file)?;
            // From here on Ctrl-C ends the profile and keeps its trace.
            stop::install()?;
            let mut p =
                progress::Progress::start(&dev.serial, &progress::what(args), args.duration);
            pushed::record(&dev, &run, &mut p, &raw, &partial)?
        }
        None => {
            let remote = perfetto::remote_trace(&stamp);
            eprintln!(
                "starting `{}` on {}",
                perfetto::command(&remote),
                dev.serial
            );
            let mut p =
                progress::Progress::start(&dev.serial, &progress::what(args), args.duration);
            perfetto::record(&dev, &config, &remote, &mut p, &raw, &partial)?
        }
    };
    let raw = match outcome {
        Outcome::Finished(raw) => raw,
        Outcome::Lost { why, partial } => return lost(&run_dir, &why, partial.as_deref()),
    };
    let mut symbols = args.symbols.clone();
    if let Some(b) = &build {
        symbols.push(b.dir.clone());
    }
    let trace = run_dir.join("trace.pftrace");
    if let Some(warning) = outputs::symbolize(&raw, &symbols, &trace)? {
        eprintln!("warning: symbolization failed, trace.pftrace is the trace as pulled: {warning}");
    }
    outputs::report(&trace, &run_dir.join("report"))?;
    let pprofs = outputs::pprofs(&trace, &run_dir)?;
    outputs::link_latest(&args.output, &run_dir)?;
    eprintln!(
        "wrote {}: trace.pftrace, report, {} pprof file{} (heap_dump.<pid>.<heap>.pb.gz); {}/latest points at it",
        run_dir.display(),
        pprofs.len(),
        if pprofs.len() == 1 { "" } else { "s" },
        args.output.display()
    );
    Ok(0)
}

/// A new directory for this run in `out`: its time stamp and path.
fn make_run_dir(out: &Path) -> Result<(String, PathBuf)> {
    std::fs::create_dir_all(out).map_err(|e| {
        UsageError(format!(
            "cannot create the output directory {}: {e}; choose another with -o",
            out.display()
        ))
    })?;
    let base = crate::runtime::setup::local_timestamp();
    for n in 1..1000 {
        let stamp = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        let dir = out.join(format!("heapprofd-{stamp}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok((stamp, dir)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => bail!("cannot create {}: {e}", dir.display()),
        }
    }
    bail!("{}: too many runs in the same second", out.display())
}

/// A profile cut short: the partial trace flagged; exit 1.
fn lost(run_dir: &Path, why: &str, partial: Option<&Path>) -> Result<i32> {
    let what = match partial {
        Some(p) => format!(
            "pulled the partial trace the device had written to {} (flagged in {}; it may lack \
             the last dumps)",
            p.display(),
            run_dir.join(PARTIAL_NOTE).display()
        ),
        None => "no trace could be pulled".into(),
    };
    let note = format!("the connection to the device was lost during the profile: {why}\n");
    std::fs::write(run_dir.join(PARTIAL_NOTE), &note)
        .with_context(|| format!("writing {}", run_dir.display()))?;
    bail!(
        "the device went away during the profile ({why}); {what}; reconnect it \
         (check `adb devices`) and run again"
    )
}
