//! A sampled allocation, as the profile records it.

/// One sampled allocation of a process (see [`Profile::malloc`]).
///
/// [`Profile::malloc`]: super::Profile::malloc
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Alloc {
    /// Heap id (0 = libc.malloc).
    pub heap: u32,
    /// The client's sequence number (one counter per process for mallocs
    /// and frees).
    pub seq: u64,
    /// Address returned to the program.
    pub address: u64,
    /// Bytes the sample stands for (the real size at interval 1).
    pub sample_size: u64,
    /// Bytes the program asked for (what the size histogram and the
    /// estimated allocation count use).
    pub size: u64,
    /// Kernel thread id of the allocating thread (0 = unknown).
    pub tid: u32,
    /// CLOCK_MONOTONIC_COARSE of the allocation.
    pub timestamp_ns: u64,
}
