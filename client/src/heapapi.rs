//! The exported custom allocator API, source-compatible with Perfetto's
//! `heap_profile.h`: `AHeapInfo_create`, `AHeapInfo_setEnabledCallback`,
//! `AHeapInfo_setDisabledCallback`, `AHeapProfile_registerHeap`,
//! `AHeapProfile_reportAllocation`, `AHeapProfile_reportSample`,
//! `AHeapProfile_reportFree` and
//! `AHeapProfileEnableCallbackInfo_getSamplingInterval`.
//!
//! Thin C shims over `heapprofd_client_core::heaps` (the slots, the
//! samplers, the records). Programs do not link against the library: the
//! public header (`client/include/heapprofd.h`) and the `heapprofd-api`
//! crate look these names up at run time. Nothing here allocates or
//! panics; every pointer argument is checked (a null or foreign heap info
//! gives null or 0). The library's destructor (`atexit`) disables the
//! heaps at exit.

// The C API's names (Perfetto's); in the unit-test build they are not
// exported (`no_mangle` only outside tests) and some are unused.
#![allow(non_snake_case)]
#![cfg_attr(test, allow(dead_code))]

use core::ffi::{c_char, c_void};

use heapprofd_client_core::heaps::{self, DisabledCallback, EnableInfo, EnabledCallback, HeapInfo};

/// `AHeapInfo_create(name)`: a heap called `name` (1 to 63 bytes), not yet
/// registered; null if the name does not fit or 256 heaps exist.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn AHeapInfo_create(name: *const c_char) -> *mut HeapInfo {
    if name.is_null() {
        return core::ptr::null_mut();
    }
    // Bounded scan: a name longer than the field is refused anyway.
    let mut len = 0;
    // SAFETY: the caller passes a NUL-terminated string; we stop at its NUL
    // or one byte past the longest accepted name.
    while len <= heapprofd_proto::wire::MAX_CUSTOM_HEAP_NAME && unsafe { *name.add(len) } != 0 {
        len += 1;
    }
    // SAFETY: `len` bytes were just read.
    let bytes = unsafe { core::slice::from_raw_parts(name.cast::<u8>(), len) };
    heaps::create(bytes)
}

/// `AHeapInfo_setEnabledCallback(info, callback, data)`: `callback(data,
/// info)` runs when a session starts recording the heap. Returns `info`.
///
/// # Safety
/// `callback` may be called with `data` from any thread until exit.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn AHeapInfo_setEnabledCallback(
    info: *mut HeapInfo,
    callback: Option<EnabledCallback>,
    data: *mut c_void,
) -> *mut HeapInfo {
    heaps::set_enabled_callback(info, callback, data)
}

/// `AHeapInfo_setDisabledCallback(info, callback, data)`: `callback(data,
/// info)` runs when the session recording the heap ends (and at exit).
///
/// # Safety
/// As [`AHeapInfo_setEnabledCallback`].
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn AHeapInfo_setDisabledCallback(
    info: *mut HeapInfo,
    callback: Option<DisabledCallback>,
    data: *mut c_void,
) -> *mut HeapInfo {
    heaps::set_disabled_callback(info, callback, data)
}

/// `AHeapProfile_registerHeap(info)`: the heap's id (from 1), 0 if `info`
/// is null or not a heap.
///
/// # Safety
/// None beyond the C signature (the pointer is checked, never trusted).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn AHeapProfile_registerHeap(info: *mut HeapInfo) -> u32 {
    heaps::register(info)
}

/// `AHeapProfile_reportAllocation(heap_id, alloc_id, size)`: true if the
/// allocation was sampled (and recorded).
///
/// # Safety
/// None (ids are checked).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn AHeapProfile_reportAllocation(
    heap_id: u32,
    alloc_id: u64,
    size: u64,
) -> bool {
    heaps::report_allocation(heap_id, alloc_id, size)
}

/// `AHeapProfile_reportSample(heap_id, alloc_id, size)`: records an
/// allocation the program sampled itself, bypassing the heap's sampler;
/// true if recorded.
///
/// # Safety
/// None (ids are checked).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn AHeapProfile_reportSample(heap_id: u32, alloc_id: u64, size: u64) -> bool {
    heaps::report_sample(heap_id, alloc_id, size)
}

/// `AHeapProfile_reportFree(heap_id, alloc_id)`.
///
/// # Safety
/// None (ids are checked).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn AHeapProfile_reportFree(heap_id: u32, alloc_id: u64) {
    heaps::report_free(heap_id, alloc_id)
}

/// `AHeapProfileEnableCallbackInfo_getSamplingInterval(info)`: the heap's
/// interval in the session that enabled it (0 for a null `info`).
///
/// # Safety
/// `info` is null or the pointer an enabled callback was given.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn AHeapProfileEnableCallbackInfo_getSamplingInterval(
    info: *const EnableInfo,
) -> u64 {
    // SAFETY: the caller passes what the callback was given, or null.
    unsafe { info.as_ref() }.map_or(0, |i| i.sampling_interval)
}

/// A name check shared with the tests: what `AHeapInfo_create` accepts.
#[cfg(test)]
fn accepts(name: &core::ffi::CStr) -> bool {
    // SAFETY: a valid C string.
    !unsafe { AHeapInfo_create(name.as_ptr()) }.is_null()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_every_argument() {
        // SAFETY: null and foreign pointers are what is being tested.
        unsafe {
            assert!(AHeapInfo_create(core::ptr::null()).is_null());
            assert_eq!(AHeapProfile_registerHeap(core::ptr::null_mut()), 0);
            let mut x = 0u64;
            let foreign = (&mut x as *mut u64).cast::<HeapInfo>();
            assert_eq!(AHeapProfile_registerHeap(foreign), 0);
            assert!(AHeapInfo_setEnabledCallback(foreign, None, core::ptr::null_mut()).is_null());
            assert_eq!(
                AHeapProfileEnableCallbackInfo_getSamplingInterval(core::ptr::null()),
                0
            );
            assert!(!AHeapProfile_reportAllocation(0, 1, 1));
            assert!(!AHeapProfile_reportAllocation(u32::MAX, 1, 1));
            AHeapProfile_reportFree(7, 1);
        }
        assert!(!accepts(c""));
        let long = std::ffi::CString::new("n".repeat(64)).unwrap();
        assert!(!accepts(&long));
        assert!(accepts(c"pool"));
    }
}
