//! `heapprofd-api`: report a custom allocator's allocations into named
//! heaps of heapprofd-rs (the custom allocator API of Perfetto's
//! `heap_profile.h`, as `client/include/heapprofd.h` has it for C), and
//! label what threads allocate with user contexts ([`Context`]), record
//! the stack a signal handler interrupted ([`request_stack`]), and walk a
//! stack in the process from any signal handler ([`walk`], the
//! stack-request API's in-process walk).
//!
//! ```no_run
//! use heapprofd_api::HeapInfo;
//!
//! // At start-up: create and register the heap (None without the profiler).
//! let heap = HeapInfo::create(c"arena").and_then(HeapInfo::register);
//! // In the allocator: report what it hands out and takes back.
//! if let Some(h) = heap {
//!     h.report_allocation(0x1000, 64);
//!     h.report_free(0x1000);
//! }
//! ```
//!
//! Programs link nothing of heapprofd-rs: the functions are looked up in
//! `libheapprofd_client.so` at run time with `dlsym(RTLD_DEFAULT, ...)`
//! the first time [`HeapInfo::create`] (or [`client_loaded`]) runs; the
//! crate does not depend on the client. Without the client (not
//! preloaded) `create` returns `None` and every call is a no-op.
//!
//! The reporting calls ([`Heap::report_allocation`],
//! [`Heap::report_sample`], [`Heap::report_free`]) never look anything up
//! and never allocate: one atomic load and a branch, then the client's
//! work (a load of the session state when no profile records the heap).
//! They may be called from a `GlobalAlloc`, from any thread and from
//! signal handlers. Resolution itself runs `dlsym`, which may allocate:
//! call `create` at start-up, outside the allocator (a `GlobalAlloc`
//! wrapper that reports only once its heap is registered, as in the
//! example program `tests/src/bin/heapprofd-test-rust-heap.rs`).
//!
//! Semantics (the client's, see README "Custom heaps"): names of 1 to 63
//! bytes, at most 256 heaps per process, ids from 1; each heap has its own
//! sampler with the interval `record --heaps` / `--heap-interval` gives it;
//! the enabled callback runs when a profile starts recording the heap, the
//! disabled one when it ends and at exit.

use core::ffi::{CStr, c_char, c_void};
use core::num::NonZeroU32;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

mod context;
mod stack;
pub use context::{Context, ContextGuard, MAX_PAIRS};
pub use stack::{register_event, request_stack};
pub mod walk;

/// What an enabled callback is given (`AHeapProfileEnableCallbackInfo`):
/// pass it to [`sampling_interval`].
#[repr(C)]
#[derive(Debug)]
pub struct EnableInfo {
    _opaque: [u8; 0],
}

/// What a disabled callback is given (`AHeapProfileDisableCallbackInfo`).
#[repr(C)]
#[derive(Debug)]
pub struct DisableInfo {
    _opaque: [u8; 0],
}

/// `void (*)(void *data, const AHeapProfileEnableCallbackInfo *)`.
pub type EnabledCallback = unsafe extern "C" fn(data: *mut c_void, info: *const EnableInfo);
/// `void (*)(void *data, const AHeapProfileDisableCallbackInfo *)`.
pub type DisabledCallback = unsafe extern "C" fn(data: *mut c_void, info: *const DisableInfo);

type CreateFn = unsafe extern "C" fn(*const c_char) -> *mut c_void;
type SetEnabledFn =
    unsafe extern "C" fn(*mut c_void, Option<EnabledCallback>, *mut c_void) -> *mut c_void;
type SetDisabledFn =
    unsafe extern "C" fn(*mut c_void, Option<DisabledCallback>, *mut c_void) -> *mut c_void;
type RegisterFn = unsafe extern "C" fn(*mut c_void) -> u32;
type ReportFn = unsafe extern "C" fn(u32, u64, u64) -> bool;
type FreeFn = unsafe extern "C" fn(u32, u64);
type IntervalFn = unsafe extern "C" fn(*const EnableInfo) -> u64;

