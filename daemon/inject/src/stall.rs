//! Test stall points: with `HEAPPROFD_ATTACH_TEST_STALL=<step>` the
//! injector stops for good at that step (after saying so on stderr), so
//! that a test can kill `record --pid` at exactly that moment
//! (`tests/tests/attach_kill.rs`). Steps: `call-<k>-ready` (the registers
//! of the k-th call are set), `call-<k>-running` (it was resumed),
//! `call-<k>-returned` (it returned into the stub), and the restore after
//! the last call: `restore-ready` (the thread is sent to its final stop),
//! `restore-stopped` (it is there), `restore-fp` (the vector state is
//! back), `restore-regs` (the registers are back, not yet detached). The
//! hijack that ends a synchronous session has the same steps prefixed
//! with `detach-` (`detach-call-1-running`: in the client's detach entry).

use std::time::Duration;

/// The step to stall at, if any, and the prefix of this hijack's steps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stall<'a> {
    step: Option<&'a str>,
    prefix: &'static str,
}

impl Stall<'_> {
    /// Stalls at `step` (if any) of an injection, or of the hijack that
    /// ends a synchronous session (`detach`).
    pub(crate) fn new(step: Option<&str>, detach: bool) -> Stall<'_> {
        Stall {
            step,
            prefix: if detach { "detach-" } else { "" },
        }
    }

    /// Stalls for good if `step` is the one asked for.
    pub(crate) fn at(&self, step: &str) {
        let Some(want) = self.step else { return };
        if want.strip_prefix(self.prefix) != Some(step) {
            return;
        }
        log::warn!("test stall at {want}");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}
