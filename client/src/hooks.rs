//! The exported malloc family: thin shims around glibc's `__libc_*`, and
//! their hook records.
//!
//! Every hook starts with one relaxed load of the mode and one branch
//! (`heapprofd_client_core::hookpath`, which also has the slow paths the
//! glibc and any other front-end share). While the library is dormant (or
//! between sessions) that branch is always taken and the hook tail-calls
//! glibc. While a session is active, an unsampled allocation still
//! tail-calls glibc after the sampler's subtraction and compare; only a
//! sampled one calls glibc and then records; a free does one load from the
//! free set before it tail-calls glibc.
//!
//! Each hook's [`Hook`] record (name, glibc's original, the hook) sits next
//! to it; `hooktable` lists them for GOT patching.
//!
//! The hooks never panic: no indexing, no unwrap, no overflowing arithmetic
//! on these paths. `#[cfg_attr(not(test), no_mangle)]` keeps the unit-test
//! binary's own malloc uninterposed.

use core::ffi::c_void;

use heapprofd_client_core::errno;
use heapprofd_client_core::hookpath::{may_be_sampled, mode, on_alloc, on_free, resample, skip};
use heapprofd_client_core::tls::Guard;

use crate::hook::{Hook, Lookup};
use crate::real::{
    __libc_calloc, __libc_free, __libc_malloc, __libc_memalign, __libc_pvalloc, __libc_realloc,
    __libc_valloc,
};

/// The record of [`malloc`].
pub(crate) static MALLOC: Hook = Hook::new(c"malloc", malloc as *const (), Lookup::GlibcOnly);

/// `malloc(3)`.
///
/// # Safety
/// Same contract as glibc's `malloc`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let m = mode();
    if m == 0 || skip(size, m) {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { __libc_malloc(size) };
    }
    malloc_slow(size, m)
}

#[cold]
#[inline(never)]
fn malloc_slow(size: usize, m: u64) -> *mut c_void {
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { __libc_malloc(size) };
    on_alloc(p, size, m);
    p
}

/// The record of [`free`].
pub(crate) static FREE: Hook = Hook::new(c"free", free as *const (), Lookup::GlibcOnly);

/// `free(3)`.
///
/// # Safety
/// Same contract as glibc's `free`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn free(p: *mut c_void) {
    let m = mode();
    if may_be_sampled(p, m) {
        // SAFETY: same contract.
        return unsafe { free_slow(p, m) };
    }
    // SAFETY: forwarding with the caller's arguments.
    unsafe { __libc_free(p) }
}

#[cold]
#[inline(never)]
unsafe fn free_slow(p: *mut c_void, m: u64) {
    on_free(p, m);
    // SAFETY: forwarding with the caller's arguments.
    unsafe { __libc_free(p) }
}

/// The record of [`calloc`].
pub(crate) static CALLOC: Hook = Hook::new(c"calloc", calloc as *const (), Lookup::GlibcOnly);

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
        return unsafe { __libc_calloc(n, size) };
    }
    calloc_slow(n, size, m)
}

#[cold]
#[inline(never)]
fn calloc_slow(n: usize, size: usize, m: u64) -> *mut c_void {
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { __libc_calloc(n, size) };
    on_alloc(p, n.wrapping_mul(size), m);
    p
}

/// The record of [`realloc`].
pub(crate) static REALLOC: Hook = Hook::new(c"realloc", realloc as *const (), Lookup::GlibcOnly);

/// `realloc(3)`.
///
/// # Safety
/// Same contract as glibc's `realloc`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn realloc(old: *mut c_void, size: usize) -> *mut c_void {
    let m = mode();
    if m == 0 {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { __libc_realloc(old, size) };
    }
    let old_maybe_sampled = may_be_sampled(old, m);
    if !old_maybe_sampled && skip(size, m) {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { __libc_realloc(old, size) };
    }
    // SAFETY: same contract.
    unsafe { realloc_slow(old, size, m, old_maybe_sampled) }
}

