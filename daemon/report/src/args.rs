//! The command lines of `heapprofd-rs report` and `heapprofd-rs convert`
//! (clap, flattened into the binary's CLI).

use std::path::PathBuf;

use crate::folded::ValueKind;

/// Output format of `report`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Human-readable text.
    #[default]
    Text,
    /// JSON (one object).
    Json,
}

/// `heapprofd-rs report`: summarize a heap profile trace.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Trace file written by `heapprofd-rs record` (or by Perfetto's heapprofd).
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// Allocation sites to list per table.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Only this process.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Only this heap (e.g. libc.malloc).
    #[arg(long, value_name = "NAME")]
    pub heap: Option<String>,
}

/// `heapprofd-rs convert`: turn a heap profile trace into other formats.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("output").required(true).multiple(true)))]
pub struct ConvertArgs {
    /// Trace file written by `heapprofd-rs record` (or by Perfetto's heapprofd).
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// Write a gzipped pprof profile (for `pprof`, speedscope…).
    #[arg(long, value_name = "OUT.pb.gz", group = "output")]
    pub pprof: Option<PathBuf>,
    /// Write folded stacks (`a;b;c value`, for flamegraph.pl, inferno…).
    #[arg(long, value_name = "OUT.txt", group = "output")]
    pub collapsed: Option<PathBuf>,
    /// Write a flame graph SVG.
    #[arg(long, value_name = "OUT.svg", group = "output")]
    pub svg: Option<PathBuf>,
    /// Value of the folded stacks and the flame graph.
    #[arg(long, value_enum, default_value_t = ValueKind::UnreleasedSpace)]
    pub value: ValueKind,
    /// Only this process.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Only this heap (e.g. libc.malloc).
    #[arg(long, value_name = "NAME")]
    pub heap: Option<String>,
}
