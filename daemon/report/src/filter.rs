//! Which heaps of a trace a report or a conversion covers.

use heapprofd_model::trace::HeapProfile;

/// Which heaps to include.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this process.
    pub pid: Option<u32>,
    /// Only this heap.
    pub heap: Option<String>,
}

impl Filter {
    /// Whether `h` is selected.
    pub fn matches(&self, h: &HeapProfile) -> bool {
        self.pid.is_none_or(|p| p == h.pid) && self.heap.as_deref().is_none_or(|n| n == h.heap_name)
    }
}
