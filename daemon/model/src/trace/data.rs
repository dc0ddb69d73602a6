//! What a trace reader gives back: per process and heap, the latest values
//! of every callstack, with its frames resolved (see [`read_trace`](super::read_trace)).

use std::collections::BTreeMap;

use crate::profile::{ProcessFlags, ProcessStats};

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallstackValues {
    /// Frames, outermost caller first, allocating function last.
    pub frames: Vec<ResolvedFrame>,
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
}

impl CallstackValues {
    /// Bytes allocated and not freed.
    pub fn unreleased(&self) -> u64 {
        self.self_allocated.saturating_sub(self.self_freed)
    }

    /// Allocations not freed.
    pub fn unreleased_count(&self) -> u64 {
        self.alloc_count.saturating_sub(self.free_count)
    }
}

/// Everything known about one heap of one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
}

/// A process of the `ProcessTree`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Command line.
    pub cmdline: Vec<String>,
}

/// The heap profiles in a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceData {
    /// Processes named by `ProcessTree` packets.
    pub processes: BTreeMap<u32, ProcessInfo>,
    /// Heap profiles, by (pid, heap name).
    pub heaps: Vec<HeapProfile>,
    /// Trace packets read.
    pub packets: u64,
    /// Problems that did not stop the reading (dangling ids, index gaps,
    /// a partial last packet…).
    pub warnings: Vec<String>,
}
