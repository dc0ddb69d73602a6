//! `heapprofd-rs`: the command-line entry point.
//!
//! Exit codes: 0 on success, 2 on bad usage (clap's, and [`UsageError`]s
//! such as an output path that cannot be created), 1 on failure; `record`
//! exits with the profiled command's own exit code (128 + the signal when
//! it was stopped by Ctrl-C or SIGTERM while the command kept running).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use heapprofd_daemon::cli::UsageError;
use heapprofd_daemon::runtime::record::{self, RecordArgs};
use heapprofd_report::{ConvertArgs, ReportArgs, convert, run_report};

/// A native heap profiler: samples malloc/free in a program with a tiny
/// preloaded client, unwinds out of process, writes Perfetto traces.
#[derive(Debug, Parser)]
#[command(
    name = "heapprofd-rs",
    version,
    propagate_version = true,
    max_term_width = 100
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command under the profiler and write a heap-profile trace.
    Record(RecordArgs),
    /// Summarize a trace: top allocation sites, unreleased memory.
    Report(ReportArgs),
    /// Convert a trace to pprof, folded stacks or a flame graph SVG.
    Convert(ConvertArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Record(args) => record::run(args),
        Command::Report(args) => run_report(args).map(|()| 0),
        Command::Convert(args) => convert(&args).map(|written| {
            for (path, what) in written {
                eprintln!("wrote {what} to {}", path.display());
            }
            0
        }),
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("heapprofd-rs: error: {e:#}");
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
