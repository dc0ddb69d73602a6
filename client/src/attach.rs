//! The entry point the daemon calls inside a running process (`record --pid`).
//!
//! After `dlopen`ing the library into a stopped thread of the target (or
//! finding it already loaded), the daemon makes that thread call
//! [`heapprofd_rs_remote_attach`] with its socket id. The function is not
//! exported (only the malloc family is): the daemon finds its address in the
//! library's `.symtab` (the name is Rust-mangled and contains
//! `heapprofd_rs_remote_attach`) plus the mapping's load address. Unlike the
//! activation signal, which only flags a pending activation for the next
//! allocation hook (a library that does not interpose never sees one), it
//! starts the connecting thread at once; the daemon already checked that the
//! thread is at a safe point (not inside malloc, the dynamic loader, fork or
//! thread creation), and `pthread_create` runs with the guard held.
//!
//! The result codes are part of the daemon/client contract (the daemon turns
//! each into an error message): see the `ATTACH_*` constants.

use core::sync::atomic::Ordering;

use heapprofd_proto::wire::Handshake;

use crate::connect::{self, SocketPath};
use crate::session::{CONNECTING, IDLE, MODE, MODE_PENDING, PENDING, STATE};
use crate::tls::Guard;

/// The connecting thread was started.
pub const ATTACH_STARTED: i32 = 0;
/// A session is already active or connecting (another profiler session).
pub const ATTACH_BUSY: i32 = 1;
/// The thread was inside the library (its guard is held).
pub const ATTACH_REENTERED: i32 = 2;
/// The program's malloc is not glibc's (another allocator interposes).
pub const ATTACH_OTHER_ALLOCATOR: i32 = 3;
/// The connecting thread could not be created.
pub const ATTACH_NO_THREAD: i32 = 4;

/// Keeps the entry point in the library: nothing in the library calls it,
/// so the constructor takes its address through `black_box` (which the
/// optimiser cannot see through), and the linker keeps the function.
pub(crate) fn keep_entry() {
    core::hint::black_box(heapprofd_rs_remote_attach as *const ());
}

/// Starts a session with the daemon listening on
/// `/tmp/heapprofd-rs-<id>.sock`. Returns one of the `ATTACH_*` codes.
///
/// Called by the daemon through ptrace, on a thread it stopped at a safe
/// point; never called by the program.
#[cfg_attr(test, allow(dead_code))]
pub(crate) extern "C" fn heapprofd_rs_remote_attach(id: u32) -> i32 {
    let Some(_g) = Guard::enter() else {
        return ATTACH_REENTERED;
    };
    if crate::got::needs_patching() && !crate::got::glibc_allocator() {
        return ATTACH_OTHER_ALLOCATOR;
    }
    let claimed = STATE
        .compare_exchange(IDLE, CONNECTING, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
        || STATE
            .compare_exchange(PENDING, CONNECTING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
    if !claimed {
        return ATTACH_BUSY;
    }
    // A signal activation that was still waiting for an allocation is
    // superseded by this one.
    let _ = MODE.compare_exchange(MODE_PENDING, 0, Ordering::SeqCst, Ordering::SeqCst);
    if !connect::spawn(SocketPath::for_id(id), Handshake::FLAG_FROM_SIGNAL, None) {
        STATE.store(IDLE, Ordering::SeqCst);
        return ATTACH_NO_THREAD;
    }
    ATTACH_STARTED
}
