//! The exported stack-request API: `heapprofd_request_stack` (record the
//! stack of a handler's interrupted context, async-signal-safe) and
//! `heapprofd_register_event` (name a tag once).
//!
//! Thin C shims over `heapprofd_client_core::stacksample` and
//! `heapprofd_client_core::events`. Programs do not link against the
//! library: `client/include/heapprofd.h` and the `heapprofd-api` crate look
//! these names up at run time. Nothing here allocates or panics.

#![cfg_attr(test, allow(dead_code))]

use core::ffi::{c_char, c_int, c_void};

use heapprofd_client_core::{events, stacksample};

/// `heapprofd_request_stack(ucontext, tag)`: records the stack of the
/// interrupted context `ucontext` (a handler's third argument; NULL: the
/// caller's own stack, flagged biased) as one sample of `tag`. 0 recorded,
/// negative not recorded. Async-signal-safe; errno preserved.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn heapprofd_request_stack(ucontext: *const c_void, tag: u64) -> c_int {
    let kind = stacksample::SampleKind {
        tag,
        period: 0,
        lost_overrun: 0,
    };
    stacksample::record_stack(ucontext, kind)
}

/// `heapprofd_register_event(tag, name)`: names `tag` (not 0, which is CPU
/// time) for the trace; 0 on success, negative for a bad name, a tag named
/// otherwise, or more than 64 names.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn heapprofd_register_event(tag: u64, name: *const c_char) -> c_int {
    if name.is_null() {
        return events::INVALID;
    }
    // SAFETY: the caller's contract.
    let bytes = unsafe { core::ffi::CStr::from_ptr(name) }.to_bytes();
    events::register_event(tag, bytes)
}
