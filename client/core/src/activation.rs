//! An activation requested from a signal handler, started by the next
//! allocation.
//!
//! A signal handler may not connect (nothing it could call is
//! async-signal-safe enough), so [`request`] only records the request: it
//! moves `STATE` from IDLE to PENDING and sets the mode to `MODE_PENDING`.
//! The next allocation (on any thread, outside the client) sees that and
//! calls [`start_pending`], which starts the connecting thread. A request
//! id `v > 0` (the `sigqueue` value) selects `/tmp/heapprofd-rs-<euid>/<v>.sock`
//! (the daemon passes its pid); otherwise `HEAPPROFD_SOCKET` or the
//! default path.

use core::sync::atomic::{AtomicI32, Ordering};

use heapprofd_proto::wire::Handshake;

use crate::socket_path::SocketPath;
use crate::state::{CONNECTING, IDLE, MODE_PENDING, PENDING, STATE, mode};
use crate::tls::Guard;
use crate::watcher;

/// Request id of the pending activation (0 = none given).
static PENDING_ID: AtomicI32 = AtomicI32::new(0);

/// Requests an activation (the daemon with id `id`, or 0 for the
/// environment's or default socket). Async-signal-safe: atomics only. A
/// request while a session is pending, connecting or active is ignored.
pub fn request(id: i32) {
    if STATE
        .compare_exchange(IDLE, PENDING, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        PENDING_ID.store(id, Ordering::SeqCst);
        mode().store(MODE_PENDING, Ordering::SeqCst);
    }
}

/// Called by an allocation hook that saw `MODE_PENDING` (guard not held).
pub(crate) fn start_pending() {
    if STATE
        .compare_exchange(PENDING, CONNECTING, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    let _ = mode().compare_exchange(MODE_PENDING, 0, Ordering::SeqCst, Ordering::SeqCst);
    let Some(_g) = Guard::enter() else {
        STATE.store(IDLE, Ordering::SeqCst);
        return;
    };
    let id = PENDING_ID.swap(0, Ordering::SeqCst);
    let path = if id > 0 {
        SocketPath::for_id(id as u32)
    } else {
        SocketPath::from_env_or(crate::trigger::service_socket)
    };
    if !watcher::spawn(path, Handshake::FLAG_FROM_SIGNAL, None) {
        STATE.store(IDLE, Ordering::SeqCst);
    }
}

/// Cancels a pending activation that another start of a session (an
/// attach) supersedes: the hooks stop looking for it.
pub fn supersede() {
    let _ = mode().compare_exchange(MODE_PENDING, 0, Ordering::SeqCst, Ordering::SeqCst);
}

/// In a forked child: forget the parent's pending request.
pub(crate) fn forget_in_child() {
    PENDING_ID.store(0, Ordering::SeqCst);
}
