//! Comparing two traces: `report --diff BASE NEW` (growth per self site
//! and per function, sorted by growth) and `convert --diff` (folded stacks
//! with both values, a differential flame graph, a pprof profile of the
//! growth).
//!
//! Two runs have different pids and addresses, so the traces are matched
//! by name: every selected heap of a trace (all processes, `--heap` picks
//! heaps by name) is summed, and frames are matched by function name and
//! module file name (`/old/build/app` and `/new/build/app` are the same
//! module), never by address. Unsymbolized frames (`app+0x1234`) only
//! match when the builds are identical. Counts are allocations: estimated
//! from the samples when the trace is sampled, exact at interval 1.

use std::collections::BTreeMap;
use std::io::{self, Write};

use rustc_hash::FxHashMap;
use serde::Serialize;

use heapprofd_model::trace::{CallstackValues, Frame, HeapProfile, ResolvedFrame, TraceData};

use crate::folded::{ValueKind, clean, value_of};
use crate::plumbing::{allocating_frame, is_entry_frame};
use crate::sites::location;
use crate::units::{human_bytes, human_count, human_count_delta, human_delta};

/// A frame's identity across traces: function and module file name.
pub type FrameKey = (String, Option<String>);

/// The identity of `f` (see the module docs).
pub fn frame_key(f: &ResolvedFrame) -> FrameKey {
    let module = f
        .mapping
        .as_deref()
        .and_then(|m| m.rsplit('/').find(|c| !c.is_empty()))
        .map(str::to_owned);
    (f.display_name(), module)
}

/// Values of one side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Side {
    /// Sampled bytes allocated.
    pub allocated: u64,
    /// Bytes not freed.
    pub unreleased: u64,
    /// Allocations (estimated when sampled).
    pub allocations: f64,
    /// Samples not freed.
    pub unreleased_count: u64,
}

impl Side {
    fn add(&mut self, c: &CallstackValues) {
        self.allocated += c.self_allocated;
        self.unreleased += c.unreleased();
        self.allocations += c
            .stats
            .as_ref()
            .map_or(c.alloc_count as f64, |s| s.estimated_allocs);
        self.unreleased_count += c.unreleased_count();
    }
}

/// One function in both traces.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffRow {
    /// Function name.
    pub function: String,
    /// Module file name.
    pub module: Option<String>,
    /// `file:line`, from whichever trace has the function.
    pub location: Option<String>,
    /// In BASE.
    pub base: Side,
    /// In NEW.
    pub new: Side,
    /// NEW - BASE allocated bytes.
    pub delta_allocated: i64,
    /// NEW - BASE unreleased bytes.
    pub delta_unreleased: i64,
    /// NEW - BASE allocations.
    pub delta_allocations: f64,
}

/// The comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffReport {
    /// BASE trace.
    pub base: String,
    /// NEW trace.
    pub new: String,
    /// Sampling intervals of BASE and NEW (bytes; 1 = every allocation).
    pub intervals: (u64, u64),
    /// Everything.
    pub total: DiffRow,
    /// Self sites by allocated-bytes growth, largest first.
    pub grew: Vec<DiffRow>,
    /// Self sites that shrank most.
    pub shrank: Vec<DiffRow>,
    /// Functions (inclusive) by allocated-bytes growth.
    pub grew_inclusive: Vec<DiffRow>,
    /// Self sites by unreleased-bytes growth.
    pub grew_unreleased: Vec<DiffRow>,
}

fn selected<'a>(
    data: &'a TraceData,
    heap: Option<&'a str>,
) -> impl Iterator<Item = &'a HeapProfile> {
    data.heaps
        .iter()
        .filter(move |h| heap.is_none_or(|n| n == h.heap_name))
}

#[derive(Default)]
struct Acc {
    base: Side,
    new: Side,
    location: Option<String>,
}

fn accumulate(
    rows: &mut FxHashMap<FrameKey, Acc>,
    data: &TraceData,
    heap: Option<&str>,
    inclusive: bool,
    is_new: bool,
) {
    for h in selected(data, heap) {
        for c in &h.callstacks {
            let frames: Vec<&Frame> = if inclusive {
                let mut seen = std::collections::HashSet::new();
                c.frames
                    .iter()
                    .filter(|f| !is_entry_frame(f) && seen.insert(frame_key(f)))
                    .collect()
            } else {
                allocating_frame(&c.frames)
                    .map(|i| &c.frames[i])
                    .into_iter()
                    .collect()
            };
            for f in frames {
                let a = rows.entry(frame_key(f)).or_default();
                if a.location.is_none() {
                    a.location = location(f);
                }
                if is_new {
                    a.new.add(c);
                } else {
                    a.base.add(c);
                }
            }
        }
    }
}

