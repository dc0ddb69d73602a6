//! `heapprofd-rs report` and `heapprofd-rs convert`: offline tools on a
//! trace file (ours or heapprofd's), built on [`heapprofd_model::trace::read_trace`].
//!
//! * [`run_report`]: totals and top allocation sites per process and heap,
//!   as text (heaptrack_print style) or JSON.
//! * [`run_convert`]: pprof (`.pb.gz`), folded stacks, flame graph SVG.
//!
//! The `*Args` structs derive [`clap::Args`] for the main command line.

pub mod folded;
pub mod pprof;
pub mod summary;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

use heapprofd_model::trace::{HeapProfile, TraceData, TraceError, read_trace};

pub use folded::{folded_lines, write_flamegraph};
pub use pprof::{to_pprof, write_pprof_gz};
pub use summary::{Report, build_report, write_text};

/// Which heaps to include.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this process.
    pub pid: Option<u32>,
    /// Only this heap.
    pub heap: Option<String>,
}

impl Filter {
    /// Whether `h` is selected.
    pub fn matches(&self, h: &HeapProfile) -> bool {
        self.pid.is_none_or(|p| p == h.pid) && self.heap.as_deref().is_none_or(|n| n == h.heap_name)
    }
}

/// The value a folded stack or flame graph shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ValueKind {
    /// Bytes allocated (cumulative).
    AllocSpace,
    /// Allocations (cumulative).
    AllocObjects,
    /// Bytes allocated and not freed at the end (or at the peak, for
    /// dump-at-max traces).
    UnreleasedSpace,
    /// Allocations not freed.
    UnreleasedObjects,
}

impl ValueKind {
    /// One-line description.
    pub fn description(self) -> &'static str {
        match self {
            ValueKind::AllocSpace => "allocated bytes",
            ValueKind::AllocObjects => "number of allocations",
            ValueKind::UnreleasedSpace => "bytes not freed",
            ValueKind::UnreleasedObjects => "allocations not freed",
        }
    }
}

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

/// Reads a trace with errors that name the file and say what to do.
pub fn load_trace(path: &Path) -> anyhow::Result<TraceData> {
    let read = std::fs::File::open(path)
        .map_err(TraceError::from)
        .and_then(read_trace);
    read.map_err(|e| {
        let hint = match &e {
            TraceError::Io(io) if io.kind() == io::ErrorKind::NotFound => {
                "check the path (record writes the trace where -o says)"
            }
            TraceError::Io(_) => "check that the file is readable",
            _ => "is it a trace written by `heapprofd-rs record` or Perfetto?",
        };
        anyhow::anyhow!("cannot read trace {}: {e}; {hint}", path.display())
    })
}

fn check_selection(data: &TraceData, filter: &Filter, path: &Path) -> anyhow::Result<()> {
    if (filter.pid.is_some() || filter.heap.is_some())
        && !data.heaps.iter().any(|h| filter.matches(h))
    {
        let have: Vec<String> = data
            .heaps
            .iter()
            .map(|h| format!("pid {} heap {}", h.pid, h.heap_name))
            .collect();
        anyhow::bail!(
            "{} has no heap profile matching the filter; it has: {}",
            path.display(),
            if have.is_empty() {
                "none".to_owned()
            } else {
                have.join(", ")
            }
        );
    }
    Ok(())
}

/// Runs `heapprofd-rs report`, printing to stdout.
pub fn run_report(args: ReportArgs) -> anyhow::Result<()> {
    let stdout = io::stdout();
    report_to(&args, &mut stdout.lock())
}

/// `report` into any writer (tests).
pub fn report_to(args: &ReportArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let data = load_trace(&args.trace)?;
    let filter = Filter {
        pid: args.pid,
        heap: args.heap.clone(),
    };
    check_selection(&data, &filter, &args.trace)?;
    let report = build_report(&args.trace.display().to_string(), &data, &filter, args.top);
    match args.format {
        Format::Text => write_text(&report, out),
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, &report).map_err(io::Error::from)?;
            writeln!(out)
        }
    }
    .or_else(ignore_broken_pipe)?;
    Ok(())
}

fn ignore_broken_pipe(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(e)
    }
}

fn create(path: &Path) -> anyhow::Result<BufWriter<File>> {
    let f = File::create(path).with_context(|| {
        format!(
            "cannot create {}: check the directory exists and is writable",
            path.display()
        )
    })?;
    Ok(BufWriter::new(f))
}

fn finish(mut w: BufWriter<File>, path: &Path) -> anyhow::Result<()> {
    w.flush()
        .and_then(|()| w.get_ref().sync_all())
        .with_context(|| format!("cannot write {} (disk full?)", path.display()))
}

/// Runs `heapprofd-rs convert`; prints what it wrote to stderr.
pub fn run_convert(args: ConvertArgs) -> anyhow::Result<()> {
    let written = convert(&args)?;
    for (path, what) in written {
        eprintln!("wrote {what} to {}", path.display());
    }
    Ok(())
}

/// `convert` without printing; returns the files written.
pub fn convert(args: &ConvertArgs) -> anyhow::Result<Vec<(PathBuf, &'static str)>> {
    let data = load_trace(&args.trace)?;
    let filter = Filter {
        pid: args.pid,
        heap: args.heap.clone(),
    };
    check_selection(&data, &filter, &args.trace)?;
    let mut written = Vec::new();
    if let Some(path) = &args.pprof {
        let profile = to_pprof(&data, &filter);
        let mut w = create(path)?;
        write_pprof_gz(&profile, &mut w)
            .with_context(|| format!("cannot write {} (disk full?)", path.display()))?;
        finish(w, path)?;
        written.push((path.clone(), "pprof profile"));
    }
    let lines = if args.collapsed.is_some() || args.svg.is_some() {
        folded_lines(&data, &filter, args.value)
    } else {
        Vec::new()
    };
    if let Some(path) = &args.collapsed {
        let mut w = create(path)?;
        for l in &lines {
            writeln!(w, "{l}")
                .with_context(|| format!("cannot write {} (disk full?)", path.display()))?;
        }
        finish(w, path)?;
        written.push((path.clone(), "folded stacks"));
    }
    if let Some(path) = &args.svg {
        let mut w = create(path)?;
        let name = args
            .trace
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let title = format!("{name}: {}", args.value.description());
        write_flamegraph(&lines, args.value, &title, &mut w)
            .with_context(|| format!("cannot write {}", path.display()))?;
        finish(w, path)?;
        written.push((path.clone(), "flame graph"));
    }
    Ok(written)
}
