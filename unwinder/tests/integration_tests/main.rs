//! Integration tests of heapprofd-unwinder (one test binary, samply style).

mod common;
mod gdb_compare;
mod hostile;
mod live;
// Replay traces are recorded for x86_64 walks only (see `replay.rs` of the crate).
#[cfg(target_arch = "x86_64")]
mod replay;
mod selfcapture;
