//! Loading the client library into a running process and starting a
//! session in it (`record --pid`), without a debugger.
//!
//! [`probe`] reads what `/proc` says about the target and refuses, with a
//! hint and before touching anything, what cannot work: no such process, a
//! zombie or stopped process, another tracer, another architecture, a
//! statically linked program (no `libc.so`, so no `dlopen`), a target
//! already being profiled. It also tells whether the client is already
//! loaded and interposing (preloaded), in which case the activation signal
//! is enough ([`signal_activate`]).
//!
//! Otherwise [`inject`] does, on one thread of the target at a time:
//!
//! 1. before stopping anything: find `dlopen`, `dlsym`, `__errno_location`
//!    in the target's own libc (its `.dynsym` + the mapping's load bias),
//!    the client's attach entry in the client's `.symtab`, and build the
//!    safety model (`safety.rs`) (unwind tables, deny ranges);
//! 2. `PTRACE_SEIZE` + `PTRACE_INTERRUPT` one thread (the others keep
//!    running), copy its stack and unwind it; if it is not at a safe point,
//!    detach at once and try the next thread, round after round, until the
//!    timeout;
//! 3. save its general registers, its XSAVE area and its signal mask;
//!    write the return path (`restore.rs`, `sigframe.rs`): the library
//!    path, a signal frame holding the saved state below the red zone, and
//!    a 12-byte stub at the program's entry point that `rt_sigreturn`s
//!    through that frame. Then call, each call returning into the stub:
//!    `__errno_location()` (the thread's errno is saved and
//!    written back at the end: the thread may have been stopped between a
//!    failing call and its read of errno), `dlsym(RTLD_DEFAULT, "malloc")`
//!    (must be glibc's or the client's: another allocator is refused before
//!    anything is loaded), `dlopen(path, RTLD_NOW | RTLD_NODELETE)` (not
//!    `RTLD_GLOBAL`: the library must not interpose later lookups; skipped
//!    when already loaded), `dlerror()` if that failed, and the client's
//!    attach entry with our socket id, which starts the client's connecting
//!    thread, or, in a single-threaded process, connects right there
//!    (glibc would treat the process as multi-threaded for good after a
//!    `pthread_create`, with slower malloc); such a synchronous session is
//!    ended by [`detach`], the same hijack calling the client's detach
//!    entry. The tracer catches each return at the stub's system-call stop
//!    (`PTRACE_SYSCALL`); if it is killed at any moment, the thread goes
//!    back by itself through the frame (the target survives a SIGKILL of
//!    `record --pid`, `tests/tests/attach_kill.rs`);
//! 4. restore every register (including `orig_rax`: a thread stopped inside
//!    a blocking system call resumes it, the kernel restarts it as after any
//!    signal) and the vector state at an ordinary stop, detach, and put the
//!    entry point's bytes back. A signal that was being delivered at the
//!    first stop is left to be delivered (the thread is tried again later).
//!
//! Every failure after the stop restores the registers before detaching.
//! Errors are [`InjectError`]s: each says what failed and what to do.

// Off x86_64 only the probe and the signal remain: the ELF and attach-ABI
// facts the hijack uses are compiled but unused there.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

#[cfg(target_arch = "x86_64")]
mod calls;
mod elf;
mod error;
mod options;
mod permission;
#[cfg(target_arch = "x86_64")]
mod plan;
mod probe;
#[cfg(target_arch = "x86_64")]
mod ptrace;
#[cfg(target_arch = "x86_64")]
mod remote;
#[cfg(target_arch = "x86_64")]
mod restore;
#[cfg(target_arch = "x86_64")]
mod safety;
#[cfg(target_arch = "x86_64")]
mod sigframe;
mod signal;
#[cfg(target_arch = "x86_64")]
mod stall;
mod status;
#[cfg(target_arch = "x86_64")]
mod steps;
#[cfg(not(target_arch = "x86_64"))]
mod unsupported;

pub use error::InjectError;
pub use options::{InjectOptions, InjectReport};
pub use probe::{Target, client_thread, probe, probe_loaded, threads};
#[cfg(target_arch = "x86_64")]
pub use remote::{detach, inject};
pub use signal::signal_activate;
#[cfg(not(target_arch = "x86_64"))]
pub use unsupported::{detach, inject};

// The attach ABI (entry names, the activation signal, the client's thread name).
pub use heapprofd_proto::attach::{ACTIVATION_SIGNAL, CLIENT_FILE_NAME, CLIENT_THREAD_NAME};
use heapprofd_proto::attach::{ATTACH_ENTRY, DETACH_ENTRY};
