//! A heap over time, from the dumps of a `--continuous-dump` trace:
//! `report --timeline` (per dump: unreleased bytes, allocation rate, the
//! sites that grew most since the dump before), `report --peak` /
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

/// Sites listed per dump as having grown most, unless `--top` says.
pub const GREW_MOST_SITES: usize = 3;

/// A site whose unreleased bytes grew between two dumps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SiteGrowth {
    /// The self site (its allocating function).
    pub site: String,
    /// Growth of its unreleased bytes since the dump before.
    pub bytes: i128,
}

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
    /// (Kept for readers of older output: the first of `grew_most_sites`.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grew_most: Option<(String, i128)>,
    /// The self sites whose unreleased bytes grew since the dump before,
    /// most first (ties by name), at most `--top` of them.
    pub grew_most_sites: Vec<SiteGrowth>,
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

/// The sites of `growth` that grew, most first (ties by name), `top` of them.
fn grew_most(growth: FxHashMap<String, i128>, top: usize) -> Vec<SiteGrowth> {
    let mut grew: Vec<SiteGrowth> = growth
        .into_iter()
        .filter(|(_, d)| *d > 0)
        .map(|(site, bytes)| SiteGrowth { site, bytes })
        .collect();
    grew.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    grew.truncate(top);
    grew
}

/// The rows of one heap's timeline, with the `top` sites that grew most
/// between consecutive dumps.
pub fn heap_timeline(data: &TraceData, h: &HeapProfile, top: usize) -> HeapTimeline {
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
        let grew_most_sites = grew_most(growth, top);
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
            grew_most: grew_most_sites.first().map(|g| (g.site.clone(), g.bytes)),
            grew_most_sites,
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

/// The timelines of the heaps `filter` selects, `top` grown sites per dump.
pub fn timelines(data: &TraceData, filter: &Filter, top: usize) -> Vec<HeapTimeline> {
    data.heaps
        .iter()
        .filter(|h| filter.matches(h))
        .map(|h| heap_timeline(data, h, top))
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
            for (i, g) in r.grew_most_sites.iter().enumerate() {
                let sep = if i == 0 { "  " } else { ", " };
                write!(out, "{sep}{} {}", human_delta(g.bytes), g.site)?;
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

#[cfg(test)]
mod tests {
    use heapprofd_model::trace::{DumpPoint, ResolvedFrame};

    use super::*;

    fn site(name: &str) -> CallstackValues {
        CallstackValues {
            frames: vec![
                ResolvedFrame {
                    function: Some("main".into()),
                    ..Default::default()
                }
                .into(),
                ResolvedFrame {
                    function: Some(name.into()),
                    ..Default::default()
                }
                .into(),
            ],
            ..Default::default()
        }
    }

    fn kept(bytes: u64) -> Counters {
        Counters {
            allocated: bytes,
            alloc_count: 1,
            ..Default::default()
        }
    }

    /// Four sites; between dumps 1 and 2 three grow at different rates and
    /// one shrinks, between dumps 2 and 3 only one grows.
    fn heap() -> HeapProfile {
        let sites = ["fast", "slow", "medium", "shrinks"].map(site).to_vec();
        let point = |t: u64, changes: Vec<(u32, Counters)>| DumpPoint {
            start: 0,
            timestamp: t * 1_000_000_000,
            totals: Counters::default(),
            changes,
        };
        HeapProfile {
            pid: 7,
            heap_name: "libc.malloc".into(),
            callstacks: sites,
            timeline: vec![
                point(1, vec![(3, kept(5000))]),
                point(
                    2,
                    vec![
                        (0, kept(8000)),
                        (1, kept(1000)),
                        (2, kept(4000)),
                        (
                            3,
                            Counters {
                                freed: 5000,
                                ..kept(5000)
                            },
                        ),
                    ],
                ),
                point(3, vec![(1, kept(3000))]),
            ],
            ..Default::default()
        }
    }

    fn sites(r: &TimelineRow) -> Vec<(&str, i128)> {
        r.grew_most_sites
            .iter()
            .map(|g| (g.site.as_str(), g.bytes))
            .collect()
    }

    #[test]
    fn lists_the_sites_that_grew_most_between_dumps_in_order() {
        let t = heap_timeline(&TraceData::default(), &heap(), GREW_MOST_SITES);
        assert_eq!(sites(&t.rows[0]), [("shrinks", 5000)]);
        assert_eq!(
            sites(&t.rows[1]),
            [("fast", 8000), ("medium", 4000), ("slow", 1000)]
        );
        assert_eq!(sites(&t.rows[2]), [("slow", 2000)]);
        // The old field names the first of them.
        assert_eq!(t.rows[1].grew_most, Some(("fast".into(), 8000)));
        let two = heap_timeline(&TraceData::default(), &heap(), 2);
        assert_eq!(sites(&two.rows[1]), [("fast", 8000), ("medium", 4000)]);
    }

    #[test]
    fn text_and_json_show_the_list() {
        let t = heap_timeline(&TraceData::default(), &heap(), GREW_MOST_SITES);
        let mut text = Vec::new();
        write_timelines(&mut text, "t", std::slice::from_ref(&t)).unwrap();
        let text = String::from_utf8(text).unwrap();
        let row2 = text.lines().find(|l| l.contains("fast")).unwrap();
        let at = |s: &str| row2.find(s).unwrap_or_else(|| panic!("{s} in {row2}"));
        assert!(
            at("fast") < at("medium") && at("medium") < at("slow"),
            "{row2}"
        );
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["rows"][1]["grew_most"][0], "fast");
        assert_eq!(v["rows"][1]["grew_most_sites"][1]["site"], "medium");
        assert_eq!(v["rows"][1]["grew_most_sites"][1]["bytes"], 4000);
    }
}
