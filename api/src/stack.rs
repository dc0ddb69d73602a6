//! The stack-request API: [`request_stack`] records the stack a signal
//! handler interrupted as one sample of a named event ([`register_event`]),
//! written to the trace as a `PerfSample` and listed by `report --cpu`.
//!
//! ```no_run
//! use core::ffi::c_void;
//!
//! // Outside handlers, once: names the tag and looks the client up.
//! let _ = heapprofd_api::register_event(7, c"prof-ticks");
//! // In a SA_SIGINFO handler `fn(sig, info, ucontext)`:
//! extern "C" fn on_prof(_: i32, _: *mut libc::siginfo_t, uc: *mut c_void) {
//!     // SAFETY: the ucontext this handler was given.
//!     unsafe { heapprofd_api::request_stack(uc, 7) };
//! }
//! ```

use core::ffi::{CStr, c_char, c_int, c_void};

use crate::{Slot, get, resolve, resolved};

type RequestFn = unsafe extern "C" fn(*const c_void, u64) -> c_int;
type RegisterFn = unsafe extern "C" fn(u64, *const c_char) -> c_int;

/// Names `tag` (not 0, which is CPU time) for the trace. Call it outside
/// signal handlers, before the first [`request_stack`]: it also looks the
/// client's functions up. `Err` with the client's negative code for a bad
/// name (1 to 63 bytes, no comma), a tag already named otherwise, more
/// than 64 names, or -1 without the client.
pub fn register_event(tag: u64, name: &CStr) -> Result<(), i32> {
    if !resolve() {
        return Err(-1);
    }
    let f = get(Slot::RegisterEvent);
    if f.is_null() {
        return Err(-1);
    }
    // SAFETY: the client's `heapprofd_register_event`, with this signature.
    let f: RegisterFn = unsafe { core::mem::transmute::<*mut c_void, RegisterFn>(f) };
    // SAFETY: a NUL-terminated name.
    match unsafe { f(tag, name.as_ptr()) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Records the stack of the context a signal handler interrupted
/// (`ucontext`, the handler's third argument; null: the caller's own stack,
/// flagged biased) as one sample of `tag`. Async-signal-safe, errno
/// preserved; never looks anything up (a call before [`register_event`] or
/// [`crate::client_loaded`] returns -1). 0 recorded; negative not
/// recorded (no profile, the thread was inside the client, the buffer was
/// full: the last two are counted as lost samples of the thread).
///
/// # Safety
/// `ucontext` is null or the `ucontext_t` the kernel passed to the
/// calling signal handler.
#[inline]
pub unsafe fn request_stack(ucontext: *const c_void, tag: u64) -> i32 {
    if !resolved() {
        return -1;
    }
    let f = get(Slot::RequestStack);
    if f.is_null() {
        return -1;
    }
    // SAFETY: the client's `heapprofd_request_stack`, with this signature.
    let f: RequestFn = unsafe { core::mem::transmute::<*mut c_void, RequestFn>(f) };
    // SAFETY: the caller's contract is the client's.
    unsafe { f(ucontext, tag) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_client_every_call_is_a_no_op() {
        assert_eq!(register_event(7, c"prof-ticks"), Err(-1));
        // SAFETY: a null ucontext is always allowed.
        assert_eq!(unsafe { request_stack(core::ptr::null(), 7) }, -1);
    }
}
