//! Allocation sites and functions: the values of a heap summed per
//! function, by the frame each stack is charged to (*self*, past allocator
//! plumbing, see [`crate::plumbing`]) or by every function on the stack
//! (*inclusive*, once per stack even when recursive).
//!
//! A site is a function: its display name and its module. Values are the
//! trace's (sampled bytes; samples, which at interval 1 are allocations),
//! plus, when the trace has heapprofd-rs's statistics, the estimated
//! allocation count, the size histogram and, in exact mode, temporary and
//! short-lived allocations.

use std::collections::HashSet;

use rustc_hash::FxHashMap;
use serde::Serialize;

use heapprofd_model::profile::CallsiteStats;
use heapprofd_model::profile::estimate::log2_bucket_range;
use heapprofd_model::trace::{CallstackValues, Frame, HeapProfile, ResolvedFrame};

use crate::plumbing::{allocating_frame, is_entry_frame};

/// Summed values.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Sampled bytes allocated.
    pub allocated: u64,
    /// Sampled bytes freed.
    pub freed: u64,
    /// Bytes allocated and not freed.
    pub unreleased: u64,
    /// Samples (allocations at interval 1).
    pub alloc_count: u64,
    /// Frees of samples.
    pub free_count: u64,
    /// Samples not freed.
    pub unreleased_count: u64,
    /// Allocations the samples stand for (estimated; exact at interval 1),
    /// when the trace has heapprofd-rs's statistics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated_allocations: Option<f64>,
    /// Temporary allocations (exact mode): freed before their thread
    /// allocated again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temporary: Option<u64>,
    /// Allocations freed within `short_lived_within` allocations (exact mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_lived: Option<u64>,
}

impl Totals {
    /// Adds one callstack; `exact` says whether lifetimes were counted,
    /// `within` is the short-lived bound.
    pub fn add(&mut self, c: &CallstackValues, exact: bool, within: u64) {
        self.allocated += c.self_allocated;
        self.freed += c.self_freed;
        self.unreleased += c.unreleased();
        self.alloc_count += c.alloc_count;
        self.free_count += c.free_count;
        self.unreleased_count += c.unreleased_count();
        if let Some(s) = &c.stats {
            *self.estimated_allocations.get_or_insert(0.0) += s.estimated_allocs;
            if exact {
                *self.temporary.get_or_insert(0) += s.temporary;
                *self.short_lived.get_or_insert(0) += s.freed_within(within).0;
            }
        }
    }

    /// Allocations: the estimate when known, else the samples.
    pub fn allocations(&self) -> f64 {
        self.estimated_allocations
            .unwrap_or(self.alloc_count as f64)
    }
}

/// One bucket of a size histogram.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SizeRow {
    /// Smallest size of the bucket, bytes.
    pub low: u64,
    /// Largest size of the bucket, bytes.
    pub high: u64,
    /// Samples.
    pub samples: u64,
    /// Allocations they stand for.
    pub allocations: f64,
}

/// The size histogram of summed statistics.
pub fn size_rows(s: &CallsiteStats) -> Vec<SizeRow> {
    s.sizes
        .iter()
        .map(|b| {
            let (low, high) = log2_bucket_range(b.log2);
            SizeRow {
                low,
                high,
                samples: b.samples,
                allocations: b.estimated,
            }
        })
        .collect()
}

/// One function among the top sites.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
    /// Requested sizes (self sites of traces with statistics).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sizes: Vec<SizeRow>,
}

/// Which frames of a stack a table counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribution {
    /// The frame the allocation is charged to.
    SelfSite,
    /// Every function on the stack, once.
    Inclusive,
}

/// A site's key: display name and module.
pub fn site_key(f: &ResolvedFrame) -> (String, Option<String>) {
    (f.display_name(), f.mapping.clone())
}

