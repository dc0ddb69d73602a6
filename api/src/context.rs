//! User contexts for Rust programs: [`Context`] (the client's
//! `heapprofd_context_*`, looked up with the heap API's functions).
//!
//! ```no_run
//! use heapprofd_api::Context;
//!
//! // Per request: a context (None without the profiler), installed while
//! // the request is handled; a worker thread installs the same one.
//! let ctx = Context::create(None, &[(c"endpoint", c"/a")]);
//! if let Some(c) = ctx {
//!     let _installed = c.activate();
//!     // ... allocations here carry endpoint=/a ...
//! }
//! ```

use core::ffi::{CStr, c_char, c_void};
use core::marker::PhantomData;
use core::num::NonZeroU64;

use crate::{Slot, get, resolve};

type CreateFn = unsafe extern "C" fn(u64, *const *const c_char, *const *const c_char, usize) -> u64;
type ActivateFn = unsafe extern "C" fn(u64) -> u64;
type DeactivateFn = unsafe extern "C" fn(u64);
type CurrentFn = unsafe extern "C" fn() -> u64;
type ReleaseFn = unsafe extern "C" fn(u64);

/// Most pairs a context holds (the client's bound).
pub const MAX_PAIRS: usize = 32;

/// An immutable map of string keys to string values, by its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Context(NonZeroU64);

impl Context {
    /// `heapprofd_context_create`: a context with `pairs`, extending
    /// `parent` (`None`: the calling thread's current context). `None`
    /// without the client or for more than [`MAX_PAIRS`] pairs. Looks the
    /// client up on first use (`dlsym`, which may allocate).
    pub fn create(parent: Option<Context>, pairs: &[(&CStr, &CStr)]) -> Option<Context> {
        if pairs.len() > MAX_PAIRS || !resolve() {
            return None;
        }
        let f = get(Slot::ContextCreate);
        if f.is_null() {
            return None;
        }
        let mut keys = [core::ptr::null::<c_char>(); MAX_PAIRS];
        let mut values = [core::ptr::null::<c_char>(); MAX_PAIRS];
        for (i, (k, v)) in pairs.iter().enumerate() {
            keys[i] = k.as_ptr();
            values[i] = v.as_ptr();
        }
        let parent = parent.map_or(0, Context::id);
        // SAFETY: the client's function with `pairs.len()` C strings each.
        let id = unsafe {
            core::mem::transmute::<*mut c_void, CreateFn>(f)(
                parent,
                keys.as_ptr(),
                values.as_ptr(),
                pairs.len(),
            )
        };
        Context::from_id(id)
    }

    /// The context with this id (from [`Context::id`], or another
    /// thread); `None` for 0.
    pub const fn from_id(id: u64) -> Option<Context> {
        match NonZeroU64::new(id) {
            Some(n) => Some(Context(n)),
            None => None,
        }
    }

    /// The id (the C API's).
    pub const fn id(self) -> u64 {
        self.0.get()
    }

    /// `heapprofd_context_current`: the calling thread's context, to hand
    /// to another thread or task.
    #[inline]
    pub fn current() -> Option<Context> {
        let f = get(Slot::ContextCurrent);
        if f.is_null() {
            return None;
        }
        // SAFETY: the client's function.
        Context::from_id(unsafe { core::mem::transmute::<*mut c_void, CurrentFn>(f)() })
    }

    /// `heapprofd_context_activate`: installs the context on the calling
    /// thread until the guard is dropped (then what was installed before
    /// is back).
    #[inline]
    pub fn activate(self) -> ContextGuard {
        let f = get(Slot::ContextActivate);
        let token = if f.is_null() {
            0
        } else {
            // SAFETY: the client's function.
            unsafe { core::mem::transmute::<*mut c_void, ActivateFn>(f)(self.id()) }
        };
        ContextGuard {
            token,
            _not_send: PhantomData,
        }
    }

    /// `heapprofd_context_release`: the context is not installed again.
    pub fn release(self) {
        let f = get(Slot::ContextRelease);
        if !f.is_null() {
            // SAFETY: the client's function.
            unsafe { core::mem::transmute::<*mut c_void, ReleaseFn>(f)(self.id()) };
        }
    }
}

/// A context installed on this thread (see [`Context::activate`]); dropping
/// it deactivates it. Tied to its thread.
#[derive(Debug)]
#[must_use = "the context is deactivated when the guard is dropped"]
pub struct ContextGuard {
    token: u64,
    _not_send: PhantomData<*const ()>,
}

impl Drop for ContextGuard {
    #[inline]
    fn drop(&mut self) {
        let f = get(Slot::ContextDeactivate);
        if !f.is_null() {
            // SAFETY: the client's function, with the token it gave.
            unsafe { core::mem::transmute::<*mut c_void, DeactivateFn>(f)(self.token) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo test` does not preload the client: everything is a no-op.
    #[test]
    fn without_the_client_contexts_are_none() {
        assert!(Context::create(None, &[(c"endpoint", c"/a")]).is_none());
        assert!(Context::current().is_none());
        let c = Context::from_id(4097).expect("non-zero");
        assert_eq!(c.id(), 4097);
        drop(c.activate());
        c.release();
        assert!(Context::from_id(0).is_none());
    }
}
