//! The command lines of `heapprofd-rs report` and `heapprofd-rs convert`
//! (clap, flattened into the binary's CLI).
//!
//! Every output option of `convert` takes `-` for stdout (one at most).

use std::path::PathBuf;

use crate::folded::ValueKind;
use crate::stackopts::StackOptions;

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
#[command(after_help = "\
EXAMPLES:
  heapprofd-rs report trace.pftrace --top 20
  heapprofd-rs report --diff before.pftrace after.pftrace
  heapprofd-rs report --timeline continuous.pftrace
  heapprofd-rs report --peak continuous.pftrace --focus parse --fold-lib libstdc++
  heapprofd-rs report --cpu cpu.pftrace --top 20

Counts are samples unless the trace was recorded with -i 1 (every
allocation); sampled traces also give the allocations the samples stand for,
as an estimate.")]
pub struct ReportArgs {
    /// Trace file written by `heapprofd-rs record` (or by Perfetto's
    /// heapprofd); with --diff, the newer one.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// Compare with BASE: growth per site and function from BASE to TRACE,
    /// frames matched by function and module (not address).
    #[arg(long, value_name = "BASE", conflicts_with_all = ["timeline", "peak", "pid"])]
    pub diff: Option<PathBuf>,
    /// Per dump of a --continuous-dump trace: unreleased bytes, allocation
    /// rate, and the sites that grew most since the previous dump (--top,
    /// 3 by default).
    #[arg(long, conflicts_with = "peak")]
    pub timeline: bool,
    /// Report the dump with the most unreleased memory (of each heap), as
    /// --dump-at-max would have.
    #[arg(long)]
    pub peak: bool,
    /// The stack samples instead of the heaps: CPU time (`record
    /// --cpu-time`) and requested stacks, per process and event: hot
    /// functions by self and inclusive time, per-thread totals and lost
    /// samples.
    #[arg(long, conflicts_with_all = ["diff", "timeline", "peak", "by"])]
    pub cpu: bool,
    /// Allocation sites to list per table [default: 10]; with --timeline,
    /// sites that grew to list per dump [default: 3].
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Callers shown per site.
    #[arg(long, default_value_t = 6, value_name = "N")]
    pub depth: usize,
    /// Exact traces (-i 1): count allocations freed within N allocations of
    /// the process as short-lived (N is rounded down to 2^k - 1).
    #[arg(long, default_value_t = 1023, value_name = "N")]
    pub short_lived: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Only this process.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Only this heap (e.g. libc.malloc).
    #[arg(long, value_name = "NAME")]
    pub heap: Option<String>,
    /// Totals per value of the user context key KEY (set with
    /// heapprofd_context_create), per process and heap, instead of the
    /// report.
    #[arg(long, value_name = "KEY", conflicts_with_all = ["diff", "timeline"])]
    pub by: Option<String>,
    /// Stack options.
    #[command(flatten)]
    pub stacks: StackOptions,
}

/// `heapprofd-rs convert`: turn a heap profile trace into other formats.
#[derive(Debug, Clone, clap::Args)]
#[command(
    group(clap::ArgGroup::new("output").required(true).multiple(true)),
    after_help = "\
EXAMPLES:
  heapprofd-rs convert trace.pftrace --html report.html
  heapprofd-rs convert trace.pftrace --svg flame.svg --value unreleased-space
  heapprofd-rs convert trace.pftrace --collapsed - | flamegraph.pl > flame.svg
  heapprofd-rs convert --diff before.pftrace after.pftrace --svg diff.svg
  heapprofd-rs convert continuous.pftrace --timeline-svg heap.svg
  heapprofd-rs convert continuous.pftrace --timeline-png heap.png
  heapprofd-rs convert --cpu cpu.pftrace --pprof cpu.pb.gz   (then: go tool pprof -top cpu.pb.gz)

Every output takes `-` for stdout."
)]
pub struct ConvertArgs {
    /// Trace file written by `heapprofd-rs record` (or by Perfetto's
    /// heapprofd); with --diff, the newer one.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// Convert the difference from BASE to TRACE (folded stacks with both
    /// values, a differential flame graph, a pprof profile of the growth).
    #[arg(long, value_name = "BASE", conflicts_with_all = ["html", "timeline_svg", "timeline_png", "pid", "peak"])]
    pub diff: Option<PathBuf>,
    /// Write a gzipped pprof profile (for `pprof`, speedscope…).
    #[arg(long, value_name = "OUT.pb.gz", group = "output")]
    pub pprof: Option<PathBuf>,
    /// Convert the CPU-time samples (`record --cpu-time`) instead of the
    /// heaps: with --pprof, a `cpu`/`nanoseconds` profile as Go's, with
    /// pid, tid and thread labels.
    #[arg(long, requires = "pprof", conflicts_with_all = ["diff", "collapsed", "svg", "html",
          "timeline_svg", "timeline_png", "peak", "heap"])]
    pub cpu: bool,
    /// Write folded stacks (`a;b;c value`, for flamegraph.pl, inferno…).
    #[arg(long, value_name = "OUT.txt", group = "output")]
    pub collapsed: Option<PathBuf>,
    /// Write a flame graph SVG.
    #[arg(long, value_name = "OUT.svg", group = "output")]
    pub svg: Option<PathBuf>,
    /// Write one self-contained HTML page (works offline): interactive
    /// flame graph, top tables, size histogram, timeline.
    #[arg(long, value_name = "OUT.html", group = "output")]
    pub html: Option<PathBuf>,
    /// Write an SVG plot of unreleased memory over time per process.
    #[arg(long, value_name = "OUT.svg", group = "output")]
    pub timeline_svg: Option<PathBuf>,
    /// Write the same plot as a PNG (lines and ticks, no labels).
    #[arg(long, value_name = "OUT.png", group = "output")]
    pub timeline_png: Option<PathBuf>,
    /// Value of the folded stacks and the flame graph. The default,
    /// allocated bytes, shows where a finished run allocated (as heaptrack's
    /// flame graph does); unreleased-space shows what was never freed (or
    /// live at the peak of a --dump-at-max trace).
    #[arg(long, value_enum, default_value_t = ValueKind::AllocSpace)]
    pub value: ValueKind,
    /// Convert the dump with the most unreleased memory instead of the last.
    #[arg(long)]
    pub peak: bool,
    /// Keep the outermost N frames of each stack (deeper values are summed
    /// into the last kept frame).
    #[arg(long, value_name = "N")]
    pub depth: Option<usize>,
    /// Only this process.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Only this heap (e.g. libc.malloc).
    #[arg(long, value_name = "NAME")]
    pub heap: Option<String>,
    /// Stack options.
    #[command(flatten)]
    pub stacks: StackOptions,
}
