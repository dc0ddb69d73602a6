//! Start-up: the constructor, the activation signal, and fork handling.
//!
//! The constructor runs from `.init_array` when the library is loaded
//! (`LD_PRELOAD`, or a later `dlopen`). With the guard held, so nothing it
//! does is sampled, it:
//! 1. registers the glibc front-end with the core (`patching`), resolves
//!    the hooks' originals (`originals`, which also decides whether the
//!    library interposes the program's malloc: it was preloaded ahead of
//!    every other definition; if not, sessions patch the GOTs, see
//!    `patching`), points an allocator's calls to its own entry points
//!    past the hooks (`got::bypass`, when the allocator has its own C++
//!    operators), looks up the size of glibc's static TLS area, and reads
//!    the main thread's `[stack]` range from `/proc/self/maps` (all need
//!    allocation-free or guarded contexts, so they are done once, here);
//! 2. registers a `pthread_atfork` child handler;
//! 3. only if the library interposes, installs the
//!    activation signal handler (signal 36, `__SIGRTMIN + 4`, as Android's
//!    heapprofd) unless `HEAPPROFD_NO_SIGNAL=1` or the program already has a
//!    handler for it (only a `SIG_DFL` disposition is replaced; a program
//!    that installs its own handler later simply wins);
//! 4. if `HEAPPROFD_SOCKET` is set for this library
//!    (`inherit::addressed_to_us`: not for a copy only
//!    `/etc/ld.so.preload` loaded while `LD_PRELOAD` names another
//!    front-end), connects: synchronously with
//!    `HEAPPROFD_BLOCKING_INIT=1` (start-up allocations are not missed),
//!    otherwise on a new thread; else, if it was preloaded and a profiling
//!    service's startup-trigger store wants this program (one that does
//!    not interpose only tells the service why it runs unprofiled)
//!    (`heapprofd_client_core::trigger`: raw system calls, nothing
//!    allocated), connects to that service synchronously. Otherwise it stays
//!    dormant: every hook costs a load and a branch.
//!
//! The signal handler only records the request
//! (`heapprofd_client_core::activation`): the next allocation outside the
//! client starts the connecting thread. A `sigqueue` value `v > 0` selects
//! `/tmp/heapprofd-rs-<euid>/<v>.sock` (the daemon passes its pid); otherwise
//! `HEAPPROFD_SOCKET` or the default path. fork: the core's child handler
//! (`heapprofd_client_core::fork`) forgets the parent's session.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::Ordering;

use heapprofd_client_core::socket_path::SocketPath;
use heapprofd_client_core::state::{CONNECTING, IDLE, STATE};
use heapprofd_client_core::tls::Guard;
use heapprofd_client_core::{
    activation, capture, connect, env, fork, frontend, procmaps, session, trigger, watcher,
};
use heapprofd_proto::wire::Handshake;

use crate::hooktable::{FORWARDED, HOOKS};
use crate::{attach, cxxhooks, got, hooks, inherit, interpose, originals, patching};

/// The activation signal (36, `__SIGRTMIN + 4`), from the attach ABI.
pub use heapprofd_proto::attach::ACTIVATION_SIGNAL;

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) = constructor;

#[cfg_attr(test, allow(dead_code))]
extern "C" fn constructor(_argc: c_int, _argv: *mut *mut c_char, _envp: *mut *mut c_char) {
    let Some(_g) = Guard::enter() else { return };
    frontend::install(&patching::GLIBC);
    originals::resolve(&[&HOOKS, &FORWARDED]);
    // Another copy of the client came first (`LD_PRELOAD` beside the one
    // installed system-wide): it interposes and profiles; this copy's hooks
    // only pass calls on, and it takes no signal and starts no session.
    if originals::another_copy_first() {
        return;
    }
    if cxxhooks::NEW.recorded() {
        got::bypass(&HOOKS, hooks::MALLOC.original());
    }
    inherit::capture();
    capture::set_main_stack(procmaps::main_stack());
    capture::resolve_tls_static_size();
    attach::keep_entry();
    // SAFETY: registering a handler that is valid for the process lifetime
    // (the library is never unloaded while a session may run).
    unsafe { libc::pthread_atfork(None, None, Some(fork::atfork_child)) };
    // A library that does not interpose (loaded by an attach) never sees the
    // allocation that would act on a pending activation: the daemon calls
    // `attach::heapprofd_rs_remote_attach` instead, and the program's
    // disposition of the signal is left alone.
    if interpose::interposing() && !env::is_1(c"HEAPPROFD_NO_SIGNAL") {
        install_signal_handler();
    }
    // Where to connect at start-up: `HEAPPROFD_SOCKET` (record), else a
    // profiling service whose startup-trigger store wants this program (a
    // preloaded library only: one loaded later cannot see the program's
    // start anyway). Otherwise the library stays dormant.
    let (path, blocking) = if inherit::addressed_to_us() {
        (
            SocketPath::from_env_or(trigger::service_socket),
            env::is_1(c"HEAPPROFD_BLOCKING_INIT"),
        )
    } else if interpose::interposing() || originals::preloaded() {
        // A preloaded copy that does not interpose (an allocator in
        // `LD_PRELOAD` before the installed client) is refused below: the
        // service it asked is told why, and names the program.
        match trigger::startup_service() {
            // From the first allocation, as bionic's startup profiling;
            // silently (the program may be anyone's).
            Some(path) => {
                connect::quiet();
                (path, true)
            }
            None => return,
        }
    } else {
        return;
    };
    if STATE
        .compare_exchange(IDLE, CONNECTING, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    // A program whose calls cannot be reached runs unprofiled; the daemon
    // is told why instead of getting a session.
    if interpose::needs_patching()
        && let Some(r) = originals::refusal(&hooks::MALLOC)
        && r.unprofilable != heapprofd_proto::wire::Unprofilable::None
    {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        if !connect::notify_unprofilable(&path, pid, r.unprofilable) {
            heapprofd_client_core::log::log(b"heapprofd-rs: ", r.message);
        }
        STATE.store(IDLE, Ordering::SeqCst);
        return;
    }
    let flags = Handshake::FLAG_FROM_STARTUP;
    if blocking {
        match connect::connect(&path, flags) {
            Some(s) => {
                if !watcher::spawn(path, flags, Some(s)) {
                    session::release(s);
                }
            }
            None => STATE.store(IDLE, Ordering::SeqCst),
        }
    } else if !watcher::spawn(path, flags, None) {
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
    activation::request(id);
}
