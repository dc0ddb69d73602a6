//! Start-up: the constructor, the activation signal, and fork handling.
//!
//! The constructor runs from `.init_array` when the library is loaded
//! (`LD_PRELOAD`, or a later `dlopen`). With the guard held, so nothing it
//! does is sampled, it:
//! 1. looks up glibc's `malloc_usable_size` and the size of its static TLS
//!    area, and reads the main thread's `[stack]` range from
//!    `/proc/self/maps` (all need allocation-free or guarded contexts, so
//!    they are done once, here);
//! 2. registers a `pthread_atfork` child handler;
//! 3. decides whether the library interposes the program's malloc (it was
//!    preloaded) or not (it was `dlopen`ed by an attach: sessions then patch
//!    the GOTs, see `got`), and, only if it interposes, installs the
//!    activation signal handler (signal 36, `__SIGRTMIN + 4`, as Android's
//!    heapprofd) unless `HEAPPROFD_NO_SIGNAL=1` or the program already has a
//!    handler for it (only a `SIG_DFL` disposition is replaced; a program
//!    that installs its own handler later simply wins);
//! 4. if `HEAPPROFD_SOCKET` is set, connects: synchronously with
//!    `HEAPPROFD_BLOCKING_INIT=1` (start-up allocations are not missed),
//!    otherwise on a new thread.
//!
//! The signal handler only records the request: it moves `STATE` from IDLE
//! to PENDING and sets `MODE` to `MODE_PENDING`. The next allocation (on any
//! thread, outside the client) sees that, and starts the connecting thread.
//! A `sigqueue` value `v > 0` selects `/tmp/heapprofd-rs-<v>.sock` (the
//! daemon passes its pid); otherwise `HEAPPROFD_SOCKET` or the default path.
//!
//! fork: the child handler forgets the parent's session without touching it
//! (no shutdown on the shared socket, no write into the shared ring): it
//! closes the child's copy of the socket and unmaps the child's view of the
//! ring. vfork, posix_spawn and `clone(CLONE_VM)` children run no atfork
//! handler but share our memory, so what they allocate is in our heap and is
//! recorded in our session. A child forked by a raw `fork` system call (no
//! atfork handler) sees a zeroed `MADV_WIPEONFORK` page and records nothing
//! (see `session::owns_session`). exec replaces the image.

use core::ffi::{CStr, c_char, c_int, c_void};
use core::sync::atomic::{AtomicI32, Ordering};

use heapprofd_proto::wire::Handshake;

use crate::connect::{self, SOCKET_ENV, SocketPath};
use crate::session::{self, CONNECTING, IDLE, MODE, MODE_PENDING, PENDING, STATE};
use crate::tls::Guard;

/// The activation signal (36, `__SIGRTMIN + 4`), from the attach ABI.
pub use heapprofd_proto::attach::ACTIVATION_SIGNAL;

/// `sigqueue` value of the pending activation (0 = none given).
static PENDING_ID: AtomicI32 = AtomicI32::new(0);

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) = constructor;

#[cfg_attr(test, allow(dead_code))]
extern "C" fn constructor(_argc: c_int, _argv: *mut *mut c_char, _envp: *mut *mut c_char) {
    let Some(_g) = Guard::enter() else { return };
    crate::real::resolve_usable_size();
    crate::capture::set_main_stack(crate::procmaps::main_stack());
    crate::capture::resolve_tls_static_size();
    crate::got::decide_interposing();
    crate::attach::keep_entry();
    // SAFETY: registering a handler that is valid for the process lifetime
    // (the library is never unloaded while a session may run).
    unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
    // A library that does not interpose (loaded by an attach) never sees the
    // allocation that would act on a pending activation: the daemon calls
    // `attach::heapprofd_rs_remote_attach` instead, and the program's
    // disposition of the signal is left alone.
    if crate::got::interposing() && !crate::env_is_1(c"HEAPPROFD_NO_SIGNAL") {
        install_signal_handler();
    }
    if crate::getenv_bytes(SOCKET_ENV).is_none() {
        return;
    }
    if STATE
        .compare_exchange(IDLE, CONNECTING, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    let path = SocketPath::from_env_or_default();
    let flags = Handshake::FLAG_FROM_STARTUP;
    if crate::env_is_1(c"HEAPPROFD_BLOCKING_INIT") {
        match connect::connect(&path, flags) {
            Some(s) => {
                if !connect::spawn(path, flags, Some(s)) {
                    session::release(s);
                }
            }
            None => STATE.store(IDLE, Ordering::SeqCst),
        }
    } else if !connect::spawn(path, flags, None) {
        STATE.store(IDLE, Ordering::SeqCst);
    }
}

fn install_signal_handler() {
    // SAFETY: querying and setting a signal disposition with valid structs.
    unsafe {
        let mut old: libc::sigaction = core::mem::zeroed();
        if libc::sigaction(ACTIVATION_SIGNAL, core::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            return;
        }
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_activation_signal as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(ACTIVATION_SIGNAL, &sa, core::ptr::null_mut());
    }
}

/// Async-signal-safe: atomics only.
extern "C" fn on_activation_signal(_sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    let mut id = 0;
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    unsafe {
        if !info.is_null() && (*info).si_code == libc::SI_QUEUE {
            // sival_int is the low half of the sigval union (little-endian).
            id = (*info).si_value().sival_ptr as usize as u32 as i32;
        }
    }
    if STATE
        .compare_exchange(IDLE, PENDING, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        PENDING_ID.store(id, Ordering::SeqCst);
        MODE.store(MODE_PENDING, Ordering::SeqCst);
    }
}

/// Called by an allocation hook that saw `MODE_PENDING` (guard not held).
pub(crate) fn start_pending_activation() {
    if STATE
        .compare_exchange(PENDING, CONNECTING, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    let _ = MODE.compare_exchange(MODE_PENDING, 0, Ordering::SeqCst, Ordering::SeqCst);
    let Some(_g) = Guard::enter() else {
        STATE.store(IDLE, Ordering::SeqCst);
        return;
    };
    let id = PENDING_ID.swap(0, Ordering::SeqCst);
    let path = if id > 0 {
        SocketPath::for_id(id as u32)
    } else {
        SocketPath::from_env_or_default()
    };
    if !connect::spawn(path, Handshake::FLAG_FROM_SIGNAL, None) {
        STATE.store(IDLE, Ordering::SeqCst);
    }
}

extern "C" fn atfork_child() {
    let fd = connect::CONNECTING_FD.swap(-1, Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: the child's copy of a handshake socket of the parent.
        unsafe { libc::close(fd) };
    }
    PENDING_ID.store(0, Ordering::SeqCst);
    session::forget_in_child();
}

/// Reads an environment variable without allocating.
pub(crate) fn getenv_bytes(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv with a valid name; the environment string lives on
    // (we never modify the environment).
    unsafe {
        let p = libc::getenv(name.as_ptr());
        (!p.is_null()).then(|| CStr::from_ptr(p).to_bytes())
    }
}
