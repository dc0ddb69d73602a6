//! The exported malloc family: thin shims around the originals (the
//! program's allocator: glibc's, or jemalloc's, tcmalloc's... see
//! `originals`), and their hook records.
//!
//! Every hook starts with one relaxed load of the mode and one branch
//! (`heapprofd_client_core::hookpath`, which also has the slow paths the
//! glibc and any other front-end share). While the library is dormant (or
//! between sessions) that branch is always taken and the hook tail-calls
//! the original (one load of its address from the record). While a
//! session is active, an unsampled allocation still tail-calls the
//! original after the sampler's subtraction and compare; only a sampled
//! one calls it and then records; a free does one load from the free set
//! before it tail-calls the original. Each function forwards to its own
//! original with the caller's arguments (`posix_memalign` to the
//! allocator's `posix_memalign`...): the checks and errors are the
//! allocator's. The exception is `reallocarray`, which is the allocator's
//! `realloc` with an overflow check (as glibc's is).
//!
//! Each hook's [`Hook`] record (name, original, the hook) sits next to it;
//! `hooktable` lists them for GOT patching.
//!
//! The hooks never panic: no indexing, no unwrap, no overflowing arithmetic
//! on these paths. `#[cfg_attr(not(test), no_mangle)]` keeps the unit-test
//! binary's own malloc uninterposed.

use core::ffi::c_void;

use heapprofd_client_core::errno;
use heapprofd_client_core::hookpath::{may_be_sampled, mode, on_alloc, on_free, resample, skip};

use crate::hook::{Hook, Kind};
use crate::originals;

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type AlignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> i32;
type UsableSizeFn = unsafe extern "C" fn(*mut c_void) -> usize;

/// The record of [`malloc`].
pub(crate) static MALLOC: Hook = Hook::new(c"malloc", malloc as *const (), Kind::Family);

/// `malloc(3)`.
///
/// # Safety
/// Same contract as glibc's `malloc`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let m = mode();
    if m == 0 || skip(size, m) {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { originals::real::<MallocFn>(&MALLOC)(size) };
    }
    malloc_slow(size, m)
}

#[cold]
#[inline(never)]
fn malloc_slow(size: usize, m: u64) -> *mut c_void {
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { originals::real::<MallocFn>(&MALLOC)(size) };
    on_alloc(p, size, m);
    p
}

/// The record of [`free`].
pub(crate) static FREE: Hook = Hook::new(c"free", free as *const (), Kind::Family);

/// `free(3)`.
///
/// # Safety
/// Same contract as glibc's `free`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if may_be_sampled(p) {
        // SAFETY: same contract.
        return unsafe { free_slow(p) };
    }
    // SAFETY: forwarding with the caller's arguments.
    unsafe { originals::real::<FreeFn>(&FREE)(p) }
}

#[cold]
#[inline(never)]
unsafe fn free_slow(p: *mut c_void) {
    on_free(p);
    // SAFETY: forwarding with the caller's arguments.
    unsafe { originals::real::<FreeFn>(&FREE)(p) }
}

/// The record of [`calloc`].
pub(crate) static CALLOC: Hook = Hook::new(c"calloc", calloc as *const (), Kind::Family);

/// `calloc(3)`.
///
/// # Safety
/// Same contract as glibc's `calloc`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let m = mode();
    // A successful calloc checked n * size for overflow; a failed one is
    // not sampled, so the wrapped product does not matter.
    let total = n.wrapping_mul(size);
    if m == 0 || skip(total, m) {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { originals::real::<CallocFn>(&CALLOC)(n, size) };
    }
    calloc_slow(n, size, m)
}

#[cold]
#[inline(never)]
fn calloc_slow(n: usize, size: usize, m: u64) -> *mut c_void {
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { originals::real::<CallocFn>(&CALLOC)(n, size) };
    on_alloc(p, n.wrapping_mul(size), m);
    p
}

