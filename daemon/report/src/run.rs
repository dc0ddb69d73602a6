//! Running `report` and `convert`: reading the traces (with errors that
//! name the file and say what to do), checking the selection, applying the
//! stack options, writing the outputs.
//!
//! A truncated trace is reported (or converted) as far as it could be
//! read, then the command fails (exit 1) saying where the trace ends: a
//! cut trace is not a complete profile, and scripts must not take it for
//! one.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use heapprofd_model::trace::{TraceData, TraceError, read_trace};

use crate::args::{ConvertArgs, Format, ReportArgs};
use crate::by_context::{by_context, write_by_context};
use crate::cpu::{cpu_profiles, write_cpu};
use crate::diff::{diff, diff_folded, write_diff};
use crate::filter::Filter;
use crate::folded::{folded_lines, title, write_flamegraph};
use crate::html::write_html;
use crate::output::{Output, check_outputs};
use crate::pprof::{to_pprof, to_pprof_diff, write_pprof_gz};
use crate::pprof_cpu::to_pprof_cpu;
use crate::progress::Progress;
use crate::summary::{Report, ReportOptions, build_report, heap_report, truncated_of};
use crate::text::{TextOptions, write_text};
use crate::timeline::{GREW_MOST_SITES, at_peak, timelines, write_timelines};
use crate::timeline_png::write_timeline_png;
use crate::timeline_svg::write_timeline_svg;

/// Reads a trace with errors that name the file and say what to do.
pub fn load_trace(path: &Path) -> anyhow::Result<TraceData> {
    let label = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let read = std::fs::File::open(path)
        .and_then(|f| Ok((f.metadata()?.len(), f)))
        .map_err(TraceError::Read)
        .and_then(|(len, f)| read_trace(Progress::on_terminal(f, len, &label)));
    read.map_err(|e| {
        let (what, hint) = match &e {
            TraceError::Read(io) if io.kind() == io::ErrorKind::NotFound => (
                "no such file".to_owned(),
                "check the path (record writes the trace where -o says)",
            ),
            TraceError::Read(io) => (io.to_string(), "check that the file is readable"),
            other => (
                other.to_string(),
                "is it a trace written by `heapprofd-rs record` or Perfetto?",
            ),
        };
        anyhow::anyhow!("cannot read trace {}: {what}; {hint}", path.display())
    })
}

/// The error after a truncated trace was reported or converted.
fn truncated_error(path: &Path, data: &TraceData, done: &str) -> Option<anyhow::Error> {
    let t = data.truncated.as_ref()?;
    Some(anyhow::anyhow!(
        "{} is truncated: {} at byte {} of {}; {done} covers only what was read before it \
         (was `record` killed, or the file copied while it was being written?)",
        path.display(),
        t.what,
        t.offset,
        t.file_len
    ))
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

fn json(out: &mut impl Write, v: &impl serde::Serialize) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, v).map_err(io::Error::from)?;
    writeln!(out)
}