fn row(key: FrameKey, a: Acc) -> DiffRow {
    let d = |n: u64, b: u64| {
        (i128::from(n) - i128::from(b)).clamp(i64::MIN.into(), i64::MAX.into()) as i64
    };
    DiffRow {
        function: key.0,
        module: key.1,
        location: a.location,
        delta_allocated: d(a.new.allocated, a.base.allocated),
        delta_unreleased: d(a.new.unreleased, a.base.unreleased),
        delta_allocations: a.new.allocations - a.base.allocations,
        base: a.base,
        new: a.new,
    }
}

fn rows(base: &TraceData, new: &TraceData, heap: Option<&str>, inclusive: bool) -> Vec<DiffRow> {
    let mut acc: FxHashMap<FrameKey, Acc> = FxHashMap::default();
    accumulate(&mut acc, base, heap, inclusive, false);
    accumulate(&mut acc, new, heap, inclusive, true);
    acc.into_iter().map(|(k, a)| row(k, a)).collect()
}

fn top_by(mut v: Vec<DiffRow>, top: usize, key: impl Fn(&DiffRow) -> i64) -> Vec<DiffRow> {
    v.retain(|r| key(r) > 0);
    v.sort_by(|a, b| {
        key(b)
            .cmp(&key(a))
            .then_with(|| a.function.cmp(&b.function))
    });
    v.truncate(top);
    v
}

/// Compares NEW with BASE (both as the stack options show them).
pub fn diff(
    base_name: &str,
    base: &TraceData,
    new_name: &str,
    new: &TraceData,
    heap: Option<&str>,
    top: usize,
) -> DiffReport {
    let interval = |d: &TraceData| {
        selected(d, heap)
            .map(|h| h.sampling_interval_bytes)
            .max()
            .unwrap_or(0)
    };
    let mut total = Acc::default();
    for h in selected(base, heap) {
        h.callstacks.iter().for_each(|c| total.base.add(c));
    }
    for h in selected(new, heap) {
        h.callstacks.iter().for_each(|c| total.new.add(c));
    }
    let self_rows = rows(base, new, heap, false);
    // As in `report`, the inclusive rows leave out entry frames and the
    // functions on every stack of both traces (`main` of a one-thread
    // program): their growth is the total's.
    let (all_base, all_new) = (total.base, total.new);
    let everywhere =
        |s: &Side, all: &Side| s.allocated == all.allocated && s.unreleased == all.unreleased;
    let mut inclusive = rows(base, new, heap, true);
    inclusive.retain(|r| !(everywhere(&r.base, &all_base) && everywhere(&r.new, &all_new)));
    DiffReport {
        base: base_name.to_owned(),
        new: new_name.to_owned(),
        intervals: (interval(base), interval(new)),
        total: row(("(all)".to_owned(), None), total),
        grew: top_by(self_rows.clone(), top, |r| r.delta_allocated),
        shrank: top_by(self_rows.clone(), top, |r| -r.delta_allocated),
        grew_inclusive: top_by(inclusive, top, |r| r.delta_allocated),
        grew_unreleased: top_by(self_rows, top, |r| r.delta_unreleased),
    }
}

