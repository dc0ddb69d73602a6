//! Android-only parts of heapprofd-rs. **Nothing is implemented yet**; this
//! crate is a documented placeholder so the workspace layout is final.
//!
//! What will live here (each behind `cfg(target_os = "android")` or as
//! host-side tools), and nowhere else in the workspace:
//!
//! * startup profiling triggered by system properties (`heapprofd.enable`,
//!   `heapprofd.enable.<process name>`), the way Android's heapprofd does;
//! * the bionic malloc-dispatch hook ABI (`libc.debug.hooks`-style
//!   `malloc_dispatch` tables) instead of glibc `LD_PRELOAD` interposition;
//! * the adb-driven host workflow (push the daemon, start profiling by
//!   package or pid, pull and symbolize the trace).
//!
//! Architecture invariant: only this crate knows about bionic and system
//! properties; the client, shmem, proto and daemon crates stay portable.
