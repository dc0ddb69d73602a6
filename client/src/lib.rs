//! heapprofd-rs client library: `libheapprofd_client.so`.
//!
//! Loaded into a program with `LD_PRELOAD` (or later, for attaching), it
//! exports the glibc malloc family and nothing else, samples allocations
//! with per-thread Poisson sampling, and writes each sample (registers plus
//! a raw copy of the stack) and each free of a sampled block into a
//! shared-memory ring buffer that the daemon drains and unwinds.
//!
//! # Design constraints
//! * **Never the reason the program crashes or hangs.** No panics on hook
//!   paths (`panic = "abort"` is only the last line of defence), no locks
//!   the program could hold, bounded waits, teardown to pass-through on any
//!   failure.
//! * **No allocation through our own hooks.** The library's Rust allocations
//!   go to glibc's `__libc_*` directly ([`real::LibcAlloc`]). glibc code that
//!   allocates on our behalf (`pthread_getattr_np`, `pthread_create`,
//!   `dlsym`) runs under the reentrancy guard ([`tls::Guard`]), which makes
//!   nested hooks pass straight through.
//! * **No global-dynamic TLS.** Per-thread state lives in one 64-byte
//!   initial-exec TLS block (see [`tls`]); nothing from std that uses
//!   `thread_local!` (`std::thread`, `std::env`) is used.
//! * **Invisible when idle.** Dormant hooks cost one load and one branch.
//!
//! # Environment
//! * `HEAPPROFD_SOCKET=PATH`: connect to the daemon at start-up.
//! * `HEAPPROFD_BLOCKING_INIT=1`: connect synchronously in the constructor.
//! * `HEAPPROFD_NO_SIGNAL=1`: do not install the activation signal handler.
//!
//! # Modules
//! [`hooks`] (the exported functions) → [`sampler`] (the decision) →
//! `session` (state machine, record writing, teardown) → [`capture`]
//! (registers, stack bounds) and [`freeset`] (live sampled addresses);
//! `connect` (handshake, watcher thread), `init` (constructor, signal, fork);
//! `attach` (the entry point the daemon calls in a running process) and
//! `got` (GOT patching when the library was loaded without interposing),
//! `elfdyn` (reading loaded objects' dynamic sections) and `dlhook` (the
//! `dlopen` hook).
//!
//! Linking the rlib into a program interposes that program's malloc with
//! these hooks and installs [`real::LibcAlloc`] as its Rust allocator; the
//! rlib exists for the crate's own tests and for other client flavours.

mod attach;
pub mod capture;
mod connect;
mod dlhook;
mod elfdyn;
pub mod freeset;
mod got;
pub mod hooks;
mod init;
pub mod procmaps;
pub mod real;
pub mod sampler;
mod session;
pub mod tls;

pub use init::ACTIVATION_SIGNAL;

/// The library's own allocations bypass the hooks.
#[cfg(not(test))]
#[global_allocator]
static ALLOC: real::LibcAlloc = real::LibcAlloc;

pub(crate) use init::getenv_bytes;

/// Whether the environment variable is set to exactly `1`.
pub(crate) fn env_is_1(name: &core::ffi::CStr) -> bool {
    getenv_bytes(name) == Some(b"1")
}

/// This thread's errno.
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Writes `a`, `b` and a newline to stderr with raw writes (no allocation,
/// no formatting, no stdio lock).
pub(crate) fn log(a: &[u8], b: &[u8]) {
    for part in [a, b, b"\n"] {
        // SAFETY: writing our own bytes to fd 2; errors are ignored.
        unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
}