/// The record of [`realloc`].
pub(crate) static REALLOC: Hook = Hook::new(c"realloc", realloc as *const (), Kind::Family);

/// `realloc(3)`.
///
/// # Safety
/// Same contract as glibc's `realloc`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn realloc(old: *mut c_void, size: usize) -> *mut c_void {
    let m = mode();
    if m == 0 {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { originals::real::<ReallocFn>(&REALLOC)(old, size) };
    }
    let old_maybe_sampled = may_be_sampled(old);
    if !old_maybe_sampled && skip(size, m) {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { originals::real::<ReallocFn>(&REALLOC)(old, size) };
    }
    // SAFETY: same contract.
    unsafe {
        realloc_slow(old, size, m, old_maybe_sampled, || {
            originals::real::<ReallocFn>(&REALLOC)(old, size)
        })
    }
}

/// The sampled path of a realloc: the old block's free first (before the
/// allocator can hand the address out again), then `call`, then the new
/// block.
#[cold]
#[inline(never)]
unsafe fn realloc_slow(
    old: *mut c_void,
    size: usize,
    m: u64,
    old_maybe_sampled: bool,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    let was_sampled = old_maybe_sampled && on_free(old);
    let p = call();
    if p.is_null() {
        if was_sampled && size != 0 {
            // The old block survives a failed realloc, but its free was
            // already sent: record it again so the daemon keeps counting it.
            // SAFETY: `old` is still a live block.
            let usable = unsafe { malloc_usable_size(old) };
            resample(old, usable, m);
        }
        return p;
    }
    if !skip(size, m) {
        on_alloc(p, size, m);
    }
    p
}

/// The record of [`reallocarray`].
pub(crate) static REALLOCARRAY: Hook =
    Hook::new(c"reallocarray", reallocarray as *const (), Kind::Family);

/// `reallocarray(3)`: realloc of `n * size` bytes, `ENOMEM` if the product
/// overflows. Built on the allocator's `realloc`, as glibc builds its own:
/// glibc's `reallocarray` calls `realloc` through libc's PLT, which would
/// land in [`realloc`] and record the call twice.
///
/// # Safety
/// Same contract as glibc's `reallocarray`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn reallocarray(old: *mut c_void, n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        errno::set(libc::ENOMEM);
        return core::ptr::null_mut();
    };
    // SAFETY: same contract as realloc.
    unsafe { realloc(old, total) }
}

/// An aligned allocation through `rec`'s original (`memalign`,
/// `aligned_alloc`: same signature), recorded like malloc.
#[inline(always)]
fn aligned(rec: &'static Hook, align: usize, size: usize) -> *mut c_void {
    let m = mode();
    if m == 0 || skip(size, m) {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { originals::real::<AlignFn>(rec)(align, size) };
    }
    aligned_slow(rec, align, size, m)
}

#[cold]
#[inline(never)]
fn aligned_slow(rec: &'static Hook, align: usize, size: usize, m: u64) -> *mut c_void {
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { originals::real::<AlignFn>(rec)(align, size) };
    on_alloc(p, size, m);
    p
}

/// The record of [`memalign`].
pub(crate) static MEMALIGN: Hook = Hook::new(c"memalign", memalign as *const (), Kind::Family);

/// `memalign(3)`.
///
/// # Safety
/// Same contract as glibc's `memalign`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    aligned(&MEMALIGN, align, size)
}

/// The record of [`aligned_alloc`].
pub(crate) static ALIGNED_ALLOC: Hook =
    Hook::new(c"aligned_alloc", aligned_alloc as *const (), Kind::Family);

/// `aligned_alloc(3)`.
///
/// # Safety
/// Same contract as glibc's `aligned_alloc`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    aligned(&ALIGNED_ALLOC, align, size)
}

/// The record of [`posix_memalign`].
pub(crate) static POSIX_MEMALIGN: Hook =
    Hook::new(c"posix_memalign", posix_memalign as *const (), Kind::Family);

