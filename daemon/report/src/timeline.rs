//! A heap over time, from the dumps of a `--continuous-dump` trace:
//! `report --timeline` (per dump: unreleased bytes, allocation rate, the
//! site that grew most since the dump before), `report --peak` /
//! `convert --peak` (the values as of the dump with the most unreleased
//! memory), and the points of `convert --timeline-svg`.

use std::io::{self, Write};

use rustc_hash::FxHashMap;
use serde::Serialize;

use heapprofd_model::trace::{CallstackValues, Counters, HeapProfile, TraceData};

use crate::filter::Filter;
use crate::plumbing::allocating_frame;
use crate::summary::AsOf;
use crate::units::{human_bytes, human_count, human_delta};

/// One dump of a heap.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineRow {
    /// 1-based dump number.
    pub dump: usize,
    /// Seconds since the first dump's window started.
    pub seconds: f64,
    /// Unreleased bytes after the dump.
    pub unreleased: u64,
    /// Bytes allocated since the start.
    pub allocated: u64,
    /// Bytes allocated per second since the dump before.
    pub allocated_per_s: f64,
    /// Allocations (samples) per second since the dump before.
    pub allocations_per_s: f64,
    /// The self site whose unreleased bytes grew most since the dump
    /// before, and by how much.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grew_most: Option<(String, i128)>,
}

/// The timeline of one heap.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeapTimeline {
    /// Process id.
    pub pid: u32,
    /// Command line.
    pub cmdline: Vec<String>,
    /// Heap name.
    pub heap: String,
    /// The dumps.
    pub rows: Vec<TimelineRow>,
    /// 1-based number of the dump with the most unreleased bytes.
    pub peak_dump: Option<usize>,
}

/// Index of the dump with the most unreleased bytes (the first of equals).
pub fn peak_index(h: &HeapProfile) -> Option<usize> {
    let mut best: Option<(usize, u64)> = None;
    for (i, p) in h.timeline.iter().enumerate() {
        let u = p.totals.unreleased();
        if best.is_none_or(|(_, b)| u > b) {
            best = Some((i, u));
        }
    }
    best.map(|(i, _)| i)
}

fn site_name(c: &CallstackValues) -> String {
    allocating_frame(&c.frames)
        .map_or_else(|| "[no frames]".to_owned(), |i| c.frames[i].display_name())
}

/// The rows of one heap's timeline.
pub fn heap_timeline(data: &TraceData, h: &HeapProfile) -> HeapTimeline {
    let t0 = h.timeline.first().map_or(0, |p| p.start.min(p.timestamp));
    let mut latest: FxHashMap<u32, Counters> = FxHashMap::default();
    let mut prev: Option<(u64, Counters)> = None;
    let mut rows = Vec::new();
    for (i, p) in h.timeline.iter().enumerate() {
        let mut growth: FxHashMap<String, i128> = FxHashMap::default();
        for &(idx, c) in &p.changes {
            let old = latest.insert(idx, c).unwrap_or_default();
            let d = i128::from(c.unreleased()) - i128::from(old.unreleased());
            if let Some(cs) = h.callstacks.get(idx as usize) {
                *growth.entry(site_name(cs)).or_default() += d;
            }
        }
        let grew_most = growth
            .into_iter()
            .filter(|(_, d)| *d > 0)
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)));
        let (since, before) = prev.unwrap_or((p.start, Counters::default()));
        let secs = p.timestamp.saturating_sub(since) as f64 / 1e9;
        let rate = |now: u64, then: u64| {
            if secs > 0.0 {
                now.saturating_sub(then) as f64 / secs
            } else {
                0.0
            }
        };
        rows.push(TimelineRow {
            dump: i + 1,
            seconds: p.timestamp.saturating_sub(t0) as f64 / 1e9,
            unreleased: p.totals.unreleased(),
            allocated: p.totals.allocated,
            allocated_per_s: rate(p.totals.allocated, before.allocated),
            allocations_per_s: rate(p.totals.alloc_count, before.alloc_count),
            grew_most,
        });
        prev = Some((p.timestamp, p.totals));
    }
    HeapTimeline {
        pid: h.pid,
        cmdline: data
            .processes
            .get(&h.pid)
            .map(|p| p.cmdline.clone())
            .unwrap_or_default(),
        heap: h.heap_name.clone(),
        peak_dump: peak_index(h).map(|i| i + 1),
        rows,
    }
}

