//! `heapprofd-rs report`'s content: per process and heap, totals and the
//! top sites by self bytes, inclusive bytes, unreleased bytes and (exact
//! mode) temporary allocations, with the size histogram; built from a
//! trace as [`Report`] (serialized as the JSON output; [`crate::text`]
//! writes the text).

use serde::Serialize;

use heapprofd_model::profile::CallsiteStats;
use heapprofd_model::trace::{HeapProfile, TraceData};

use crate::filter::Filter;
use crate::sites::{Attribution, Site, SiteQuery, SizeRow, Totals, size_rows, top_sites};

/// Which values a report is of, when not the trace's latest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AsOf {
    /// 1-based number of the dump among the heap's dumps.
    pub dump: usize,
    /// Dumps of the heap.
    pub of: usize,
    /// Seconds since the heap's first dump window started.
    pub seconds: f64,
    /// Why this dump (`peak`: the most unreleased memory).
    pub why: String,
}

/// Summary of one heap of one process.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeapReport {
    /// Process id.
    pub pid: u32,
    /// Command line, if the trace names the process.
    pub cmdline: Vec<String>,
    /// Parent process id, if the trace names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ppid: Option<u32>,
    /// Heap name.
    pub heap: String,
    /// Sampling interval in bytes (1 = every allocation); the largest one
    /// a sample was drawn at when the client raised it under load.
    pub sampling_interval_bytes: u64,
    /// The interval asked for, when the client raised it under load.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raised_from_bytes: Option<u64>,
    /// Every allocation recorded, lifetimes counted.
    pub exact: bool,
    /// Dumps of this heap.
    pub dumps: u64,
    /// Values are the state at the peak (dump_at_max trace).
    pub dump_at_max: bool,
    /// Values as of one dump (`--peak`) rather than the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of: Option<AsOf>,
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
    /// Short-lived means freed within this many allocations (exact mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_lived_within: Option<u64>,
    /// Requested sizes over the heap.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sizes: Vec<SizeRow>,
    /// Top sites by self allocated bytes.
    pub top_self: Vec<Site>,
    /// Top functions by inclusive allocated bytes.
    pub top_inclusive: Vec<Site>,
    /// Functions the inclusive table leaves out (entry frames, functions on
    /// every stack).
    pub inclusive_omitted: Vec<String>,
    /// Top sites by self unreleased bytes.
    pub top_unreleased: Vec<Site>,
    /// Top sites by temporary allocations (exact mode).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_temporary: Vec<Site>,
}

/// Where a trace was cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Truncated {
    /// Byte offset where the incomplete part starts.
    pub offset: u64,
    /// Bytes in the file.
    pub file_len: u64,
    /// What is incomplete.
    pub what: String,
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
    /// The trace was cut short: what is above is what could be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<Truncated>,
}

/// What a report shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportOptions {
    /// Sites per table.
    pub top: usize,
    /// Short-lived bound in allocations.
    pub short_lived: u64,
}

fn flags_of(h: &HeapProfile) -> Vec<String> {
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
    flags
}

/// The report of one heap (`as_of` when the values are one dump's).
pub fn heap_report(
    data: &TraceData,
    h: &HeapProfile,
    o: &ReportOptions,
    as_of: Option<AsOf>,
) -> HeapReport {
    let within = o.short_lived;
    let mut totals = Totals::default();
    let mut stats = CallsiteStats::default();
    for c in &h.callstacks {
        totals.add(c, h.exact, within);
        if let Some(s) = &c.stats {
            stats.merge(s);
        }
    }
    let stats_of = h.stats.as_ref();
    let query = |attribution, rank: &dyn Fn(&Totals) -> u64| {
        top_sites(
            h,
            &SiteQuery {
                attribution,
                top: o.top,
                within,
                rank,
            },
        )
    };
    let (top_self, _) = query(Attribution::SelfSite, &|t| t.allocated);
    let (top_inclusive, inclusive_omitted) = query(Attribution::Inclusive, &|t| t.allocated);
    let (top_unreleased, _) = query(Attribution::SelfSite, &|t| t.unreleased);
    let top_temporary = if h.exact {
        query(Attribution::SelfSite, &|t| t.temporary.unwrap_or(0)).0
    } else {
        Vec::new()
    };
    let process = data.processes.get(&h.pid);
    HeapReport {
        pid: h.pid,
        cmdline: process.map(|p| p.cmdline.clone()).unwrap_or_default(),
        ppid: process.and_then(|p| p.ppid),
        heap: h.heap_name.clone(),
        sampling_interval_bytes: h.sampling_interval_bytes,
        raised_from_bytes: Some(h.orig_sampling_interval_bytes)
            .filter(|&o| o != 0 && o < h.sampling_interval_bytes),
        exact: h.exact,
        dumps: h.dumps,
        dump_at_max: h.dump_at_max,
        as_of,
        duration_ns: match (h.start_timestamp, h.timestamp) {
            (Some(s), Some(e)) if e >= s => Some(e - s),
            _ => None,
        },
        flags: flags_of(h),
        samples: stats_of.map(|s| s.heap_samples),
        unwinding_errors: stats_of.map(|s| s.unwinding_errors),
        mean_unwind_us: stats_of
            .filter(|s| s.heap_samples > 0)
            .map(|s| s.total_unwinding_time_us as f64 / s.heap_samples as f64),
        totals,
        stacks: h.callstacks.len(),
        short_lived_within: h.exact.then(|| stats.freed_within(within).1),
        sizes: size_rows(&stats),
        top_self,
        top_inclusive,
        inclusive_omitted,
        top_unreleased,
        top_temporary,
    }
}

/// Builds the report of the heaps `filter` selects.
pub fn build_report(trace: &str, data: &TraceData, filter: &Filter, o: &ReportOptions) -> Report {
    Report {
        trace: trace.to_owned(),
        heaps: data
            .heaps
            .iter()
            .filter(|h| filter.matches(h))
            .map(|h| heap_report(data, h, o, None))
            .collect(),
        warnings: data.warnings.clone(),
        truncated: truncated_of(data),
    }
}

/// The report's view of [`TraceData::truncated`].
pub fn truncated_of(data: &TraceData) -> Option<Truncated> {
    data.truncated.as_ref().map(|t| Truncated {
        offset: t.offset,
        file_len: t.file_len,
        what: t.what.clone(),
    })
}
