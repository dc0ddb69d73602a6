//! Folded stacks (`main;foo;malloc 4096`, Brendan Gregg's format) and
//! flame graph SVGs drawn from them with inferno.

use std::io::Write;

use heapprofd_model::trace::{CallstackValues, TraceData};

use crate::filter::Filter;

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

fn clean(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}

fn value(c: &CallstackValues, kind: ValueKind) -> u64 {
    match kind {
        ValueKind::AllocSpace => c.self_allocated,
        ValueKind::AllocObjects => c.alloc_count,
        ValueKind::UnreleasedSpace => c.unreleased(),
        ValueKind::UnreleasedObjects => c.unreleased_count(),
    }
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
            let cmd = data
                .processes
                .get(&h.pid)
                .and_then(|p| p.cmdline.first())
                .map(|c| format!(" ({})", c.rsplit('/').next().unwrap_or(c)))
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
            let v = value(c, kind);
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

/// Draws a flame graph SVG of folded `lines`.
pub fn write_flamegraph(
    lines: &[String],
    kind: ValueKind,
    title: &str,
    out: impl Write,
) -> anyhow::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_owned();
    opts.count_name = match kind {
        ValueKind::AllocSpace | ValueKind::UnreleasedSpace => "bytes".to_owned(),
        ValueKind::AllocObjects | ValueKind::UnreleasedObjects => "allocations".to_owned(),
    };
    opts.subtitle = Some(kind.description().to_owned());
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
