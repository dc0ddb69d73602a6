//! heapprofd-rs client core (`heapprofd-client-core`): everything the
//! client does inside the profiled process that does not depend on how its
//! hooks are reached or which allocator they forward to.
//!
//! A front-end links this rlib into the library that gets loaded: the glibc
//! interposer in `client/` (`libheapprofd_client.so`: `LD_PRELOAD`, GOT
//! patching, attach), later the bionic one in `android/`. The core exports
//! no symbol of its own; the front-end decides what the library exports.
//! The core reaches its front-end only through [`frontend::Frontend`],
//! registered once by the front-end's constructor; the front-end also
//! provides the real allocator (its hooks forward to it, and its
//! `#[global_allocator]` calls it directly, so the core's own allocations
//! never enter the hooks).
//!
//! # Design constraints
//! * **Never the reason the program crashes or hangs.** No panics on hook
//!   paths (`panic = "abort"` is only the last line of defence), no locks
//!   the program could hold, bounded waits, teardown to pass-through on any
//!   failure.
//! * **No allocation through the hooks.** glibc code that allocates on our
//!   behalf (`pthread_getattr_np`, `pthread_create`, `dlsym`) runs under
//!   the reentrancy guard ([`tls::Guard`]), which makes nested hooks pass
//!   straight through.
//! * **No global-dynamic TLS.** Per-thread state lives in one 88-byte
//!   initial-exec TLS block (see [`tls`]); nothing from std that uses
//!   `thread_local!` (`std::thread`, `std::env`) is used.
//! * **Invisible when idle.** Dormant hooks cost one load and one branch.
//!
//! # Modules
//! A front-end's hooks call [`hookpath`] (the checks and slow paths) →
//! [`sampler`] (the decision) → [`session`] (ring writing, teardown) →
//! [`capture`] (registers, stack bounds), [`stackreuse`] (sending only
//! the part of a stack that changed) and [`freeset`] (live sampled
//! addresses). [`state`] holds the hooks' switch and the connection state
//! machine; [`activation`] (a signal's request, started by the next
//! allocation), [`watcher`] (the connecting and watching thread),
//! [`connect`] (the handshake), [`socket_path`] and [`trigger`] (a
//! service's startup-trigger store) start sessions; [`fork`]
//! is the atfork child handler. [`heaps`] is the custom allocator API's
//! state (Perfetto's `AHeapInfo_*` / `AHeapProfile_*`: named heaps with
//! their own samplers, reported into the session like sampled mallocs);
//! [`contexts`] the user contexts (`heapprofd_context_*`: the table of
//! immutable key/value maps, the thread's installed one, the filters).
//! [`walkbounds`] is the memory a front-end's in-process stack walk may
//! read (the walked stack, from its stack pointer up). [`tls`] (per-thread state, the guard),
//! [`procmaps`] (raw `/proc/self/maps` reading), [`env`], [`errno`] and
//! [`log`] are the allocation-free plumbing; [`logarithm`] spares the library
//! a libm dependency.

pub mod activation;
pub mod adaptive;
pub mod capture;
pub mod connect;
pub mod contexts;
pub mod cputimer;
pub mod env;
pub mod errno;
pub mod events;
pub mod fork;
pub mod freeset;
pub mod frontend;
pub mod heaps;
pub mod hookpath;
pub mod log;
pub mod logarithm;
pub mod mapsask;
pub mod perfevent;
pub mod procmaps;
pub mod sampler;
pub mod session;
pub mod socket_path;
pub mod stackreuse;
pub mod stacksample;
pub mod state;
pub mod thinning;
pub mod threadslots;
pub mod tls;
pub mod trigger;
pub mod unload;
pub mod walkbounds;
pub mod watcher;