/// `report` into any writer (tests).
pub fn report_to(args: &ReportArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let name = args.trace.display().to_string();
    let filter = Filter {
        pid: args.pid,
        heap: args.heap.clone(),
    };
    let opts = ReportOptions {
        top: args.top.unwrap_or(10),
        short_lived: args.short_lived,
    };
    if let Some(base_path) = &args.diff {
        let base = load_trace(base_path)?;
        let new = load_trace(&args.trace)?;
        check_selection(&base, &filter, base_path)?;
        check_selection(&new, &filter, &args.trace)?;
        let (b, n) = (
            args.stacks.apply(&base, None),
            args.stacks.apply(&new, None),
        );
        let d = diff(
            &base_path.display().to_string(),
            &b,
            &name,
            &n,
            args.heap.as_deref(),
            opts.top,
        );
        match args.format {
            Format::Text => write_diff(out, &d),
            Format::Json => json(out, &d),
        }
        .or_else(ignore_broken_pipe)?;
        return match truncated_error(base_path, &base, "the diff")
            .or_else(|| truncated_error(&args.trace, &new, "the diff"))
        {
            Some(e) => Err(e),
            None => Ok(()),
        };
    }
    let raw = load_trace(&args.trace)?;
    if args.cpu {
        let profiles = cpu_profiles(&raw, args.pid, args.top.unwrap_or(10));
        if args.pid.is_some() && profiles.is_empty() {
            anyhow::bail!(
                "{} has no stack samples of pid {}; `report --cpu` without --pid lists them all",
                args.trace.display(),
                args.pid.unwrap_or(0)
            );
        }
        match args.format {
            Format::Text => write_cpu(out, &name, &profiles),
            Format::Json => json(
                out,
                &serde_json::json!({ "trace": name, "profiles": profiles,
                "truncated": truncated_of(&raw) }),
            ),
        }
        .or_else(ignore_broken_pipe)?;
        return match truncated_error(&args.trace, &raw, "the report above") {
            Some(e) => Err(e),
            None => Ok(()),
        };
    }
    check_selection(&raw, &filter, &args.trace)?;
    let data = args.stacks.apply(&raw, None);
    if let Some(key) = &args.by {
        let data = if args.peak { at_peak(&data).0 } else { data };
        let heaps = by_context(&data, &filter, key);
        match args.format {
            Format::Text => write_by_context(out, &name, &heaps),
            Format::Json => json(
                out,
                &serde_json::json!({ "trace": name, "heaps": heaps,
                "truncated": truncated_of(&raw) }),
            ),
        }
        .or_else(ignore_broken_pipe)?;
    } else if args.timeline {
        let t = timelines(&data, &filter, args.top.unwrap_or(GREW_MOST_SITES));
        match args.format {
            Format::Text => write_timelines(out, &name, &t),
            Format::Json => json(
                out,
                &serde_json::json!({ "trace": name, "heaps": t,
                "truncated": truncated_of(&raw) }),
            ),
        }
        .or_else(ignore_broken_pipe)?;
    } else {
        let report = if args.peak {
            let (peak, as_of) = at_peak(&data);
            Report {
                trace: name.clone(),
                heaps: peak
                    .heaps
                    .iter()
                    .zip(as_of)
                    .filter(|(h, _)| filter.matches(h))
                    .map(|(h, a)| heap_report(&peak, h, &opts, a))
                    .collect(),
                warnings: data.warnings.clone(),
                truncated: truncated_of(&data),
            }
        } else {
            build_report(&name, &data, &filter, &opts)
        };
        match args.format {
            Format::Text => write_text(
                &report,
                out,
                &TextOptions {
                    callers: args.depth,
                },
            ),
            Format::Json => json(out, &report),
        }
        .or_else(ignore_broken_pipe)?;
    }
    match truncated_error(&args.trace, &raw, "the report above") {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn ignore_broken_pipe(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(e)
    }
}

/// Writes one output with `f`, then flushes it.
fn write_output(
    out: Output,
    f: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut out = out;
    let what = out.write_error();
    match f(out.writer()) {
        // A reader that stopped reading stdout (`convert ... - | head`):
        // nothing more is wanted, as for `report`.
        Err(e) if out.is_stdout() && is_broken_pipe(&e) => return Ok(()),
        r => r.with_context(|| what)?,
    }
    out.finish()
}

/// Whether `e` (or what caused it) is a write into a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// The outputs of a `convert`, created before anything is computed (a path
/// that cannot be created is a usage error, exit 2).
struct Outputs {
    list: Vec<(PathBuf, Option<Output>, &'static str)>,
}

impl Outputs {
    fn create(args: &ConvertArgs) -> anyhow::Result<Outputs> {
        let wanted = [
            (&args.pprof, "pprof profile"),
            (&args.collapsed, "folded stacks"),
            (&args.svg, "flame graph"),
            (&args.html, "HTML report"),
            (&args.timeline_svg, "timeline plot"),
            (&args.timeline_png, "timeline PNG"),
        ];
        let paths: Vec<&PathBuf> = wanted.iter().filter_map(|(p, _)| p.as_ref()).collect();
        check_outputs(&paths)?;
        let mut list = Vec::new();
        for (p, what) in wanted {
            if let Some(p) = p {
                list.push((p.clone(), Some(Output::create(p)?), what));
            }
        }
        Ok(Outputs { list })
    }

    fn take(&mut self, what: &str) -> Option<Output> {
        self.list
            .iter_mut()
            .find(|(_, _, w)| *w == what)
            .and_then(|(_, o, _)| o.take())
    }
}

/// Runs `heapprofd-rs convert`; returns the files written and what each
/// is (the caller tells the user; stdout is not listed).
pub fn convert(args: &ConvertArgs) -> anyhow::Result<Vec<(PathBuf, &'static str)>> {
    let filter = Filter {
        pid: args.pid,
        heap: args.heap.clone(),
    };
    // Read first: a trace that cannot be read leaves no output files.
    let base = args.diff.as_ref().map(|b| load_trace(b)).transpose()?;
    let raw = load_trace(&args.trace)?;
    if args.cpu {
        let Some(profile) = to_pprof_cpu(&raw, args.pid) else {
            anyhow::bail!(
                "{} has no CPU-time samples{}; record them with `record --cpu-time`",
                args.trace.display(),
                args.pid.map(|p| format!(" of pid {p}")).unwrap_or_default()
            );
        };
        let mut outs = Outputs::create(args)?;
        let written = outs
            .list
            .iter()
            .filter(|(p, _, _)| !crate::output::is_stdout(p))
            .map(|(p, _, w)| (p.clone(), *w))
            .collect();
        if let Some(o) = outs.take("pprof profile") {
            write_output(o, |w| Ok(write_pprof_gz(&profile, w)?))?;
        }
        return match truncated_error(&args.trace, &raw, "the output") {
            Some(e) => Err(e),
            None => Ok(written),
        };
    }
    check_selection(&raw, &filter, &args.trace)?;
    let mut outs = Outputs::create(args)?;
    let written: Vec<(PathBuf, &'static str)> = outs
        .list
        .iter()
        .filter(|(p, _, _)| !crate::output::is_stdout(p))
        .map(|(p, _, w)| (p.clone(), *w))
        .collect();
    let data = args.stacks.apply(&raw, args.depth);
    let data = if args.peak { at_peak(&data).0 } else { data };
    match &base {
        Some(base) => convert_diff(args, &mut outs, base, &data)?,
        None => convert_one(args, &mut outs, &data, &filter)?,
    }
    let truncated = base
        .as_ref()
        .zip(args.diff.as_ref())
        .and_then(|(b, p)| truncated_error(p, b, "the output"))
        .or_else(|| truncated_error(&args.trace, &raw, "the output"));
    match truncated {
        Some(e) => Err(e.context(format!(
            "wrote {}",
            written
                .iter()
                .map(|(p, _)| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        None => Ok(written),
    }
}

fn convert_one(
    args: &ConvertArgs,
    outs: &mut Outputs,
    data: &TraceData,
    filter: &Filter,
) -> anyhow::Result<()> {
    if let Some(o) = outs.take("pprof profile") {
        let profile = to_pprof(data, filter);
        write_output(o, |w| Ok(write_pprof_gz(&profile, w)?))?;
    }
    let lines = folded_lines(data, filter, args.value);
    if let Some(o) = outs.take("folded stacks") {
        write_output(o, |w| {
            for l in &lines {
                writeln!(w, "{l}")?;
            }
            Ok(())
        })?;
    }
    if let Some(o) = outs.take("flame graph") {
        let t = title(data, filter, args.value.description());
        let sub = format!(
            "{} (--value {}); `heapprofd-rs convert --help` lists the others",
            args.value.description(),
            clap::ValueEnum::to_possible_value(&args.value)
                .map(|v| v.get_name().to_owned())
                .unwrap_or_default()
        );
        write_output(o, |w| write_flamegraph(&lines, args.value, &t, &sub, w))?;
    }
    if let Some(o) = outs.take("HTML report") {
        write_output(o, |w| write_html(data, filter, &args.trace, w))?;
    }
    if let Some(o) = outs.take("timeline plot") {
        let t = title(data, filter, "unreleased memory over time");
        write_output(o, |w| Ok(write_timeline_svg(data, filter, &t, w)?))?;
    }
    if let Some(o) = outs.take("timeline PNG") {
        write_output(o, |w| Ok(write_timeline_png(data, filter, w)?))?;
    }
    Ok(())
}

fn convert_diff(
    args: &ConvertArgs,
    outs: &mut Outputs,
    base: &TraceData,
    new: &TraceData,
) -> anyhow::Result<()> {
    let base = args.stacks.apply(base, args.depth);
    let heap = args.heap.as_deref();
    if let Some(o) = outs.take("pprof profile") {
        let profile = to_pprof_diff(&base, new, heap);
        write_output(o, |w| Ok(write_pprof_gz(&profile, w)?))?;
    }
    let lines = diff_folded(&base, new, heap, args.value);
    if let Some(o) = outs.take("folded stacks") {
        write_output(o, |w| {
            for l in &lines {
                writeln!(w, "{l}")?;
            }
            Ok(())
        })?;
    }
    if let Some(o) = outs.take("flame graph") {
        let all = Filter::default();
        let t = title(
            new,
            &all,
            &format!("change in {}", args.value.description()),
        );
        let sub = format!(
            "widths: {}; red grew, blue shrank since {}",
            args.trace.display(),
            args.diff.as_deref().unwrap_or(Path::new("")).display()
        );
        write_output(o, |w| write_flamegraph(&lines, args.value, &t, &sub, w))?;
    }
    Ok(())
}
