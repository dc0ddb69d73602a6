//! heapprofd-rs client library: `libheapprofd_client.so`, the glibc
//! front-end of `heapprofd-client-core`.
//!
//! Loaded into a program with `LD_PRELOAD` (or later, by an attach), it
//! exports the glibc malloc family and nothing else. Sampling, stack
//! capture, the session and its ring buffer, the connection to the daemon
//! live in the core; this crate is what is glibc-specific: the hooks and
//! the allocator they forward to, how the hooks are reached (interposition,
//! or GOT patching when the library was loaded without interposing), the
//! attach entry points and the constructor.
//!
//! # Design constraints (the core's, plus)
//! * **No allocation through our own hooks.** The library's Rust
//!   allocations, the core's included, go to glibc's `__libc_*` directly
//!   ([`real::LibcAlloc`], the `#[global_allocator]`).
//! * **Only the ABI exported.** A version script (`exports.map`) keeps every
//!   symbol but the malloc family local.
//!
//! # Environment
//! * `HEAPPROFD_SOCKET=PATH`: connect to the daemon at start-up.
//! * `HEAPPROFD_BLOCKING_INIT=1`: connect synchronously in the constructor.
//! * `HEAPPROFD_NO_SIGNAL=1`: do not install the activation signal handler.
//!
//! # Modules
//! [`hooks`] (the exported functions) forward to [`real`] (glibc's
//! allocator) around the core's hook paths. `init` (the constructor, the
//! activation signal) registers the core's `Frontend` (`got::GLIBC`).
//! `attach` has the entry points the daemon calls in a running process,
//! `got` the GOT patching when the library was loaded without interposing,
//! `elfdyn` the reading of loaded objects' dynamic sections and `dlhook`
//! the `dlopen` hook.
//!
//! Linking the rlib into a program interposes that program's malloc with
//! these hooks and installs [`real::LibcAlloc`] as its Rust allocator; the
//! rlib exists for the crate's own tests.

mod attach;
mod dlhook;
mod elfdyn;
mod got;
pub mod hooks;
mod init;
pub mod real;

pub use init::ACTIVATION_SIGNAL;

/// The library's own allocations bypass the hooks.
#[cfg(not(test))]
#[global_allocator]
static ALLOC: real::LibcAlloc = real::LibcAlloc;
