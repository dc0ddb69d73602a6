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
use crate::runtime::{attach, record};
pub use record_args::RecordArgs;
pub use usage_error::UsageError;

/// A native heap profiler: samples malloc/free in a program with a tiny
/// preloaded client, unwinds out of process, writes Perfetto traces.
#[derive(Debug, Parser)]
#[command(
    name = "heapprofd-rs",
    version,
    propagate_version = true,
    max_term_width = 100
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
    /// Summarize a trace: top allocation sites, unreleased memory.
    Report(ReportArgs),
    /// Convert a trace to pprof, folded stacks or a flame graph SVG.
    Convert(ConvertArgs),
}

/// Runs `record` or `report`; returns the exit code to exit with. `convert`
/// returns what it wrote, for the binary to tell ([`convert`]).
pub fn run(command: Command, env: &Env) -> anyhow::Result<Ran> {
    Ok(match command {
        Command::Record(args) if args.pid.is_some() => Ran::Exit(attach::run(args, env)?),
        Command::Record(args) => Ran::Exit(record::run(args, env)?),
        Command::Report(args) => Ran::Exit(run_report(args).map(|()| 0)?),
        Command::Convert(args) => Ran::Wrote(convert(&args)?),
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