/// The client's functions, by their exported names, in [`Slot`] order.
const NAMES: [&CStr; 15] = [
    c"AHeapInfo_create",
    c"AHeapInfo_setEnabledCallback",
    c"AHeapInfo_setDisabledCallback",
    c"AHeapProfile_registerHeap",
    c"AHeapProfile_reportAllocation",
    c"AHeapProfile_reportSample",
    c"AHeapProfile_reportFree",
    c"AHeapProfileEnableCallbackInfo_getSamplingInterval",
    c"heapprofd_context_create",
    c"heapprofd_context_activate",
    c"heapprofd_context_deactivate",
    c"heapprofd_context_current",
    c"heapprofd_context_release",
    c"heapprofd_request_stack",
    c"heapprofd_register_event",
];

#[derive(Clone, Copy)]
pub(crate) enum Slot {
    Create,
    SetEnabled,
    SetDisabled,
    Register,
    ReportAllocation,
    ReportSample,
    ReportFree,
    Interval,
    ContextCreate,
    ContextActivate,
    ContextDeactivate,
    ContextCurrent,
    ContextRelease,
    RequestStack,
    RegisterEvent,
}

static FNS: [AtomicPtr<c_void>; 15] = [const { AtomicPtr::new(core::ptr::null_mut()) }; 15];
/// Whether the functions have been looked up (no lookup is started).
#[inline(always)]
pub(crate) fn resolved() -> bool {
    STATE.load(Ordering::Acquire) == 2
}

/// 0 not looked up, 1 looking up, 2 done.
static STATE: AtomicU8 = AtomicU8::new(0);

/// Looks the functions up once; false while another call is doing it.
pub(crate) fn resolve() -> bool {
    match STATE.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(s) => return s == 2,
    }
    for (slot, name) in FNS.iter().zip(NAMES) {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        slot.store(p, Ordering::Relaxed);
    }
    STATE.store(2, Ordering::Release);
    true
}

#[inline(always)]
pub(crate) fn get(slot: Slot) -> *mut c_void {
    FNS[slot as usize].load(Ordering::Acquire)
}

/// Whether the client library is loaded (looks the functions up first).
pub fn client_loaded() -> bool {
    resolve() && !get(Slot::Create).is_null()
}

/// A heap created but not registered yet (`AHeapInfo *`).
#[derive(Debug)]
pub struct HeapInfo(NonNull<c_void>);

impl HeapInfo {
    /// `AHeapInfo_create`: a heap called `name` (1 to 63 bytes). `None`
    /// without the client, for a name that does not fit, or beyond 256
    /// heaps.
    pub fn create(name: &CStr) -> Option<HeapInfo> {
        if !resolve() {
            return None;
        }
        let f = get(Slot::Create);
        if f.is_null() {
            return None;
        }
        // SAFETY: the client's AHeapInfo_create, called with a C string.
        let p = unsafe { core::mem::transmute::<*mut c_void, CreateFn>(f)(name.as_ptr()) };
        NonNull::new(p).map(HeapInfo)
    }

    /// `AHeapInfo_setEnabledCallback`: `callback(data, info)` runs when a
    /// profile starts recording the heap.
    ///
    /// # Safety
    /// `callback` may be called with `data` from any thread until the
    /// process exits.
    pub unsafe fn on_enabled(self, callback: EnabledCallback, data: *mut c_void) -> HeapInfo {
        let f = get(Slot::SetEnabled);
        if !f.is_null() {
            // SAFETY: the client's function, with its own heap info.
            unsafe {
                core::mem::transmute::<*mut c_void, SetEnabledFn>(f)(
                    self.0.as_ptr(),
                    Some(callback),
                    data,
                )
            };
        }
        self
    }