/// `posix_memalign(3)`.
///
/// # Safety
/// Same contract as glibc's `posix_memalign`; `out` must be writable.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    let m = mode();
    if m == 0 || skip(size, m) {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { originals::real::<PosixMemalignFn>(&POSIX_MEMALIGN)(out, align, size) };
    }
    // SAFETY: same contract.
    unsafe { posix_memalign_slow(out, align, size, m) }
}

#[cold]
#[inline(never)]
unsafe fn posix_memalign_slow(out: *mut *mut c_void, align: usize, size: usize, m: u64) -> i32 {
    // SAFETY: forwarding with the caller's arguments.
    let rc = unsafe { originals::real::<PosixMemalignFn>(&POSIX_MEMALIGN)(out, align, size) };
    if rc == 0 {
        // SAFETY: on success the allocator stored the block in `*out`.
        on_alloc(unsafe { *out }, size, m);
    }
    rc
}

/// The record of [`valloc`].
pub(crate) static VALLOC: Hook = Hook::new(c"valloc", valloc as *const (), Kind::Family);

/// `valloc(3)`.
///
/// # Safety
/// Same contract as glibc's `valloc`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    let m = mode();
    if m == 0 || skip(size, m) {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { originals::real::<MallocFn>(&VALLOC)(size) };
    }
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { originals::real::<MallocFn>(&VALLOC)(size) };
    on_alloc(p, size, m);
    p
}

/// The record of [`pvalloc`].
pub(crate) static PVALLOC: Hook = Hook::new(c"pvalloc", pvalloc as *const (), Kind::Family);

/// `pvalloc(3)`.
///
/// # Safety
/// Same contract as glibc's `pvalloc`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let m = mode();
    if m == 0 || skip(size, m) {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { originals::real::<MallocFn>(&PVALLOC)(size) };
    }
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { originals::real::<MallocFn>(&PVALLOC)(size) };
    on_alloc(p, size, m);
    p
}

/// The record of [`malloc_usable_size`] (forwarded, never patched: a
/// program that reaches the allocator's directly gets the same answer).
pub(crate) static MALLOC_USABLE_SIZE: Hook = Hook::new(
    c"malloc_usable_size",
    malloc_usable_size as *const (),
    Kind::Forward,
);

/// `malloc_usable_size(3)`, forwarded to the allocator's.
///
/// # Safety
/// Same contract as glibc's `malloc_usable_size`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    // SAFETY: forwarding with the caller's argument.
    unsafe { originals::real::<UsableSizeFn>(&MALLOC_USABLE_SIZE)(p) }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The hooks are plain functions in the test build (not interposed) and
    // the mode is 0, so they forward to glibc: its argument checks hold.
    #[test]
    fn argument_checks() {
        let mut p: *mut c_void = core::ptr::null_mut();
        // SAFETY: valid out-pointer; the blocks are freed.
        unsafe {
            assert_eq!(posix_memalign(&mut p, 3, 8), libc::EINVAL);
            assert_eq!(posix_memalign(&mut p, 4, 8), libc::EINVAL);
            assert_eq!(posix_memalign(&mut p, 24, 8), libc::EINVAL);
            assert_eq!(posix_memalign(&mut p, 64, 100), 0);
            assert_eq!(p as usize % 64, 0);
            free(p);
            let q = aligned_alloc(256, 512);
            assert_eq!(q as usize % 256, 0);
            free(q);
            assert!(reallocarray(core::ptr::null_mut(), usize::MAX / 2, 3).is_null());
            assert_eq!(*libc::__errno_location(), libc::ENOMEM);
            let r = reallocarray(core::ptr::null_mut(), 10, 10);
            assert!(malloc_usable_size(r) >= 100);
            free(r);
            let v = valloc(10);
            assert_eq!(v as usize % 4096, 0);
            free(v);
        }
    }
}
