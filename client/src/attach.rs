//! The entry points the daemon calls inside a running process
//! (`record --pid`).
//!
//! After `dlopen`ing the library into a stopped thread of the target (or
//! finding it already loaded), the daemon makes that thread call
//! [`heapprofd_rs_remote_attach`] with its socket id. The functions are not
//! exported (only the malloc family is): the daemon finds their addresses in
//! the library's `.symtab` (the names are Rust-mangled and contain
//! `heapprofd_rs_remote_attach` / `heapprofd_rs_remote_detach`) plus the
//! mapping's load address. The daemon has checked that the thread is at a
//! safe point (not inside malloc, the dynamic loader, fork or thread
//! creation); everything runs with the guard held.
//!
//! Two modes:
//!
//! * **threaded** (the process has other threads): start the connecting
//!   thread, which patches the GOTs, connects and stays as the session's
//!   watcher (teardown and GOT restore when the daemon closes the session).
//!   Unlike the activation signal, which only flags a pending activation for
//!   the next allocation hook (a library that does not interpose never sees
//!   one), this starts at once.
//! * **synchronous** ([`FLAG_SYNC`], the process has a single thread and
//!   the profile samples no threads):
//!   glibc makes a process "multi-threaded" for good at its first
//!   `pthread_create` (its malloc then takes arena locks and atomic
//!   operations on every call: measured 1.28x slower malloc/free pairs after
//!   a threaded attach of a single-threaded program), so no thread is
//!   created: the GOTs are patched and the handshake is done right here, in
//!   the hijacked thread, and at the end the daemon calls
//!   [`heapprofd_rs_remote_detach`] the same way, which tears the session
//!   down and restores the GOTs. Without a watcher, objects loaded later by
//!   a bare-name `dlopen` (a tail jump to glibc's) are only patched at the
//!   next wrapped `dlopen`; if the daemon dies, the next sample finds the
//!   socket closed and the hooks go back to pass-through (the GOT entries
//!   then stay redirected to them). A profile of threads (`--cpu-time`,
//!   `--event`) never gets this mode: the daemon does not pass
//!   [`FLAG_SYNC`] for one, as only a watcher's scans arm threads (those
//!   running and those the program starts later: `pthread_create` is not
//!   patched); a single-threaded target then turns multi-threaded.
//!
//! The result codes are part of the daemon/client contract (the daemon turns
//! each into an error message): see [`AttachStatus`].

use core::sync::atomic::{AtomicPtr, Ordering};

use heapprofd_client_core::session::{self, Session};
use heapprofd_client_core::socket_path::SocketPath;
use heapprofd_client_core::state::{CONNECTING, IDLE, PENDING, STATE};
use heapprofd_client_core::tls::Guard;
use heapprofd_client_core::{activation, connect, trigger, watcher};
use heapprofd_proto::attach::{AttachStatus, FLAG_SYNC};
use heapprofd_proto::wire::Handshake;

use crate::patching;

/// The session of a synchronous attach (it holds the reference a watcher
/// thread would hold), released by [`heapprofd_rs_remote_detach`].
static SYNC_SESSION: AtomicPtr<Session> = AtomicPtr::new(core::ptr::null_mut());

/// Keeps the entry points in the library: nothing in the library calls
/// them, so the constructor takes their addresses through `black_box`
/// (which the optimiser cannot see through), and the linker keeps them.
pub(crate) fn keep_entry() {
    core::hint::black_box(heapprofd_rs_remote_attach as *const ());
    core::hint::black_box(heapprofd_rs_remote_detach as *const ());
}

/// Starts a session with the daemon listening on
/// `/tmp/heapprofd-rs-<euid>/<id>.sock`, or with the profiling service for
/// id 0. Returns an [`AttachStatus`] code.
///
/// Called by the daemon through ptrace, on a thread it stopped at a safe
/// point; never called by the program.
#[cfg_attr(test, allow(dead_code))]
pub(crate) extern "C" fn heapprofd_rs_remote_attach(id: u32, flags: u32) -> i32 {
    let Some(_g) = Guard::enter() else {
        return AttachStatus::Reentered.code();
    };
    if !patching::allocator_ok() {
        return AttachStatus::OtherAllocator.code();
    }
    let claimed = STATE
        .compare_exchange(IDLE, CONNECTING, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
        || STATE
            .compare_exchange(PENDING, CONNECTING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
    if !claimed {
        return AttachStatus::Busy.code();
    }
    // A signal activation that was still waiting for an allocation is
    // superseded by this one.
    activation::supersede();
    // Id 0: the profiling service (its socket, as a signal with value 0).
    let path = if id == 0 {
        SocketPath::from_env_or(trigger::service_socket)
    } else {
        SocketPath::for_id(id)
    };
    if flags & FLAG_SYNC == 0 {
        if !watcher::spawn(path, Handshake::FLAG_FROM_SIGNAL, None) {
            STATE.store(IDLE, Ordering::SeqCst);
            return AttachStatus::NoThread.code();
        }
        return AttachStatus::Ok.code();
    }
    if patching::start().is_err() {
        STATE.store(IDLE, Ordering::SeqCst);
        return AttachStatus::OtherAllocator.code();
    }
    match connect::connect(&path, Handshake::FLAG_FROM_SIGNAL) {
        Some(s) => {
            SYNC_SESSION.store(s as *const Session as *mut Session, Ordering::SeqCst);
            AttachStatus::Ok.code()
        }
        None => {
            patching::end();
            let _ = STATE.compare_exchange(CONNECTING, IDLE, Ordering::SeqCst, Ordering::SeqCst);
            AttachStatus::ConnectFailed.code()
        }
    }
}

/// Ends a synchronous session: teardown (the hooks pass through, blocked
/// writers are released, the daemon is told) and the GOT entries restored.
/// Returns [`AttachStatus::Ok`], or [`AttachStatus::Reentered`]. Harmless when there is no session.
///
/// Called by the daemon through ptrace, like the attach entry.
#[cfg_attr(test, allow(dead_code))]
pub(crate) extern "C" fn heapprofd_rs_remote_detach() -> i32 {
    let Some(_g) = Guard::enter() else {
        return AttachStatus::Reentered.code();
    };
    let p = SYNC_SESSION.swap(core::ptr::null_mut(), Ordering::SeqCst);
    // SAFETY: sessions are never freed.
    if let Some(s) = unsafe { p.as_ref() } {
        s.teardown(None);
        heapprofd_client_core::heaps::session_ended(s.mode_word());
        session::release(s);
    }
    patching::end();
    0
}

#[cfg(test)]
mod tests {
    use heapprofd_proto::attach::{ATTACH_ENTRY, DETACH_ENTRY};

    /// The daemon finds the entry points by these names (`.symtab`).
    #[test]
    fn entry_points_have_the_abi_names() {
        let attach = core::any::type_name_of_val(&super::heapprofd_rs_remote_attach);
        assert!(attach.ends_with(&format!("::{ATTACH_ENTRY}")), "{attach}");
        let detach = core::any::type_name_of_val(&super::heapprofd_rs_remote_detach);
        assert!(detach.ends_with(&format!("::{DETACH_ENTRY}")), "{detach}");
    }
}
