//! Folded stacks (`main;foo;malloc 4096`, Brendan Gregg's format) and
//! flame graph SVGs drawn from them with inferno, including differential
//! ones (`stack base new` lines: widths are NEW's, red grew, blue shrank).

use std::io::Write;

use heapprofd_model::trace::{CallstackValues, TraceData};

use crate::filter::Filter;

/// The value a folded stack or flame graph shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ValueKind {
    /// Bytes allocated (cumulative).
    AllocSpace,
    /// Allocations (cumulative; samples when sampled).
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

    /// Whether the value is bytes (else a count).
    pub fn is_bytes(self) -> bool {
        matches!(self, ValueKind::AllocSpace | ValueKind::UnreleasedSpace)
    }
}

/// A frame name as a folded-stack frame (no `;`, no line breaks).
pub fn clean(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}

/// The value `kind` of a callstack.
pub fn value_of(c: &CallstackValues, kind: ValueKind) -> u64 {
    match kind {
        ValueKind::AllocSpace => c.self_allocated,
        ValueKind::AllocObjects => c.alloc_count,
        ValueKind::UnreleasedSpace => c.unreleased(),
        ValueKind::UnreleasedObjects => c.unreleased_count(),
    }
}

/// The short name of a process: its program's file name.
pub fn program_name(data: &TraceData, pid: u32) -> Option<String> {
    let cmd = data.processes.get(&pid)?.cmdline.first()?;
    Some(cmd.rsplit('/').next().unwrap_or(cmd).to_owned())
}

/// Folded lines, one per distinct stack with a non-zero value, outermost
/// caller first. When several processes or heaps are selected, each stack
/// starts with a `pid N (cmd)` and a `heap NAME` frame.
pub fn folded_lines(data: &TraceData, filter: &Filter, kind: ValueKind) -> Vec<String> {
    let heaps: Vec<_> = data.heaps.iter().filter(|h| filter.matches(h)).collect();
    let prefix = heaps.len() > 1;
    let mut lines = Vec::new();
    for h in heaps {
        let head = if prefix {
            let cmd = program_name(data, h.pid)
                .map(|c| format!(" ({c})"))
                .unwrap_or_default();
            Some(format!(
                "{};{}",
                clean(&format!("pid {}{cmd}", h.pid)),
                clean(&format!("heap {}", h.heap_name))
            ))
        } else {
            None
        };
        for c in &h.callstacks {
            let v = value_of(c, kind);
            if v == 0 {
                continue;
            }
            let mut parts: Vec<String> = head.iter().cloned().collect();
            parts.extend(c.frames.iter().map(|f| clean(&f.display_name())));
            if parts.is_empty() {
                parts.push("[no frames]".to_owned());
            }
            lines.push(format!("{} {v}", parts.join(";")));
        }
    }
    lines.sort();
    lines
}

/// The title of a flame graph: the programs and the value drawn.
pub fn title(data: &TraceData, filter: &Filter, what: &str) -> String {
    let mut names: Vec<String> = Vec::new();
    for h in data.heaps.iter().filter(|h| filter.matches(h)) {
        let n = program_name(data, h.pid).unwrap_or_else(|| format!("pid {}", h.pid));
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let who = match names.len() {
        0 => "heap profile".to_owned(),
        1..=3 => names.join(", "),
        n => format!("{}, {} and {} more", names[0], names[1], n - 2),
    };
    format!("{who}: {what}")
}

/// Draws a flame graph SVG of folded `lines` (with two values per line, a
/// differential one).
pub fn write_flamegraph(
    lines: &[String],
    kind: ValueKind,
    title: &str,
    subtitle: &str,
    out: impl Write,
) -> anyhow::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_owned();
    opts.count_name = if kind.is_bytes() {
        "bytes".to_owned()
    } else {
        "allocations".to_owned()
    };
    opts.subtitle = Some(subtitle.to_owned());
    opts.colors =
        inferno::flamegraph::Palette::Basic(inferno::flamegraph::color::BasicPalette::Mem);
    if lines.is_empty() {
        // inferno refuses empty input; draw one explanatory frame instead.
        let placeholder = ["no samples with a non-zero value 1".to_owned()];
        inferno::flamegraph::from_lines(&mut opts, placeholder.iter().map(String::as_str), out)?;
        return Ok(());
    }
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out)?;
    Ok(())
}