fn write_rows(
    out: &mut impl Write,
    title: &str,
    rows: &[DiffRow],
    by_unreleased: bool,
) -> io::Result<()> {
    writeln!(out, "\n  {title}")?;
    if rows.is_empty() {
        writeln!(out, "    (none)")?;
    }
    for r in rows {
        let (d, b, n) = if by_unreleased {
            (r.delta_unreleased, r.base.unreleased, r.new.unreleased)
        } else {
            (r.delta_allocated, r.base.allocated, r.new.allocated)
        };
        write!(
            out,
            "    {:>12}  ({} -> {}, {} allocations)  {}",
            human_delta(d.into()),
            human_bytes(b),
            human_bytes(n),
            human_count_delta(r.delta_allocations.round() as i128),
            r.function
        )?;
        if let Some(l) = &r.location {
            write!(out, " ({l})")?;
        }
        if let Some(m) = &r.module {
            write!(out, " in {m}")?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// Writes the comparison as text.
pub fn write_diff(out: &mut impl Write, d: &DiffReport) -> io::Result<()> {
    writeln!(out, "heap profile diff: {} -> {}", d.base, d.new)?;
    if d.intervals.0 != d.intervals.1 {
        writeln!(
            out,
            "  note: the sampling intervals differ ({} and {} bytes); byte values are \
             comparable, sample counts are not",
            d.intervals.0, d.intervals.1
        )?;
    }
    let t = &d.total;
    writeln!(
        out,
        "  allocated:  {} -> {} ({}), allocations {} -> {} ({})",
        human_bytes(t.base.allocated),
        human_bytes(t.new.allocated),
        human_delta(t.delta_allocated.into()),
        human_count(t.base.allocations.round() as u64),
        human_count(t.new.allocations.round() as u64),
        human_count_delta(t.delta_allocations.round() as i128),
    )?;
    writeln!(
        out,
        "  unreleased: {} -> {} ({})",
        human_bytes(t.base.unreleased),
        human_bytes(t.new.unreleased),
        human_delta(t.delta_unreleased.into()),
    )?;
    write_rows(out, "GREW MOST (self, allocated bytes)", &d.grew, false)?;
    write_rows(out, "SHRANK MOST (self, allocated bytes)", &d.shrank, false)?;
    write_rows(
        out,
        "GREW MOST (inclusive, allocated bytes)",
        &d.grew_inclusive,
        false,
    )?;
    write_rows(
        out,
        "UNRELEASED GREW MOST (self, bytes not freed)",
        &d.grew_unreleased,
        true,
    )?;
    Ok(())
}

/// Folded stacks of both traces: `stack base new` per stack (frames by
/// display name; the input of a differential flame graph).
pub fn diff_folded(
    base: &TraceData,
    new: &TraceData,
    heap: Option<&str>,
    kind: ValueKind,
) -> Vec<String> {
    let mut stacks: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (data, is_new) in [(base, false), (new, true)] {
        for h in selected(data, heap) {
            for c in &h.callstacks {
                let v = value_of(c, kind);
                if v == 0 {
                    continue;
                }
                let mut key: Vec<String> =
                    c.frames.iter().map(|f| clean(&f.display_name())).collect();
                if key.is_empty() {
                    key.push("[no frames]".to_owned());
                }
                let e = stacks.entry(key.join(";")).or_default();
                if is_new {
                    e.1 += v;
                } else {
                    e.0 += v;
                }
            }
        }
    }
    stacks
        .into_iter()
        .map(|(k, (b, n))| format!("{k} {b} {n}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One process of one build: `grow` allocated `grow` bytes and `keep`
    /// 1000, at addresses and in a build directory of its own.
    fn run(pid: u32, dir: &str, pc: u64, grow: u64) -> TraceData {
        let frame = |name: &str, pc: u64| {
            Frame::new(ResolvedFrame {
                function: Some(name.to_owned()),
                mapping: Some(format!("{dir}/app")),
                rel_pc: pc,
                ..Default::default()
            })
        };
        let stack = |site: &str, bytes: u64| CallstackValues {
            frames: vec![frame("main", pc), frame(site, pc + 0x40)],
            self_allocated: bytes,
            alloc_count: 1,
            ..Default::default()
        };
        TraceData {
            heaps: vec![HeapProfile {
                pid,
                heap_name: "libc.malloc".to_owned(),
                sampling_interval_bytes: 1,
                callstacks: vec![stack("grow", grow), stack("keep", 1000)],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn frames_match_by_function_and_module_across_builds() {
        // Different pids, build directories and addresses: still the same
        // functions of the same module.
        let base = run(10, "/old/build", 0x1000, 5000);
        let new = run(20, "/new/build", 0x2000, 7000);
        let d = diff("b", &base, "n", &new, None, 10);
        assert_eq!(d.grew.len(), 1, "{:?}", d.grew);
        let g = &d.grew[0];
        assert_eq!(
            (g.function.as_str(), g.module.as_deref()),
            ("grow", Some("app"))
        );
        assert_eq!(
            (g.base.allocated, g.new.allocated, g.delta_allocated),
            (5000, 7000, 2000)
        );
        assert!(d.shrank.is_empty(), "keep is unchanged: {:?}", d.shrank);
        assert_eq!(d.total.delta_allocated, 2000);
        // The folded stacks of the difference: one line per stack with
        // both values.
        let lines = diff_folded(&base, &new, None, ValueKind::AllocSpace);
        assert_eq!(lines, ["main;grow 5000 7000", "main;keep 1000 1000"]);
        // Another module of the same name is another function.
        let mut other = run(20, "/new/build", 0x2000, 7000);
        for c in &mut other.heaps[0].callstacks {
            for f in &mut c.frames {
                std::sync::Arc::make_mut(f).mapping = Some("/new/build/libother.so".to_owned());
            }
        }
        let d = diff("b", &base, "n", &other, None, 10);
        assert_eq!(d.grew[0].module.as_deref(), Some("libother.so"));
        assert_eq!(d.grew[0].base.allocated, 0);
    }
}
