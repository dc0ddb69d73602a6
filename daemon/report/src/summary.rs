//! `heapprofd-rs report`: per process and heap, totals and the top
//! allocation sites by self bytes, inclusive bytes and unreleased bytes.
//!
//! A "site" is a function (the frame's display name and location); self
//! values count the stacks whose allocating frame it is, inclusive values
//! every stack it appears in (once per stack, even when recursive).
//!
//! The allocating frame is the innermost frame that is not allocator
//! plumbing: `operator new`, the C++ standard library's allocators and
//! containers, Rust's `alloc` crate (see [`is_allocator_frame`]). Like
//! heaptrack, a `std::vector` growth is charged to the code that grew the
//! vector, not to `operator new`; the frames skipped are kept in the stack
//! and named in the site's `via`.

use std::collections::HashSet;
use std::io::{self, Write};

use rustc_hash::FxHashMap;
use serde::Serialize;

use heapprofd_model::trace::{CallstackValues, HeapProfile, ResolvedFrame, TraceData};

use crate::filter::Filter;
use crate::units::human_bytes;

/// Summed values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Sampled bytes allocated.
    pub allocated: u64,
    /// Sampled bytes freed.
    pub freed: u64,
    /// Bytes allocated and not freed.
    pub unreleased: u64,
    /// Allocations.
    pub alloc_count: u64,
    /// Frees.
    pub free_count: u64,
    /// Allocations not freed.
    pub unreleased_count: u64,
}

impl Totals {
    fn add(&mut self, c: &CallstackValues) {
        self.allocated += c.self_allocated;
        self.freed += c.self_freed;
        self.unreleased += c.unreleased();
        self.alloc_count += c.alloc_count;
        self.free_count += c.free_count;
        self.unreleased_count += c.unreleased_count();
    }
}

/// One function among the top sites.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Site {
    /// Function name (or `module+0xpc`).
    pub function: String,
    /// `file:line` of the first stack seen, if known.
    pub location: Option<String>,
    /// Module path.
    pub module: Option<String>,
    /// Values.
    #[serde(flatten)]
    pub totals: Totals,
    /// The callers of this site in the heaviest stack through it, outermost
    /// first, ending with the site itself.
    pub heaviest_stack: Vec<String>,
    /// For self sites: the allocator frame the site allocated through (the
    /// stack's innermost frame), when it is not the site itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// Whether a frame is allocator plumbing rather than the code that decided
