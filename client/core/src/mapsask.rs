//! Before the process exits or execs: have the daemon read our maps while
//! we still have them, if objects were loaded since the handshake.
//!
//! The daemon unwinds samples after the fact and learns of an object
//! loaded after its last read of our maps by reading them again; once the
//! process is gone they read as empty, and the samples taken in such an
//! object would end at `ERROR INVALID_MAP` (Debian's python3 imports its C
//! extensions with `dlopen` moments before a short script ends: 35 of its
//! 2,000 allocations in 5 runs of 6; the same in 3 runs of 3 when the
//! script ends with `os.execv`). So at exit (the client's destructor, its
//! `_exit` and `_Exit`, bionic's `heapprofd_finalize`) and before an exec
//! (the exec hooks), when the loader's count
//! of objects ever added (`dlpi_adds`) moved since the handshake, the
//! client asks through the ring (the shared memory's `maps_ask`), pokes
//! the daemon and waits for its answer, at most [`WAIT`]. Nothing is
//! asked of a daemon that does not say it answers
//! (`ClientConfig::FLAG_KEEPS_MAPS`), by a forked child that does not own
//! the session, or without a session. (A `vfork` child shares the
//! session's memory and so owns it: asking before its exec reads the
//! maps they share, once.) A process killed by a signal does not ask.

use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;

use crate::session;
use crate::state::mode;

/// The longest wait for the daemon's answer.
pub const WAIT: Duration = Duration::from_millis(200);

/// `dlpi_adds` when the session's handshake started, or when the daemon
/// last answered an ask.
static ADDS_AT_CONNECT: AtomicU64 = AtomicU64::new(0);

/// Asks made (for tests and debugging).
pub static ASKS: AtomicU64 = AtomicU64::new(0);
/// Asks the daemon did not answer within [`WAIT`].
pub static ASK_TIMEOUTS: AtomicU64 = AtomicU64::new(0);

/// The handshake of a session starts (before the daemon reads the maps).
pub(crate) fn connecting() {
    ADDS_AT_CONNECT.store(objects_added(), Ordering::Relaxed);
}

/// The loader's count of objects ever added (`dl_iterate_phdr`'s
/// `dlpi_adds`; 0 where the loader does not say): changes when an object
/// is loaded. Takes the loader's lock.
pub fn objects_added() -> u64 {
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut core::ffi::c_void,
    ) -> core::ffi::c_int {
        if size >= core::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) {
            // SAFETY: the loader passes a valid info of `size` bytes and
            // our u64.
            unsafe { *data.cast::<u64>() = (*info).dlpi_adds };
        }
        1
    }
    let mut adds = 0u64;
    // SAFETY: the callback only reads what the loader passes.
    unsafe { libc::dl_iterate_phdr(Some(cb), (&mut adds as *mut u64).cast()) };
    adds
}

/// The process is about to exit or exec: asks (and waits) if this
/// process owns a session whose daemon answers asks and objects were
/// loaded since its handshake.
pub fn before_image_ends() {
    let Some(s) = session::acquire(mode().load(Ordering::Acquire)) else {
        return;
    };
    if s.owns() && s.config().keeps_maps() {
        let adds = objects_added();
        if adds != ADDS_AT_CONNECT.load(Ordering::Relaxed) {
            let rb = s.rb();
            let asked = rb.ask_maps();
            ASKS.fetch_add(1, Ordering::Relaxed);
            if s.wake_if(true) && rb.wait_maps_kept(asked, WAIT) {
                // The daemon has these maps: a later end (an `atexit`
                // handler's `_exit`) asks again only after more loads.
                ADDS_AT_CONNECT.store(adds, Ordering::Relaxed);
            } else {
                ASK_TIMEOUTS.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    session::release(s);
}
