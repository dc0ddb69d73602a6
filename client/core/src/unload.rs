//! Unloading an object (`dlclose`) during a session: the samples taken in
//! it are unwound first, and the daemon is told afterwards.
//!
//! The daemon unwinds a sample after the fact, against the maps of the
//! process as it reads them then: a library unloaded before its samples
//! were unwound cuts their stacks (its pcs are in no mapping) or names
//! their frames after whatever was loaded at the same addresses later. So
//! [`unloading`] runs the front-end's unload (glibc's `dlclose`) between
//! two steps (see the shared memory's `drain`):
//!
//! 1. *before*: wait until the daemon's reader has consumed, and so
//!    unwound, every record written so far (the ring's write position as
//!    of the call), at most the ring's block timeout (`record`'s default
//!    5 s; for ever if writers wait for ever, until the session ends), or
//!    [`UNLOAD_WAIT`] when a full buffer drops records. Skipped without a session, in a
//!    forked child that does not own it, or when the reader is already
//!    there (an idle ring costs two loads). No lock is held and nothing is
//!    allocated; the daemon is poked once, and again whenever its reader
//!    says it paused. Other threads keep writing meanwhile: only what was
//!    written before the call is waited for.
//! 2. *after*: bump the ring's unload epoch, so the daemon re-reads the
//!    maps before unwinding the records written from now on.

use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;

use heapprofd_shmem::Drain;

use crate::session::{self, Session};
use crate::state::mode;

/// The longest wait before an unload when the ring has no block timeout.
pub const UNLOAD_WAIT: Duration = Duration::from_secs(1);

/// Unloads that waited for the daemon (for tests and debugging).
pub static UNLOAD_WAITS: AtomicU64 = AtomicU64::new(0);
/// Unloads whose wait ran out of time.
pub static UNLOAD_TIMEOUTS: AtomicU64 = AtomicU64::new(0);

/// Runs `unload` (the object's unloading) with the daemon caught up first
/// and told afterwards, when a session is active. Returns what `unload`
/// returned.
pub fn unloading<R>(unload: impl FnOnce() -> R) -> R {
    let Some(s) = session::acquire(mode().load(Ordering::Acquire)) else {
        return unload();
    };
    if !s.owns() {
        session::release(s);
        return unload();
    }
    catch_up(s);
    let r = unload();
    s.rb().note_unload();
    session::release(s);
    r
}

/// Waits for the daemon to consume what `s`'s ring holds now.
fn catch_up(s: &Session) {
    let rb = s.rb();
    let target = rb.write_position();
    let mut wake = || {
        s.wake_if(true);
    };
    match rb.wait_consumed(target, s.wait_limit(UNLOAD_WAIT), &mut wake) {
        Drain::Idle | Drain::Shutdown => {}
        Drain::Consumed => {
            UNLOAD_WAITS.fetch_add(1, Ordering::Relaxed);
        }
        Drain::TimedOut => {
            UNLOAD_WAITS.fetch_add(1, Ordering::Relaxed);
            UNLOAD_TIMEOUTS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_session_the_unload_just_runs() {
        let waits = UNLOAD_WAITS.load(Ordering::SeqCst);
        assert_eq!(unloading(|| 7), 7);
        assert_eq!(UNLOAD_WAITS.load(Ordering::SeqCst), waits);
    }
}
