//! End-to-end tests of heapprofd-rs against real programs.
//!
//! * [`client_harness`]: building the client library and the test programs,
//!   running them under `LD_PRELOAD`, and driving `heapprofd-test-receiver`
//!   (a minimal stand-in for the daemon, `src/bin/heapprofd-test-receiver.rs`).

pub mod client_harness;