    /// `AHeapInfo_setDisabledCallback`: `callback(data, info)` runs when
    /// that profile ends, and at exit.
    ///
    /// # Safety
    /// As [`HeapInfo::on_enabled`].
    pub unsafe fn on_disabled(self, callback: DisabledCallback, data: *mut c_void) -> HeapInfo {
        let f = get(Slot::SetDisabled);
        if !f.is_null() {
            // SAFETY: as above.
            unsafe {
                core::mem::transmute::<*mut c_void, SetDisabledFn>(f)(
                    self.0.as_ptr(),
                    Some(callback),
                    data,
                )
            };
        }
        self
    }

    /// `AHeapProfile_registerHeap`: the heap, ready to report into.
    pub fn register(self) -> Option<Heap> {
        let f = get(Slot::Register);
        if f.is_null() {
            return None;
        }
        // SAFETY: the client's function, with its own heap info.
        let id = unsafe { core::mem::transmute::<*mut c_void, RegisterFn>(f)(self.0.as_ptr()) };
        Heap::from_id(id)
    }
}

/// A registered heap (its id, from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Heap(NonZeroU32);

impl Heap {
    /// The heap with this id (from [`Heap::id`]); `None` for 0.
    pub const fn from_id(id: u32) -> Option<Heap> {
        match NonZeroU32::new(id) {
            Some(n) => Some(Heap(n)),
            None => None,
        }
    }

    /// The heap's id (the C API's `heap_id`).
    pub const fn id(self) -> u32 {
        self.0.get()
    }

    /// `AHeapProfile_reportAllocation`: an allocation `alloc_id` of `size`
    /// bytes, sampled at the heap's interval; true if it was recorded.
    ///
    /// Not inlined (one call): its frame keeps its `heapprofd_api::` name,
    /// which `report` skips as allocator plumbing.
    #[inline(never)]
    pub fn report_allocation(self, alloc_id: u64, size: u64) -> bool {
        let f = get(Slot::ReportAllocation);
        // SAFETY: the client's function (ids are checked there).
        !f.is_null()
            && unsafe {
                core::mem::transmute::<*mut c_void, ReportFn>(f)(self.id(), alloc_id, size)
            }
    }

    /// `AHeapProfile_reportSample`: an allocation the program sampled
    /// itself, recorded as standing for `size` bytes; true if recorded.
    #[inline(never)]
    pub fn report_sample(self, alloc_id: u64, size: u64) -> bool {
        let f = get(Slot::ReportSample);
        // SAFETY: as above.
        !f.is_null()
            && unsafe {
                core::mem::transmute::<*mut c_void, ReportFn>(f)(self.id(), alloc_id, size)
            }
    }

    /// `AHeapProfile_reportFree`: the allocation `alloc_id` is gone.
    #[inline]
    pub fn report_free(self, alloc_id: u64) {
        let f = get(Slot::ReportFree);
        if !f.is_null() {
            // SAFETY: as above.
            unsafe { core::mem::transmute::<*mut c_void, FreeFn>(f)(self.id(), alloc_id) };
        }
    }
}

/// `AHeapProfileEnableCallbackInfo_getSamplingInterval`: the heap's
/// interval, from inside an enabled callback.
///
/// # Safety
/// `info` is what the enabled callback was given.
pub unsafe fn sampling_interval(info: *const EnableInfo) -> u64 {
    let f = get(Slot::Interval);
    if f.is_null() {
        return 0;
    }
    // SAFETY: the client's function, with the callback's info.
    unsafe { core::mem::transmute::<*mut c_void, IntervalFn>(f)(info) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo test` does not preload the client: everything is a no-op.
    #[test]
    fn without_the_client_everything_is_a_no_op() {
        assert!(!client_loaded());
        assert!(HeapInfo::create(c"pool").is_none());
        assert!(Heap::from_id(0).is_none());
        let h = Heap::from_id(3).expect("3 is an id");
        assert_eq!(h.id(), 3);
        assert!(!h.report_allocation(1, 1));
        assert!(!h.report_sample(1, 1));
        h.report_free(1);
        // SAFETY: a null info is allowed when no client is there.
        assert_eq!(unsafe { sampling_interval(core::ptr::null()) }, 0);
    }
}
