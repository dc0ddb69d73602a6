//! The exported `pthread_create`: while a session samples threads (CPU
//! time, a perf event), the new thread's start routine is wrapped so the
//! thread arms its own timer and event before it runs anything
//! (`heapprofd_client_core::cputimer::thread_started`); otherwise, and
//! always when nothing samples threads, a load and a jump to glibc's.
//!
//! The wrapper's frame holds nothing to drop while the start routine runs
//! (the routine and its argument are moved out of their box first), so a
//! thread that leaves by `pthread_exit` or cancellation unwinds through it
//! as through a C frame.

use core::ffi::{c_int, c_void};

use heapprofd_client_core::cputimer;

use crate::hook::{Hook, Kind};
use crate::originals;

type Start = extern "C" fn(*mut c_void) -> *mut c_void;
type CreateFn = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    Start,
    *mut c_void,
) -> c_int;

/// The record of `pthread_create`.
pub(crate) static PTHREAD_CREATE: Hook = Hook::new(
    c"pthread_create",
    pthread_create as *const (),
    Kind::Forward,
);

/// What the wrapper needs in the new thread.
struct Routine {
    start: Start,
    arg: *mut c_void,
}

/// `pthread_create`, arming the new thread for CPU sampling first while a
/// session samples threads.
///
/// # Safety
/// Same contract as glibc's function.
#[cfg_attr(not(test), unsafe(export_name = "pthread_create"))]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: Start,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the original is glibc's pthread_create.
    let real: CreateFn = unsafe { originals::real::<CreateFn>(&PTHREAD_CREATE) };
    // The client's own threads (the watcher: made with the guard held)
    // are never armed.
    if !cputimer::wants_thread_start() || heapprofd_client_core::tls::Guard::held() {
        // SAFETY: the caller's contract, forwarded.
        return unsafe { real(thread, attr, start, arg) };
    }
    // The library's own allocator (glibc's `__libc_malloc`): never the
    // program's hooks.
    let routine = Box::into_raw(Box::new(Routine { start, arg }));
    // SAFETY: the caller's contract, with our routine in the place of theirs.
    let rc = unsafe { real(thread, attr, started, routine.cast()) };
    if rc != 0 {
        // SAFETY: the thread was not created: the box is still ours.
        drop(unsafe { Box::from_raw(routine) });
    }
    rc
}

extern "C" fn started(p: *mut c_void) -> *mut c_void {
    // SAFETY: `pthread_create` passed a leaked Box<Routine>, ours now.
    let Routine { start, arg } = *unsafe { Box::from_raw(p.cast::<Routine>()) };
    cputimer::thread_started();
    start(arg)
}
