//! `convert --html`: one self-contained page that works offline (no
//! network, no external file): per process and heap an interactive flame
//! graph (click to zoom, search; allocated or unreleased, bytes or
//! counts), the top tables, the size histogram and, for traces with
//! several dumps, the timeline of unreleased memory.
//!
//! The page is `assets/report.html` (markup, style, script) with the
//! trace's data inlined as JSON: per heap a frame table, the stacks as
//! frame ids with their four values, the top sites as `report --format
//! json` has them, the timeline and the memory counters.

use std::io::Write;
use std::path::Path;

use rustc_hash::FxHashMap;
use serde::Serialize;

use heapprofd_model::trace::{HeapProfile, ResolvedFrame, TraceData};

use crate::filter::Filter;
use crate::folded::{program_name, title};
use crate::sites::location;
use crate::summary::{HeapReport, ReportOptions, heap_report};
use crate::timeline::heap_timeline;

const PAGE: &str = include_str!("../assets/report.html");
const DATA_MARK: &str = "/*HEAPPROFD_DATA*/";

#[derive(Serialize)]
struct HeapData {
    pid: u32,
    program: String,
    cmdline: String,
    heap: String,
    exact: bool,
    interval: u64,
    /// [name, module file name, location]
    frames: Vec<(String, String, String)>,
    /// Stacks: frame ids outermost first and [allocated bytes,
    /// allocations, unreleased bytes, unreleased allocations].
    stacks: Vec<(Vec<u32>, [f64; 4])>,
    /// [seconds, unreleased bytes, allocated bytes] per dump.
    timeline: Vec<(f64, u64, u64)>,
    /// [seconds, resident bytes].
    rss: Vec<(f64, u64)>,
    report: HeapReport,
}

#[derive(Serialize)]
struct PageData {
    title: String,
    trace: String,
    heaps: Vec<HeapData>,
}

fn heap_data(data: &TraceData, h: &HeapProfile) -> HeapData {
    // A frame of the flame graph is a function of a module: calls from
    // different lines of one function merge (the location shown is the
    // line when there is one, else the file).
    let mut ids: FxHashMap<(String, String), u32> = FxHashMap::default();
    let mut frames: Vec<(String, String, String)> = Vec::new();
    let mut id_of = |f: &ResolvedFrame| {
        let module = f
            .mapping
            .as_deref()
            .and_then(|m| m.rsplit('/').next())
            .unwrap_or("")
            .to_owned();
        let key = (f.display_name(), module);
        let loc = location(f).unwrap_or_default();
        let id = *ids.entry(key.clone()).or_insert_with(|| {
            frames.push((key.0, key.1, loc.clone()));
            frames.len() as u32 - 1
        });
        let shown = &mut frames[id as usize].2;
        if *shown != loc {
            let file = |l: &str| l.rsplit_once(':').map_or(l, |(f, _)| f).to_owned();
            *shown = if file(shown) == file(&loc) {
                file(&loc)
            } else {
                String::new()
            };
        }
        id
    };
    let stacks = h
        .callstacks
        .iter()
        .filter(|c| c.self_allocated > 0 || c.alloc_count > 0)
        .map(|c| {
            let ids: Vec<u32> = c.frames.iter().map(|f| id_of(f)).collect();
            let allocations = c
                .stats
                .as_ref()
                .map_or(c.alloc_count as f64, |s| s.estimated_allocs);
            (
                ids,
                [
                    c.self_allocated as f64,
                    allocations,
                    c.unreleased() as f64,
                    c.unreleased_count() as f64,
                ],
            )
        })
        .collect();
    let t0 = h.timeline.first().map_or(0, |p| p.start.min(p.timestamp));
    let secs = |t: u64| t.saturating_sub(t0) as f64 / 1e9;
    let process = data.processes.get(&h.pid);
    let opts = ReportOptions {
        top: 20,
        short_lived: 1023,
    };
    HeapData {
        pid: h.pid,
        program: program_name(data, h.pid).unwrap_or_else(|| format!("pid {}", h.pid)),
        cmdline: process.map(|p| p.cmdline.join(" ")).unwrap_or_default(),
        heap: h.heap_name.clone(),
        exact: h.exact,
        interval: h.sampling_interval_bytes,
        frames,
        stacks,
        // The page plots the totals only, no grown sites.
        timeline: heap_timeline(data, h, 0)
            .rows
            .iter()
            .map(|r| (r.seconds, r.unreleased, r.allocated))
            .collect(),
        rss: process
            .map(|p| {
                p.memory
                    .iter()
                    .map(|m| (secs(m.timestamp), m.rss_kb * 1024))
                    .collect()
            })
            .unwrap_or_default(),
        report: heap_report(data, h, &opts, None),
    }
}

/// The page's JSON, safe inside a `<script>` element.
fn script_json(v: &impl Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string(v)?
        .replace("</", "<\\/")
        .replace("<!--", "<\\!--"))
}

/// Writes the page of the heaps `filter` selects.
pub fn write_html(
    data: &TraceData,
    filter: &Filter,
    trace: &Path,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let page = PageData {
        title: title(data, filter, "heap profile"),
        trace: trace.file_name().map_or_else(
            || trace.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        heaps: data
            .heaps
            .iter()
            .filter(|h| filter.matches(h))
            .map(|h| heap_data(data, h))
            .collect(),
    };
    let json = script_json(&page)?;
    let (head, tail) = PAGE
        .split_once(DATA_MARK)
        .ok_or_else(|| anyhow::anyhow!("the HTML template has no data mark"))?;
    let html_title = page
        .title
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    out.write_all(head.replace("HEAPPROFD_TITLE", &html_title).as_bytes())?;
    out.write_all(json.as_bytes())?;
    out.write_all(tail.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_cannot_close_the_script() {
        let s = script_json(&"</script><!--").unwrap();
        assert!(!s.contains("</") && !s.contains("<!--"), "{s}");
        assert!(PAGE.contains(DATA_MARK));
    }
}