/// The timelines of the heaps `filter` selects.
pub fn timelines(data: &TraceData, filter: &Filter) -> Vec<HeapTimeline> {
    data.heaps
        .iter()
        .filter(|h| filter.matches(h))
        .map(|h| heap_timeline(data, h))
        .collect()
}

/// The heap with every callstack's values as of dump `k` (0-based), and
/// what that dump is. Statistics are the trace's latest, so they are left
/// out.
pub fn values_at(h: &HeapProfile, k: usize, why: &str) -> (HeapProfile, AsOf) {
    let mut values: Vec<Counters> = vec![Counters::default(); h.callstacks.len()];
    for p in h.timeline.iter().take(k + 1) {
        for &(i, c) in &p.changes {
            if let Some(v) = values.get_mut(i as usize) {
                *v = c;
            }
        }
    }
    let callstacks = h
        .callstacks
        .iter()
        .zip(values)
        .map(|(c, v)| CallstackValues {
            frames: c.frames.clone(),
            context: c.context.clone(),
            self_allocated: v.allocated,
            self_freed: v.freed,
            alloc_count: v.alloc_count,
            free_count: v.free_count,
            ..Default::default()
        })
        .collect();
    let t0 = h.timeline.first().map_or(0, |p| p.start.min(p.timestamp));
    let at = h.timeline.get(k).map_or(0, |p| p.timestamp);
    let as_of = AsOf {
        dump: k + 1,
        of: h.timeline.len(),
        seconds: at.saturating_sub(t0) as f64 / 1e9,
        why: why.to_owned(),
    };
    let mut out = HeapProfile {
        callstacks,
        exact: false,
        timeline: h.timeline[..(k + 1).min(h.timeline.len())].to_vec(),
        ..h.clone()
    };
    out.timestamp = Some(at);
    (out, as_of)
}

/// The trace with each selected heap's values as of its peak dump.
pub fn at_peak(data: &TraceData) -> (TraceData, Vec<Option<AsOf>>) {
    let mut as_of = Vec::new();
    let heaps = data
        .heaps
        .iter()
        .map(|h| match peak_index(h) {
            Some(k) if !h.dump_at_max => {
                let (v, a) = values_at(h, k, "peak of unreleased memory");
                as_of.push(Some(a));
                v
            }
            _ => {
                as_of.push(None);
                h.clone()
            }
        })
        .collect();
    (
        TraceData {
            heaps,
            ..data.clone()
        },
        as_of,
    )
}

/// Writes the timelines as text.
pub fn write_timelines(out: &mut impl Write, trace: &str, t: &[HeapTimeline]) -> io::Result<()> {
    writeln!(out, "heap timeline: {trace}")?;
    if t.is_empty() {
        writeln!(out, "\nno heap dumps")?;
    }
    for h in t {
        let cmd = if h.cmdline.is_empty() {
            String::new()
        } else {
            format!(" `{}`", h.cmdline.join(" "))
        };
        writeln!(
            out,
            "\nPROCESS {}{cmd}, HEAP {}: {} dump(s)",
            h.pid,
            h.heap,
            h.rows.len()
        )?;
        if h.rows.len() == 1 {
            writeln!(
                out,
                "  (one dump: record with --continuous-dump PERIOD for a timeline)"
            )?;
        }
        writeln!(
            out,
            "  {:>5} {:>9} {:>12} {:>14} {:>11}  grew most since the dump before",
            "dump", "time", "unreleased", "allocated/s", "allocs/s"
        )?;
        for r in &h.rows {
            let peak = if Some(r.dump) == h.peak_dump {
                "*"
            } else {
                " "
            };
            write!(
                out,
                " {peak}{:>5} {:>7.3} s {:>12} {:>12}/s {:>11}",
                r.dump,
                r.seconds,
                human_bytes(r.unreleased),
                human_bytes(r.allocated_per_s as u64),
                human_count(r.allocations_per_s.round() as u64),
            )?;
            if let Some((site, d)) = &r.grew_most {
                write!(out, "  {} {site}", human_delta(*d))?;
            }
            writeln!(out)?;
        }
        if let Some(p) = h.peak_dump {
            writeln!(
                out,
                "  * peak: dump {p} (`heapprofd-rs report --peak` reports it)"
            )?;
        }
    }
    Ok(())
}
