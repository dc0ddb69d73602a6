//! The bionic front-end of the heapprofd-rs client (`libheapprofd_bionic.so`,
//! installed on a device as `heapprofd_client.so`): the client core
//! (`heapprofd-client-core`) behind the hook ABI bionic's libc looks up
//! when it loads heapprofd (`malloc_common_dynamic.cpp`: `dlopen` with
//! `RTLD_NOW | RTLD_LOCAL`, then `dlsym` of `heapprofd_<name>` for every
//! name; one missing and the library is refused).
//!
//! * [`control`]: `heapprofd_initialize` (a session per call; the table to
//!   forward to), `heapprofd_finalize`, the four leak-info functions;
//! * [`hooks`]: the dispatch entries (`heapprofd_malloc`, `_free`, ...),
//!   the core's `hookpath` around a call through that table;
//! * [`dispatch`]: `MallocDispatch`, its layout pinned against the AOSP
//!   header;
//! * [`ownalloc`]: the library's own allocator (the same table).
//!
//! The library exports those names and nothing else (`exports.map`). It
//! builds for Linux, where an emulated bionic loader tests it
//! (`tests/tests/bionic_e2e.rs`), and for Android (type-checked only: no
//! NDK linker here).

pub mod control;
pub mod dispatch;
pub mod hooks;
pub mod ownalloc;

/// The library's own allocations go straight to bionic's table.
#[cfg(not(test))]
#[global_allocator]
static ALLOC: ownalloc::DispatchAlloc = ownalloc::DispatchAlloc;
