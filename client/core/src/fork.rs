//! fork: the child forgets the parent's session without touching it.
//!
//! [`atfork_child`] (registered with `pthread_atfork` by the front-end's
//! constructor) sends no shutdown on the shared socket and writes nothing
//! into the shared ring: it closes the child's copy of the socket (and of a
//! handshake in progress) and unmaps the child's view of the ring. vfork,
//! posix_spawn and `clone(CLONE_VM)` children run no atfork handler but
//! share our memory, so what they allocate is in our heap and is recorded
//! in our session. A child forked by a raw `fork` system call (no atfork
//! handler) sees a zeroed `MADV_WIPEONFORK` page and records nothing (see
//! `session::owns_session`). exec replaces the image.

use core::sync::atomic::Ordering;

use crate::{activation, connect, cputimer, session, threadslots};

/// The `pthread_atfork` child handler.
pub extern "C" fn atfork_child() {
    let fd = connect::CONNECTING_FD.swap(-1, Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: the child's copy of a handshake socket of the parent.
        unsafe { libc::close(fd) };
    }
    activation::forget_in_child();
    session::forget_in_child();
    threadslots::forget_in_child();
    cputimer::forget_in_child();
}