/// to allocate: `operator new`/`delete`, C++ standard library code
/// (`std::`, `__gnu_cxx::`), Rust's `alloc` crate and allocator shims.
pub fn is_allocator_frame(f: &ResolvedFrame) -> bool {
    let Some(name) = f.function.as_deref() else {
        return false;
    };
    const PREFIXES: [&str; 10] = [
        "operator new",
        "operator delete",
        "std::",
        "__gnu_cxx::",
        "alloc::",
        "<alloc::",
        "__rust_alloc",
        "__rust_realloc",
        "__rdl_",
        "__rg_",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Index of the frame a stack's allocation is charged to (see the module
/// docs); the leaf when every frame is allocator plumbing.
pub fn allocating_frame(frames: &[ResolvedFrame]) -> Option<usize> {
    let leaf = frames.len().checked_sub(1)?;
    Some(
        (0..=leaf)
            .rev()
            .find(|&i| !is_allocator_frame(&frames[i]))
            .unwrap_or(leaf),
    )
}

/// Summary of one heap of one process.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeapReport {
    /// Process id.
    pub pid: u32,
    /// Command line, if the trace names the process.
    pub cmdline: Vec<String>,
    /// Heap name.
    pub heap: String,
    /// Sampling interval in bytes (1 = every allocation).
    pub sampling_interval_bytes: u64,
    /// Dumps of this heap.
    pub dumps: u64,
    /// Values are the state at the peak (dump_at_max trace).
    pub dump_at_max: bool,
    /// Length of the profiled window in nanoseconds, if known.
    pub duration_ns: Option<u64>,
    /// Problems flagged in the trace.
    pub flags: Vec<String>,
    /// Samples unwound.
    pub samples: Option<u64>,
    /// Unwinding errors.
    pub unwinding_errors: Option<u64>,
    /// Mean unwinding time in microseconds.
    pub mean_unwind_us: Option<f64>,
    /// Totals over every stack.
    pub totals: Totals,
    /// Distinct stacks.
    pub stacks: usize,
    /// Top sites by self allocated bytes.
    pub top_self: Vec<Site>,
    /// Top sites by inclusive allocated bytes.
    pub top_inclusive: Vec<Site>,
    /// Top sites by self unreleased bytes.
    pub top_unreleased: Vec<Site>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The trace file.
    pub trace: String,
    /// One entry per process and heap.
    pub heaps: Vec<HeapReport>,
    /// Non-fatal problems found while reading the trace.
    pub warnings: Vec<String>,
}

fn site_key(f: &ResolvedFrame) -> (String, Option<String>) {
    (f.display_name(), f.mapping.clone())
}

fn location(f: &ResolvedFrame) -> Option<String> {
    let file = f.source_file.as_deref()?;
    Some(match f.line {
        Some(l) => format!("{file}:{l}"),
        None => file.to_owned(),
    })
}

struct SiteAcc {
    first: ResolvedFrame,
    totals: Totals,
    heaviest: (u64, usize),
}

fn top_sites(
    h: &HeapProfile,
    top: usize,
    inclusive: bool,
    rank: impl Fn(&Totals) -> u64,
) -> Vec<Site> {
    let mut acc: FxHashMap<(String, Option<String>), SiteAcc> = FxHashMap::default();
    for (i, c) in h.callstacks.iter().enumerate() {
        let frames: Vec<&ResolvedFrame> = if inclusive {
            let mut seen = HashSet::new();
            c.frames
                .iter()
                .filter(|f| seen.insert(site_key(f)))
                .collect()
        } else {
            allocating_frame(&c.frames)
                .map(|i| &c.frames[i])
                .into_iter()
                .collect()
        };
        let mut one = Totals::default();
        one.add(c);
        let weight = rank(&one);
        for f in frames {
            let a = acc.entry(site_key(f)).or_insert_with(|| SiteAcc {
                first: f.clone(),
                totals: Totals::default(),
                heaviest: (0, i),
            });
            a.totals.add(c);
            if weight > a.heaviest.0 {
                a.heaviest = (weight, i);
            }
        }
    }
    let mut sites: Vec<Site> = acc
        .into_values()
        .filter(|a| rank(&a.totals) > 0)
        .map(|a| Site {
            function: a.first.display_name(),
            location: location(&a.first),
            module: a.first.mapping.clone(),
            totals: a.totals,
            heaviest_stack: {
                // The heaviest stack through the site, cut after the site
                // (its callers, then itself).
                let frames = &h.callstacks[a.heaviest.1].frames;
                let key = site_key(&a.first);
                let end = frames
                    .iter()
                    .position(|f| site_key(f) == key)
                    .map_or(frames.len(), |i| i + 1);
                frames[..end]
                    .iter()
                    .map(ResolvedFrame::display_name)
                    .collect()
            },
            via: (!inclusive)
                .then(|| h.callstacks[a.heaviest.1].frames.last())
                .flatten()
                .filter(|leaf| site_key(leaf) != site_key(&a.first))
                .map(ResolvedFrame::display_name),
        })
        .collect();
    sites.sort_by(|a, b| {
        rank(&b.totals)
            .cmp(&rank(&a.totals))
            .then_with(|| a.function.cmp(&b.function))
    });
    sites.truncate(top);
    sites
}

/// Builds the report of the heaps `filter` selects.
pub fn build_report(trace: &str, data: &TraceData, filter: &Filter, top: usize) -> Report {
    let heaps = data
        .heaps
        .iter()
        .filter(|h| filter.matches(h))
        .map(|h| {
            let mut totals = Totals::default();
            for c in &h.callstacks {
                totals.add(c);
            }
            let f = &h.flags;
            let mut flags = Vec::new();
            for (set, name) in [
                (f.disconnected, "client disconnected early"),
                (f.buffer_overran, "ring buffer overran: samples were lost"),
                (f.buffer_corrupted, "ring buffer corrupted"),
                (f.hit_guardrail, "stopped at a resource guardrail"),
                (
                    f.rejected_concurrent,
                    "rejected: another session was profiling",
                ),
            ] {
                if set {
                    flags.push(name.to_owned());
                }
            }
            if f.client_error != Default::default() {
                flags.push(format!("client error: {:?}", f.client_error));
            }
            let stats = h.stats.as_ref();
            HeapReport {
                pid: h.pid,
                cmdline: data
                    .processes
                    .get(&h.pid)
                    .map(|p| p.cmdline.clone())
                    .unwrap_or_default(),
                heap: h.heap_name.clone(),
                sampling_interval_bytes: h.sampling_interval_bytes,
                dumps: h.dumps,
                dump_at_max: h.dump_at_max,
                duration_ns: match (h.start_timestamp, h.timestamp) {
                    (Some(s), Some(e)) if e >= s => Some(e - s),
                    _ => None,
                },
                flags,
                samples: stats.map(|s| s.heap_samples),
                unwinding_errors: stats.map(|s| s.unwinding_errors),
                mean_unwind_us: stats
                    .filter(|s| s.heap_samples > 0)
                    .map(|s| s.total_unwinding_time_us as f64 / s.heap_samples as f64),
                totals,
                stacks: h.callstacks.len(),
                top_self: top_sites(h, top, false, |t| t.allocated),
                top_inclusive: top_sites(h, top, true, |t| t.allocated),
                top_unreleased: top_sites(h, top, false, |t| t.unreleased),
            }
        })
        .collect();
    Report {
        trace: trace.to_owned(),
        heaps,
        warnings: data.warnings.clone(),
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

fn write_sites(
    out: &mut impl Write,
    title: &str,
    sites: &[Site],
    whole: u64,
    value: impl Fn(&Totals) -> (u64, u64),
) -> io::Result<()> {
    writeln!(out, "\n  {title}")?;
    if sites.is_empty() {
        writeln!(out, "    (none)")?;
    }
    for s in sites {
        let (bytes, count) = value(&s.totals);
        write!(
            out,
            "    {:>11} {:5.1}% in {:>8} allocations  {}",
            human_bytes(bytes),
            percent(bytes, whole),
            count,
            s.function
        )?;
        if let Some(l) = &s.location {
            write!(out, " ({l})")?;
        }
        if let Some(v) = &s.via {
            write!(out, " via {v}")?;
        }
        writeln!(out)?;
        if let Some(m) = &s.module {
            writeln!(out, "          in {m}")?;
        }
        let callers: Vec<&str> = s
            .heaviest_stack
            .iter()
            .rev()
            .skip(1)
            .take(6)
            .map(String::as_str)
            .collect();
        if !callers.is_empty() {
            let more = if s.heaviest_stack.len() > 7 {
                " <- …"
            } else {
                ""
            };
            writeln!(out, "          from {}{more}", callers.join(" <- "))?;
        }
    }
    Ok(())
}

/// Writes the report as text, heaptrack_print style.
pub fn write_text(r: &Report, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "heap profile: {}", r.trace)?;
    if r.heaps.is_empty() {
        writeln!(
            out,
            "\nno heap dumps (nothing was sampled, or the filter matched nothing)"
        )?;
    }
    for h in &r.heaps {
        let cmd = if h.cmdline.is_empty() {
            String::new()
        } else {
            format!(" `{}`", h.cmdline.join(" "))
        };
        writeln!(out, "\nPROCESS {}{cmd}, HEAP {}", h.pid, h.heap)?;
        let interval = match h.sampling_interval_bytes {
            0 => "unknown".to_owned(),
            1 => "every allocation".to_owned(),
            n => format!("1 sample per {} on average", human_bytes(n)),
        };
        write!(out, "  sampling: {interval}; {} dump(s)", h.dumps)?;
        if let Some(d) = h.duration_ns {
            write!(out, " over {:.3} s", d as f64 / 1e9)?;
        }
        writeln!(out)?;
        if h.dump_at_max {
            writeln!(out, "  values are the live heap at its peak (dump-at-max)")?;
        }
        if let (Some(n @ 1..), Some(e)) = (h.samples, h.unwinding_errors) {
            write!(
                out,
                "  unwinding: {n} samples, {e} errors ({:.1}%)",
                percent(e, n)
            )?;
            if let Some(us) = h.mean_unwind_us {
                write!(out, ", mean {us:.0} us")?;
            }
            writeln!(out)?;
        }
        for f in &h.flags {
            writeln!(out, "  WARNING: {f}")?;
        }
        let t = &h.totals;
        writeln!(
            out,
            "  allocated: {} in {} allocations ({} stacks)",
            human_bytes(t.allocated),
            t.alloc_count,
            h.stacks
        )?;
        writeln!(
            out,
            "  freed:     {} in {} frees",
            human_bytes(t.freed),
            t.free_count
        )?;
        writeln!(
            out,
            "  unreleased: {} in {} allocations",
            human_bytes(t.unreleased),
            t.unreleased_count
        )?;
        write_sites(
            out,
            "TOP ALLOCATION SITES (self, allocated bytes)",
            &h.top_self,
            t.allocated,
            |s| (s.allocated, s.alloc_count),
        )?;
        write_sites(
            out,
            "TOP FUNCTIONS (inclusive, allocated bytes)",
            &h.top_inclusive,
            t.allocated,
            |s| (s.allocated, s.alloc_count),
        )?;
        write_sites(
            out,
            "TOP UNRELEASED (self, bytes not freed)",
            &h.top_unreleased,
            t.unreleased,
            |s| (s.unreleased, s.unreleased_count),
        )?;
    }
    for w in &r.warnings {
        writeln!(out, "\nwarning: {w}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str) -> ResolvedFrame {
        ResolvedFrame {
            function: Some(name.to_owned()),
            ..ResolvedFrame::default()
        }
    }

    #[test]
    fn allocations_are_charged_past_allocator_plumbing() {
        let cxx = [
            frame("main"),
            frame("grow_cache"),
            frame("std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>"),
            frame("std::__new_allocator<int>::allocate(unsigned long, void const*)"),
            frame("operator new(unsigned long)"),
        ];
        assert_eq!(allocating_frame(&cxx), Some(1));
        let rust = [
            frame("app::load"),
            frame("alloc::raw_vec::RawVec<T,A>::grow_one"),
            frame("__rust_alloc"),
        ];
        assert_eq!(allocating_frame(&rust), Some(0));
        // A plain C caller of malloc is its own site.
        assert_eq!(allocating_frame(&[frame("main"), frame("leak")]), Some(1));
        // Nothing but plumbing (or no names): the leaf.
        assert_eq!(
            allocating_frame(&[frame("operator new(unsigned long)")]),
            Some(0)
        );
        assert_eq!(allocating_frame(&[ResolvedFrame::default()]), Some(0));
        assert_eq!(allocating_frame(&[]), None);
    }
}