/// `file:line` of a frame.
pub fn location(f: &ResolvedFrame) -> Option<String> {
    let file = f.source_file.as_deref()?;
    Some(match f.line {
        Some(l) => format!("{file}:{l}"),
        None => file.to_owned(),
    })
}

struct SiteAcc {
    first: Frame,
    totals: Totals,
    stats: CallsiteStats,
    heaviest: (u64, usize),
    stacks: usize,
}

/// What [`top_sites`] needs besides the heap.
#[derive(Clone, Copy)]
pub struct SiteQuery<'a> {
    /// Self or inclusive.
    pub attribution: Attribution,
    /// Sites to return.
    pub top: usize,
    /// Short-lived bound (allocations).
    pub within: u64,
    /// The value ranked by.
    pub rank: &'a dyn Fn(&Totals) -> u64,
}

impl std::fmt::Debug for SiteQuery<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SiteQuery")
            .field("attribution", &self.attribution)
            .field("top", &self.top)
            .finish_non_exhaustive()
    }
}

/// The top sites of `h` by `q.rank`, and for inclusive tables the
/// functions left out because they are entry frames or on every stack.
pub fn top_sites(h: &HeapProfile, q: &SiteQuery<'_>) -> (Vec<Site>, Vec<String>) {
    let inclusive = q.attribution == Attribution::Inclusive;
    let mut acc: FxHashMap<(String, Option<String>), SiteAcc> = FxHashMap::default();
    let mut ranked_stacks = 0;
    for (i, c) in h.callstacks.iter().enumerate() {
        let frames: Vec<&Frame> = if inclusive {
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
        one.add(c, h.exact, q.within);
        let weight = (q.rank)(&one);
        if weight > 0 {
            ranked_stacks += 1;
        }
        for f in frames {
            let a = acc.entry(site_key(f)).or_insert_with(|| SiteAcc {
                first: f.clone(),
                totals: Totals::default(),
                stats: CallsiteStats::default(),
                heaviest: (0, i),
                stacks: 0,
            });
            a.totals.add(c, h.exact, q.within);
            if let Some(s) = &c.stats {
                a.stats.merge(s);
            }
            if weight > 0 {
                a.stacks += 1;
            }
            if weight > a.heaviest.0 {
                a.heaviest = (weight, i);
            }
        }
    }
    let mut omitted = Vec::new();
    let mut sites: Vec<Site> = Vec::new();
    for a in acc.into_values() {
        if (q.rank)(&a.totals) == 0 {
            continue;
        }
        if inclusive
            && (is_entry_frame(&a.first) || (ranked_stacks > 1 && a.stacks == ranked_stacks))
        {
            omitted.push(a.first.display_name());
            continue;
        }
        sites.push(make_site(h, a, inclusive));
    }
    sites.sort_by(|a, b| {
        (q.rank)(&b.totals)
            .cmp(&(q.rank)(&a.totals))
            .then_with(|| a.function.cmp(&b.function))
    });
    sites.truncate(q.top);
    omitted.sort();
    (sites, omitted)
}

fn make_site(h: &HeapProfile, a: SiteAcc, inclusive: bool) -> Site {
    let frames = &h.callstacks[a.heaviest.1].frames;
    let key = site_key(&a.first);
    // The heaviest stack through the site, cut after the site (its
    // callers, then itself).
    let end = frames
        .iter()
        .position(|f| site_key(f) == key)
        .map_or(frames.len(), |i| i + 1);
    Site {
        function: a.first.display_name(),
        location: location(&a.first),
        module: a.first.mapping.clone(),
        heaviest_stack: frames[..end].iter().map(|f| f.display_name()).collect(),
        via: (!inclusive)
            .then(|| frames.last())
            .flatten()
            .filter(|leaf| site_key(leaf) != key)
            .map(|f| f.display_name()),
        sizes: if inclusive {
            Vec::new()
        } else {
            size_rows(&a.stats)
        },
        totals: a.totals,
    }
}
