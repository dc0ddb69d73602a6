//! A sampled allocation, as the profile records it.

/// One sampled allocation of a process (see [`Profile::malloc`]).
///
/// [`Profile::malloc`]: super::Profile::malloc
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// CLOCK_MONOTONIC_COARSE of the allocation.
    pub timestamp_ns: u64,
}
