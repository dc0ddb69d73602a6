//! The control entry points bionic looks up besides the dispatch entries:
//! `heapprofd_initialize` (every new profile), `heapprofd_finalize` (at
//! exit) and the four leak-info functions of the malloc-debug interface.
//!
//! bionic calls `heapprofd_initialize(prev, zygote_child, options)` from
//! libc's start-up when a startup property wants the process, and from its
//! `heapprofdinit` thread after the profiling signal (`__SIGRTMIN + 4`,
//! value 0), every time anew: re-initialization is how a new session starts.
//! Only when it returns true does bionic swap in the table of our
//! `heapprofd_*` functions. So initialize:
//! 1. keeps `prev`, the table the hooks forward to (the native allocator's
//!    or GWP-ASan's);
//! 2. the first time: the main thread's stack range, glibc's static TLS
//!    size where there is one, and the core's fork handler (no constructor:
//!    bionic loads the library only to profile);
//! 3. ends a session still open from the previous initialize (bionic has
//!    already taken our table out again);
//! 4. connects synchronously (allocations are recorded from the moment
//!    bionic installs the table) to `HEAPPROFD_SOCKET`, else the profiling
//!    service of the trigger store (`heapprofd_client_core::trigger`), and
//!    starts the session's watcher, as the glibc front-end's constructor does;
//!    the handshake says "from startup" for a first initialize on the main
//!    thread (bionic's libc start-up), "from a signal" otherwise;
//! 5. returns whether a session runs.
//!
//! `zygote_child` and `options` are not used (bionic passes no options to
//! heapprofd). The front-end registers no `Frontend` callbacks with the
//! core: the table is how the program's calls reach the hooks, nothing to
//! patch or restore.

use core::ffi::{c_char, c_void};
use core::sync::atomic::{AtomicBool, Ordering};

use heapprofd_client_core::socket_path::SocketPath;
use heapprofd_client_core::state::{CONNECTING, IDLE, STATE};
use heapprofd_client_core::tls::Guard;
use heapprofd_client_core::{capture, connect, fork, procmaps, session, trigger, watcher};
use heapprofd_proto::wire::Handshake;

use crate::dispatch::{self, MallocDispatch};

/// Set by the first initialize.
static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// Starts a session (see the module doc). True if one runs.
///
/// # Safety
/// `prev` is null or a table that lives as long as the process (bionic's).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_initialize(
    prev: *const MallocDispatch,
    _zygote_child: *mut bool,
    _options: *const c_char,
) -> bool {
    let Some(_g) = Guard::enter() else {
        return false;
    };
    // SAFETY: the caller's contract.
    let Some(prev) = (unsafe { prev.as_ref() }) else {
        return false;
    };
    dispatch::set_previous(prev);
    let first = !INITIALIZED.swap(true, Ordering::SeqCst);
    if first {
        capture::set_main_stack(procmaps::main_stack());
        capture::resolve_tls_static_size();
        // SAFETY: a handler valid for the process lifetime (bionic never
        // unloads the library once a session started).
        unsafe { libc::pthread_atfork(None, None, Some(fork::atfork_child)) };
    }
    session::end_current();
    if STATE
        .compare_exchange(IDLE, CONNECTING, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // Another initialize is connecting.
        return false;
    }
    let flags = if first && on_main_thread() {
        Handshake::FLAG_FROM_STARTUP
    } else {
        Handshake::FLAG_FROM_SIGNAL
    };
    let path = SocketPath::from_env_or(trigger::service_socket);
    let Some(s) = connect::connect(&path, flags) else {
        STATE.store(IDLE, Ordering::SeqCst);
        return false;
    };
    if watcher::spawn(path, flags, Some(s)) {
        return true;
    }
    s.teardown(None);
    session::release(s);
    false
}

fn on_main_thread() -> bool {
    // SAFETY: system calls without arguments.
    unsafe { libc::syscall(libc::SYS_gettid) == libc::syscall(libc::SYS_getpid) }
}

/// Registered by bionic with `__cxa_atexit`. The session ends when the
/// process does (the watcher and the daemon see the socket close); ending
/// it here would lose the frees of exit handlers and static destructors
/// that run later. It only has the daemon keep our maps if libraries were
/// loaded since the handshake (`heapprofd_client_core::mapsask`).
#[unsafe(no_mangle)]
pub extern "C" fn heapprofd_finalize() {
    heapprofd_client_core::mapsask::before_image_ends();
}

/// malloc-debug's leak report. heapprofd keeps none in the process (the
/// profile is the daemon's): an empty report.
///
/// # Safety
/// Every pointer is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_get_malloc_leak_info(
    info: *mut *mut u8,
    overall_size: *mut usize,
    info_size: *mut usize,
    total_memory: *mut usize,
    backtrace_size: *mut usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        if !info.is_null() {
            *info = core::ptr::null_mut();
        }
        for p in [overall_size, info_size, total_memory, backtrace_size] {
            if !p.is_null() {
                *p = 0;
            }
        }
    }
}

/// Frees what [`heapprofd_get_malloc_leak_info`] returned: nothing.
#[unsafe(no_mangle)]
pub extern "C" fn heapprofd_free_malloc_leak_info(_info: *mut u8) {}

/// malloc-debug's backtrace of a live block: none kept here, 0 frames.
#[unsafe(no_mangle)]
pub extern "C" fn heapprofd_malloc_backtrace(
    _pointer: *mut c_void,
    _frames: *mut usize,
    _frame_count: usize,
) -> isize {
    0
}

/// malloc-debug's leak report to a file: none to write (false).
#[unsafe(no_mangle)]
pub extern "C" fn heapprofd_write_malloc_leak_info(_fp: *mut libc::FILE) -> bool {
    false
}
