//! Running `report` and `convert`: reading the trace (with errors that
//! name the file and say what to do), checking the selection, writing the
//! outputs.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use heapprofd_model::trace::{TraceData, TraceError, read_trace};

use crate::args::{ConvertArgs, Format, ReportArgs};
use crate::filter::Filter;
use crate::folded::{folded_lines, write_flamegraph};
use crate::pprof::{to_pprof, write_pprof_gz};
use crate::summary::{build_report, write_text};

/// Reads a trace with errors that name the file and say what to do.
pub fn load_trace(path: &Path) -> anyhow::Result<TraceData> {
    let read = std::fs::File::open(path)
        .map_err(TraceError::Read)
        .and_then(read_trace);
    read.map_err(|e| {
        let hint = match &e {
            TraceError::Read(io) if io.kind() == io::ErrorKind::NotFound => {
                "check the path (record writes the trace where -o says)"
            }
            TraceError::Read(_) => "check that the file is readable",
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

/// Runs `heapprofd-rs convert`; returns the files written and what each
/// is (the caller tells the user).
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
