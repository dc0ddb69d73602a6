//! End-to-end tests of heapprofd-rs against real programs.
//!
//! * [`client_harness`]: building the client library and the test programs,
//!   running them under `LD_PRELOAD`, and driving `heapprofd-test-receiver`
//!   (a minimal stand-in for the daemon, `src/bin/heapprofd-test-receiver.rs`).
//! * [`record_harness`]: finding the release `heapprofd-rs`, compiling the
//!   record test programs, driving `record`, and reading traces back through
//!   the official-schema checker (`proto/tests/check_trace.py`).
//! * [`attach_harness`]: the `record --pid` targets and their driving.
//! * [`hostile_peer`]: a client of the socket protocol written for abuse
//!   (bad descriptors, slow handshakes, made-up records).
//! * [`bench_args`]: `--help` and usage errors for the bench binaries.
//! * [`report_harness`]: recording test programs for the `report`/`convert`
//!   tests and reading their JSON.
//! * [`service_harness`]: a `heapprofd-rs daemon` in a scratch directory,
//!   its log lines, `record` against it, preloaded programs.
//! * [`symbolize_harness`]: `--no-symbolize` traces, `symbolize` runs,
//!   their frames and `ModuleSymbols` read back, stripped binaries and
//!   debug files.
//! * [`test_users`]: throw-away system users for the multi-user tests.
//! * [`browser`]: a headless Chromium over the DevTools protocol (the HTML
//!   page's tests).

pub mod alloc_truth;
pub mod attach_harness;
pub mod bench_args;
pub mod browser;
pub mod client_harness;
pub mod hostile_peer;
pub mod record_harness;
pub mod report_harness;
pub mod service_harness;
pub mod symbolize_harness;
pub mod test_users;
