//! The binary's command line: the subcommands and their arguments (clap),
//! and what each runs.
//!
//! Conventions (the same for every command): durations take units (`500ms`,
//! `3s`, `2m`, `1h`; a bare number is seconds), sizes take units (`4096`,
//! `32k`, `32KiB`, `1M`, `1MiB`, `1g`; `k`/`KB`/`KiB` all mean 1024 bytes, as
//! every heap profiler's users expect).

pub mod record_args;
pub mod units;
pub mod usage_error;

use clap::{Parser, Subcommand};
use heapprofd_report::{ConvertArgs, ReportArgs, convert, run_report};

use crate::env::Env;
use crate::install::{self, InstallArgs, UninstallArgs};
use crate::runtime::{attach, record, service, service_command, service_record};
pub use record_args::RecordArgs;
pub use usage_error::UsageError;

/// A native heap profiler: samples malloc/free in a program with a tiny
/// preloaded client, unwinds out of process, writes Perfetto traces.
#[derive(Debug, Parser)]
#[command(
    name = "heapprofd-rs",
    version,
    propagate_version = true,
    max_term_width = 100,
    after_help = "`heapprofd-rs --pid PID [OPTIONS]` is short for \
                  `heapprofd-rs record --pid PID [OPTIONS]`."
)]
pub struct Cli {
    #[command(subcommand)]
    /// The subcommand.
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command under the profiler and write a heap-profile trace.
    Record(RecordArgs),
    /// Run the profiling service in the foreground (control socket
    /// `control.sock` in $HEAPPROFD_SERVICE_DIR, else /run/heapprofd-rs for
    /// root, else /tmp/heapprofd-rs-<uid>), for `record -n NAME`, `record
    /// --all` and `record -p PID,PID`; several profiles run at once. Run by
    /// root it serves every user, each profile seeing only its requester's
    /// processes (all of them for root); scripts/heapprofd-rs.service runs it
    /// under systemd.
    Daemon,
    /// Put the dormant client into every new process of the machine (root):
    /// copy it to /usr/lib/heapprofd-rs/preload/ and add it to
    /// /etc/ld.so.preload; `uninstall` undoes it exactly.
    Install(InstallArgs),
    /// Undo `install`: /etc/ld.so.preload as it was before (or absent), the
    /// copied library and the install state removed.
    Uninstall(UninstallArgs),
    /// Summarize a trace: top allocation sites, unreleased memory.
    Report(ReportArgs),
    /// Convert a trace to pprof, folded stacks or a flame graph SVG.
    Convert(ConvertArgs),
    /// Add symbols to a trace recorded with --no-symbolize, on a device or
    /// by Perfetto's own heapprofd: binaries matched by build id in the
    /// --symbols directories.
    Symbolize(crate::offline_symbols::SymbolizeArgs),
}

/// Parses the command line (exits on bad usage, with clap's message); a
/// `record` given a command without `--` also gets the line to type.
pub fn parse() -> Cli {
    let argv = pid_shorthand(std::env::args_os().collect());
    match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            if let Some(hint) = record_hint(&e, &argv) {
                let _ = e.print();
                eprintln!("\n{hint}");
                std::process::exit(2);
            }
            e.exit()
        }
    }
}

/// `heapprofd-rs --pid PID [OPTIONS]` (or `-p`), as the design card names
/// it, is `heapprofd-rs record --pid PID [OPTIONS]`.
fn pid_shorthand(mut argv: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let first = argv.get(1).and_then(|a| a.to_str()).unwrap_or("");
    if first == "--pid" || first == "-p" || first.starts_with("--pid=") {
        argv.insert(1, "record".into());
    }
    argv
}

/// `heapprofd-rs record ls -l` (no `--`): the corrected command line.
fn record_hint(e: &clap::Error, argv: &[std::ffi::OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument
        || argv.get(1).is_none_or(|a| a != "record")
        || argv.iter().any(|a| a == "--")
    {
        return None;
    }
    let Some(ContextValue::String(bad)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    // Only a positional (a command), not a mistyped option.
    if bad.starts_with('-') {
        return None;
    }
    let pos = argv.iter().position(|a| a == bad.as_str())?;
    let (opts, cmd): (Vec<String>, Vec<String>) = (
        argv[2..pos]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        argv[pos..]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    );
    let mut line = vec!["heapprofd-rs".to_owned(), "record".to_owned()];
    line.extend(opts);
    line.push("--".to_owned());
    line.extend(cmd);
    Some(format!(
        "hint: the command to profile goes after `--`:\n  {}",
        line.join(" ")
    ))
}

/// Runs `record` or `report`; returns the exit code to exit with. `convert`
/// returns what it wrote, for the binary to tell ([`convert`]).
pub fn run(command: Command, env: &Env) -> anyhow::Result<Ran> {
    Ok(match command {
        Command::Daemon => Ran::Exit(service::run(env)?),
        Command::Record(args)
            if !args.name.is_empty() || args.config.is_some() || args.all || args.pid.len() > 1 =>
        {
            Ran::Exit(service_record::run(args, env)?)
        }
        Command::Record(args) if !args.pid.is_empty() => Ran::Exit(attach::run(args, env)?),
        Command::Record(args) => match service_command::try_run(&args, env)? {
            Some(code) => Ran::Exit(code),
            None => Ran::Exit(record::run(args, env)?),
        },
        Command::Install(args) => Ran::Exit(install::install(&args)?),
        Command::Uninstall(args) => Ran::Exit(install::uninstall(&args)?),
        Command::Report(args) => Ran::Exit(run_report(args).map(|()| 0)?),
        Command::Convert(args) => Ran::Wrote(convert(&args)?),
        Command::Symbolize(args) => Ran::Exit(crate::offline_symbols::run(&args)?),
    })
}

/// What a command did.
#[derive(Debug)]
pub enum Ran {
    /// Exit with this code.
    Exit(i32),
    /// `convert` wrote these files (path, what); exit 0.
    Wrote(Vec<(std::path::PathBuf, &'static str)>),
}
