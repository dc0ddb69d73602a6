//! Ctrl-C (and SIGTERM) during `heapprofd-rs android`: a flag the
//! workflow polls, so it can tell the device to end the profile and still
//! pull the trace. `adb` runs in a process group of its own, so the
//! terminal's Ctrl-C reaches only this process.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM from now on.
pub fn install() -> Result<()> {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { sigaction(sig, &action) }.context("installing the Ctrl-C handler")?;
    }
    Ok(())
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