#[cold]
#[inline(never)]
unsafe fn realloc_slow(
    old: *mut c_void,
    size: usize,
    m: u64,
    old_maybe_sampled: bool,
) -> *mut c_void {
    let was_sampled = old_maybe_sampled && on_free(old, m);
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { __libc_realloc(old, size) };
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
    Hook::new(c"reallocarray", reallocarray as *const (), Lookup::Glibc);

/// `reallocarray(3)`: realloc with an overflow check on `n * size`.
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

/// The record of [`memalign`].
pub(crate) static MEMALIGN: Hook = Hook::new(c"memalign", memalign as *const (), Lookup::Glibc);

/// `memalign(3)` (glibc semantics: a non-power-of-two alignment is rounded up).
///
/// # Safety
/// Same contract as glibc's `memalign`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    let m = mode();
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { __libc_memalign(align, size) };
    if m != 0 && !skip(size, m) {
        on_alloc(p, size, m);
    }
    p
}

/// The record of [`aligned_alloc`].
pub(crate) static ALIGNED_ALLOC: Hook =
    Hook::new(c"aligned_alloc", aligned_alloc as *const (), Lookup::Glibc);

/// `aligned_alloc(3)`: `EINVAL` unless the alignment is a power of two
/// (C17; the check glibc 2.38 added), otherwise memalign.
///
/// # Safety
/// Same contract as glibc's `aligned_alloc`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        errno::set(libc::EINVAL);
        return core::ptr::null_mut();
    }
    // SAFETY: same contract.
    unsafe { memalign(align, size) }
}

/// The record of [`posix_memalign`].
pub(crate) static POSIX_MEMALIGN: Hook = Hook::new(
    c"posix_memalign",
    posix_memalign as *const (),
    Lookup::Glibc,
);

/// `posix_memalign(3)`: `EINVAL` unless the alignment is a power of two
/// multiple of `sizeof(void *)`, `ENOMEM` on failure; errno is left alone.
///
/// # Safety
/// Same contract as glibc's `posix_memalign`; `out` must be writable.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    let word = core::mem::size_of::<*mut c_void>();
    if align % word != 0 || !(align / word).is_power_of_two() {
        return libc::EINVAL;
    }
    let saved = errno::get();
    // SAFETY: same contract.
    let p = unsafe { memalign(align, size) };
    if p.is_null() {
        errno::set(saved);
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a writable pointer.
    unsafe { *out = p };
    0
}

/// The record of [`valloc`].
pub(crate) static VALLOC: Hook = Hook::new(c"valloc", valloc as *const (), Lookup::Glibc);

/// `valloc(3)`.
///
/// # Safety
/// Same contract as glibc's `valloc`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    let m = mode();
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { __libc_valloc(size) };
    if m != 0 && !skip(size, m) {
        on_alloc(p, size, m);
    }
    p
}

/// The record of [`pvalloc`].
pub(crate) static PVALLOC: Hook = Hook::new(c"pvalloc", pvalloc as *const (), Lookup::Glibc);

/// `pvalloc(3)`.
///
/// # Safety
/// Same contract as glibc's `pvalloc`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let m = mode();
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { __libc_pvalloc(size) };
    if m != 0 && !skip(size, m) {
        on_alloc(p, size, m);
    }
    p
}

/// `malloc_usable_size(3)`, forwarded to glibc's.
///
/// # Safety
/// Same contract as glibc's `malloc_usable_size`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    // Resolved by the constructor; the guard covers a late first lookup
    // (dlsym may allocate).
    let f = {
        let _g = Guard::enter();
        crate::real::usable_size(malloc_usable_size)
    };
    // SAFETY: glibc's function with the caller's argument.
    unsafe { f(p) }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The hooks are plain functions in the test build (not interposed) and
    // the mode is 0, so they are glibc with our argument checks on top.
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
            assert!(aligned_alloc(48, 96).is_null());
            assert_eq!(*libc::__errno_location(), libc::EINVAL);
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
