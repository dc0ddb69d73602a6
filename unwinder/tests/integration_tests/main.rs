//! Integration tests of heapprofd-unwinder (one test binary, samply style).

mod common;
mod gdb_compare;
mod hostile;
mod live;
mod replay;
mod selfcapture;
