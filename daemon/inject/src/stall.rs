//! Test stall points: with `HEAPPROFD_ATTACH_TEST_STALL=<step>` the
//! injector stops for good at that step (after saying so on stderr), so
//! that a test can kill `record --pid` at exactly that moment
//! (`tests/tests/attach_kill.rs`). Steps: `call-<k>-ready` (the registers
//! of the k-th call are set), `call-<k>-running` (it was resumed),
//! `call-<k>-returned` (it returned into the stub), and the restore after
//! the last call: `restore-ready` (the thread is sent to its final stop),
//! `restore-stopped` (it is there), `restore-fp` (the vector state is
//! back), `restore-regs` (the registers are back, not yet detached).

use std::time::Duration;

/// The step to stall at, if any.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stall<'a>(pub(crate) Option<&'a str>);

impl Stall<'_> {
    /// Stalls for good if `step` is the one asked for.
    pub(crate) fn at(&self, step: &str) {
        if self.0 != Some(step) {
            return;
        }
        log::warn!("test stall at {step}");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}
