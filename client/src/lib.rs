//! heapprofd-rs client library: `libheapprofd_client.so`, the glibc
//! front-end of `heapprofd-client-core`.
//!
//! Loaded into a program with `LD_PRELOAD` (or later, by an attach), it
//! exports the glibc malloc family, C++ `operator new`/`delete` and
//! nothing else. Sampling, stack capture, the session and its ring
//! buffer, the connection to the daemon live in the core; this crate is
//! what is glibc-specific: the hooks and the allocator they forward to
//! (whatever would serve the program without the client: glibc, jemalloc,
//! tcmalloc, mimalloc...), how the hooks are reached (interposition, or
//! GOT patching when the library was loaded without interposing), the
//! attach entry points and the constructor.
//!
//! # Design constraints (the core's, plus)
//! * **No allocation through our own hooks.** The library's Rust
//!   allocations, the core's included, go to glibc's `__libc_*` directly
//!   ([`ownalloc::LibcAlloc`], the `#[global_allocator]`).
//! * **Only the ABI exported.** A version script (`exports.map`) keeps every
//!   symbol but the hooks and the public APIs (custom heaps, user contexts,
//!   the in-process stack walk) local.
//!
//! # Environment
//! * `HEAPPROFD_SOCKET=PATH`: connect to the daemon at start-up.
//! * `HEAPPROFD_BLOCKING_INIT=1`: connect synchronously in the constructor.
//! * `HEAPPROFD_NO_SIGNAL=1`: do not install the activation signal handler.
//!
//! # Modules
//! [`hooks`] and `cxxhooks` (the exported functions, each with its `hook`
//! record) forward to the records' originals (`originals`: the first
//! definition in load order, found with `dynsym` and `elfdyn`) around the
//! core's hook paths. `init` (the
//! constructor, the activation signal) registers `patching` (the core's
//! `Frontend`: what a session does before it connects and after it ends)
//! with the core. A library that does not interpose (`interpose`) patches
//! GOTs: `hooktable` (every hooked function), `got` (the patch and restore
//! passes, and the allocator's own slots), `protections` (page
//! protections, the store into a RELRO slot),
//! `elfdyn` (reading loaded objects' dynamic sections), `newobjects` and
//! `dlhook` (objects loaded later, the `dlopen` hook, exported too: it
//! also rebuilds the walk's tables; `dlcaller` says which calls it may
//! make itself); `dlclosehook`
//! (objects unloaded: the daemon catches up first). `attach` has the
//! entry points the daemon calls in a running process. `heapapi` exports
//! the custom allocator API (Perfetto's `AHeapInfo_*` / `AHeapProfile_*`)
//! over the core's `heaps`. `walkstack` exports the stack-request API's
//! in-process walk (`heapprofd_walk_stack`, `heapprofd_walk_prepare`)
//! over `walktables` (framehop over the loaded objects' own `.eh_frame`):
//! the only unwinding the client does.
//!
//! Linking the rlib into a program interposes that program's malloc with
//! these hooks and installs [`ownalloc::LibcAlloc`] as its Rust allocator; the
//! rlib exists for the crate's own tests.

#[macro_use]
mod asm_export;
mod atexit;
mod attach;
mod build_tag;
mod contextapi;
mod cxxhooks;
mod dlcaller;
mod dlclosehook;
mod dlhook;
mod dynsym;
mod elfdyn;
mod exechooks;
mod got;
mod heapapi;
mod hook;
pub mod hooks;
mod hooktable;
mod inherit;
mod init;
mod interpose;
mod newobjects;
mod originals;
pub mod ownalloc;
mod patching;
mod perfmap;
mod protections;
mod stackapi;
mod threadhook;
mod unprofilable;
mod walkstack;
mod walktables;

pub use init::ACTIVATION_SIGNAL;

/// The library's own allocations bypass the hooks.
#[cfg(not(test))]
#[global_allocator]
static ALLOC: ownalloc::LibcAlloc = ownalloc::LibcAlloc;
