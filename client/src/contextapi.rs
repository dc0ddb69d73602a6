//! The exported user context API: `heapprofd_context_create`,
//! `heapprofd_context_activate`, `heapprofd_context_deactivate`,
//! `heapprofd_context_current` and `heapprofd_context_release`.
//!
//! Thin C shims over `heapprofd_client_core::contexts` (the table, the
//! thread's word, the filters). Programs do not link against the library:
//! `client/include/heapprofd.h` and the `heapprofd-api` crate look these
//! names up at run time. Nothing here allocates or panics.

#![cfg_attr(test, allow(dead_code))]

use core::ffi::c_char;

use heapprofd_client_core::contexts;

/// `heapprofd_context_create(parent, keys, values, n)`: the id of a new
/// immutable context mapping `keys[i]` to `values[i]`, extending `parent`
/// (0: the calling thread's current context).
///
/// # Safety
/// `keys` and `values` point to `n` NUL-terminated strings each.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn heapprofd_context_create(
    parent: u64,
    keys: *const *const c_char,
    values: *const *const c_char,
    n: usize,
) -> u64 {
    // SAFETY: the caller's contract is the core's.
    unsafe { contexts::create(parent, keys, values, n) }
}

/// `heapprofd_context_activate(id)`: installs `id` on the calling thread;
/// returns the token that restores what was installed.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn heapprofd_context_activate(id: u64) -> u64 {
    contexts::activate(id)
}

/// `heapprofd_context_deactivate(token)`: restores the context `token`
/// saved.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn heapprofd_context_deactivate(token: u64) {
    contexts::deactivate(token)
}

/// `heapprofd_context_current()`: the calling thread's context (0: none).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn heapprofd_context_current() -> u64 {
    contexts::current()
}

/// `heapprofd_context_release(id)`: the context will not be installed
/// again; its id is never reused.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn heapprofd_context_release(id: u64) {
    contexts::release(id)
}
