//! What a trace reader gives back: per process and heap, the latest values
//! of every callstack, with its frames resolved (see [`read_trace`](super::read_trace)).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::profile::context::ContextLabels;
use crate::profile::{CallsiteStats, ProcessFlags, ProcessStats};

/// A resolved frame as stacks hold it: shared, so that the stacks of a
/// long trace (millions of them, mostly the same few thousand frames)
/// hold pointers, not copies of names.
pub type Frame = Arc<ResolvedFrame>;

/// A frame with its names resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResolvedFrame {
    /// Function name, if symbolized.
    pub function: Option<String>,
    /// Mapping path as trace processor shows it (`/` + components), if any.
    pub mapping: Option<String>,
    /// Raw build id of the mapping (empty if none).
    pub build_id: Vec<u8>,
    /// ELF virtual address in the module.
    pub rel_pc: u64,
    /// Source file, if known.
    pub source_file: Option<String>,
    /// Source line, if known.
    pub line: Option<u32>,
}

impl ResolvedFrame {
    /// A short human name: the function, else `module+0xpc`.
    pub fn display_name(&self) -> String {
        if let Some(f) = self.function.as_deref().filter(|f| !f.is_empty()) {
            return f.to_owned();
        }
        let module = self
            .mapping
            .as_deref()
            .and_then(|m| m.rsplit('/').find(|c| !c.is_empty()))
            .unwrap_or("unknown");
        format!("{module}+{:#x}", self.rel_pc)
    }
}

/// Latest values of one callstack in one heap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallstackValues {
    /// Frames, outermost caller first, allocating function last (a user
    /// context's root frame is taken off into `context`).
    pub frames: Vec<Frame>,
    /// The user context the samples were made in (its pairs, in order),
    /// if any (see [`profile::context`](crate::profile::context)).
    pub context: Option<ContextLabels>,
    /// Sampled bytes allocated, cumulative.
    pub self_allocated: u64,
    /// Sampled bytes freed, cumulative.
    pub self_freed: u64,
    /// Allocations, cumulative.
    pub alloc_count: u64,
    /// Frees, cumulative.
    pub free_count: u64,
    /// Live sampled bytes at the peak (dump_at_max traces).
    pub self_max: u64,
    /// Live allocations at the peak (dump_at_max traces).
    pub self_max_count: u64,
    /// heapprofd-rs's statistics of the callsite (estimated allocations,
    /// sizes, lifetimes), when the trace has them (see
    /// [`extension`](super::extension)).
    pub stats: Option<CallsiteStats>,
}

impl CallstackValues {
    /// The four cumulative counters.
    pub fn counters(&self) -> Counters {
        Counters {
            allocated: self.self_allocated,
            freed: self.self_freed,
            alloc_count: self.alloc_count,
            free_count: self.free_count,
        }
    }

    /// Bytes allocated and not freed.
    pub fn unreleased(&self) -> u64 {
        self.self_allocated.saturating_sub(self.self_freed)
    }

    /// Allocations not freed.
    pub fn unreleased_count(&self) -> u64 {
        self.alloc_count.saturating_sub(self.free_count)
    }

    /// The value of `key` in the context, if the samples had a context
    /// with that key.
    pub fn context_value(&self, key: &str) -> Option<&str> {
        self.context
            .as_ref()?
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The four cumulative counters of a callstack (or their sum).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Counters {
    /// Sampled bytes allocated.
    pub allocated: u64,
    /// Sampled bytes freed.
    pub freed: u64,
    /// Allocations (samples).
    pub alloc_count: u64,
    /// Frees (of samples).
    pub free_count: u64,
}

impl Counters {
    /// Bytes allocated and not freed.
    pub fn unreleased(&self) -> u64 {
        self.allocated.saturating_sub(self.freed)
    }

    /// Allocations not freed.
    pub fn unreleased_count(&self) -> u64 {
        self.alloc_count.saturating_sub(self.free_count)
    }
}

/// One dump of a heap: its window, the totals after it, and the callstacks
/// whose values it changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpPoint {
    /// Start of the dump's window (MONOTONIC_COARSE ns).
    pub start: u64,
    /// End of the window: when the values were taken.
    pub timestamp: u64,
    /// Sum over every callstack of its latest values as of this dump.
    pub totals: Counters,
    /// (index into [`HeapProfile::callstacks`], values as of this dump)
    /// for each callstack whose values this dump changed.
    pub changes: Vec<(u32, Counters)>,
}

/// Everything known about one heap of one process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeapProfile {
    /// Process id.
    pub pid: u32,
    /// Heap name (`unknown` when the trace has none, like trace processor).
    pub heap_name: String,
    /// Latest sampling interval.
    pub sampling_interval_bytes: u64,
    /// Original sampling interval.
    pub orig_sampling_interval_bytes: u64,
    /// Dumps of this heap in the trace.
    pub dumps: u64,
    /// Start of the first dump's window (MONOTONIC_COARSE ns).
    pub start_timestamp: Option<u64>,
    /// End of the last dump's window (MONOTONIC_COARSE ns).
    pub timestamp: Option<u64>,
    /// Whether the dumps carry dump_at_max values.
    pub dump_at_max: bool,
    /// Latest per-process stats.
    pub stats: Option<ProcessStats>,
    /// Flags, set if set in any dump.
    pub flags: ProcessFlags,
    /// Profiled from process start.
    pub from_startup: bool,
    /// Latest values per distinct stack.
    pub callstacks: Vec<CallstackValues>,
    /// Every allocation was recorded and the trace counted lifetimes and
    /// temporary allocations (heapprofd-rs at interval 1).
    pub exact: bool,
    /// The dumps in trace order (one for a plain trace; one per tick for a
    /// `--continuous-dump` trace).
    pub timeline: Vec<DumpPoint>,
}

/// Memory counters of a process at one instant (`ProcessStats` packets).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemorySample {
    /// When (MONOTONIC_COARSE ns, the clock of the heap dumps).
    pub timestamp: u64,
    /// Resident set size, kB.
    pub rss_kb: u64,
    /// Peak resident set size, kB (0 if not known).
    pub hwm_kb: u64,
}

/// A process of the `ProcessTree`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Command line.
    pub cmdline: Vec<String>,
    /// Parent process id, if the trace names it.
    pub ppid: Option<u32>,
    /// Thread names by thread id (empty: unnamed).
    pub threads: BTreeMap<u32, String>,
    /// Memory counters over time.
    pub memory: Vec<MemorySample>,
}

/// Where and why a trace ends before its data does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    /// Byte offset where the incomplete part starts.
    pub offset: u64,
    /// Bytes in the file.
    pub file_len: u64,
    /// What is incomplete there.
    pub what: String,
}

/// One stack of a [`SampleProfile`] on one thread.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampledStack {
    /// Frames, outermost caller first, sampled function last.
    pub frames: Vec<Frame>,
    /// Thread id.
    pub tid: u32,
    /// Samples with this stack on this thread.
    pub samples: u64,
    /// Sum of their periods (CPU nanoseconds for CPU time).
    pub weight: u64,
}

/// The stack samples of one (process, event): `PerfSample` packets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampleProfile {
    /// Process id.
    pub pid: u32,
    /// The event's tag (0: CPU time; traces of other tools: 0).
    pub tag: u64,
    /// `cpu-time`, or the program's name for the event.
    pub event: String,
    /// By stack and thread, in order of first appearance.
    pub stacks: Vec<SampledStack>,
    /// Per thread: samples, weight and losses (heapprofd-rs's totals when
    /// the trace has them, else counted from the samples, no losses).
    pub threads: BTreeMap<u32, crate::profile::ThreadSamples>,
    /// Samples whose stack could not be walked to its end (`PerfSample`
    /// `unwind_error` set; their stacks end in an `ERROR` frame).
    pub unwind_errors: u64,
}

/// The heap profiles in a trace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceData {
    /// Processes named by `ProcessTree` packets.
    pub processes: BTreeMap<u32, ProcessInfo>,
    /// Heap profiles, by (pid, heap name).
    pub heaps: Vec<HeapProfile>,
    /// Stack samples (CPU time, named events), by (pid, event).
    pub samples: Vec<SampleProfile>,
    /// Trace packets read.
    pub packets: u64,
    /// Problems that did not stop the reading (dangling ids, index gaps,
    /// a partial last packet…).
    pub warnings: Vec<String>,
    /// The trace was cut short (a partial last packet, or a heap dump that
    /// never finished): what was read is in, the rest is lost.
    pub truncated: Option<Truncation>,
}
