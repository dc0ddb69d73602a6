//! The dispatch entries bionic looks up (`heapprofd_malloc`, `_free`, ...):
//! each does what every front-end's hooks do (`hookpath`: one relaxed load
//! of the mode and a branch while dormant, the sampler's check while a
//! session runs, the slow paths) around a call through the table bionic
//! gave `heapprofd_initialize` ([`dispatch::previous`]), never through the
//! public `malloc` (bionic's `malloc` calls these hooks: that would recurse).
//!
//! Sampled are the allocating entries (`malloc`, `calloc`, `realloc`,
//! `memalign`, `posix_memalign`, `aligned_alloc`, and `pvalloc`/`valloc`
//! where bionic has them: 32-bit) and `free`; the others only forward.
//! An entry whose slot in the table is empty (a table from an older
//! bionic, or none yet) fails as the allocator would on exhaustion: null
//! and `ENOMEM`, or -1.
//!
//! Nothing here panics or allocates.

use core::ffi::{c_int, c_void};

use heapprofd_client_core::errno;
use heapprofd_client_core::hookpath::{may_be_sampled, mode, on_alloc, on_free, resample, skip};

use crate::dispatch::{self, IterateCallback, Mallinfo};

/// Slot `$f` of the previous table, or `$fail` (with `ENOMEM`) if empty.
macro_rules! prev {
    ($f:ident, $fail:expr) => {
        match dispatch::previous().and_then(|t| t.$f) {
            Some(f) => f,
            None => {
                errno::set(libc::ENOMEM);
                return $fail;
            }
        }
    };
}

/// An allocating entry: `$call` allocates `$size` bytes.
macro_rules! alloc_hook {
    ($size:expr, $call:expr) => {{
        let m = mode();
        let size: usize = $size;
        if m == 0 || skip(size, m) {
            return $call;
        }
        let p: *mut c_void = $call;
        on_alloc(p, size, m);
        p
    }};
}

/// bionic's `malloc` with heapprofd's hooks installed.
///
/// # Safety
/// `malloc(3)`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_malloc(size: usize) -> *mut c_void {
    let f = prev!(malloc, core::ptr::null_mut());
    // SAFETY: forwarding with the caller's arguments.
    alloc_hook!(size, unsafe { f(size) })
}

/// bionic's `calloc`.
///
/// # Safety
/// `calloc(3)`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_calloc(n: usize, size: usize) -> *mut c_void {
    let f = prev!(calloc, core::ptr::null_mut());
    // A successful calloc checked the product; a failed one is not sampled.
    // SAFETY: forwarding with the caller's arguments.
    alloc_hook!(n.wrapping_mul(size), unsafe { f(n, size) })
}

/// bionic's `memalign`.
///
/// # Safety
/// `memalign(3)`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_memalign(align: usize, size: usize) -> *mut c_void {
    let f = prev!(memalign, core::ptr::null_mut());
    // SAFETY: forwarding with the caller's arguments.
    alloc_hook!(size, unsafe { f(align, size) })
}

/// bionic's `aligned_alloc`.
///
/// # Safety
/// `aligned_alloc(3)`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_aligned_alloc(align: usize, size: usize) -> *mut c_void {
    let f = prev!(aligned_alloc, core::ptr::null_mut());
    // SAFETY: forwarding with the caller's arguments.
    alloc_hook!(size, unsafe { f(align, size) })
}

/// bionic's `pvalloc` (32-bit only).
///
/// # Safety
/// `pvalloc(3)`'s contract.
#[cfg(target_pointer_width = "32")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_pvalloc(size: usize) -> *mut c_void {
    let f = prev!(pvalloc, core::ptr::null_mut());
    // SAFETY: forwarding with the caller's arguments.
    alloc_hook!(size, unsafe { f(size) })
}

/// bionic's `valloc` (32-bit only).
///
/// # Safety
/// `valloc(3)`'s contract.
#[cfg(target_pointer_width = "32")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_valloc(size: usize) -> *mut c_void {
    let f = prev!(valloc, core::ptr::null_mut());
    // SAFETY: forwarding with the caller's arguments.
    alloc_hook!(size, unsafe { f(size) })
}

/// bionic's `posix_memalign`.
///
/// # Safety
/// `posix_memalign(3)`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_posix_memalign(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
) -> c_int {
    let Some(f) = dispatch::previous().and_then(|t| t.posix_memalign) else {
        return libc::ENOMEM;
    };
    let m = mode();
    if m == 0 || skip(size, m) {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { f(out, align, size) };
    }
    // SAFETY: forwarding with the caller's arguments.
    let rc = unsafe { f(out, align, size) };
    let p = if rc == 0 && !out.is_null() {
        // SAFETY: on success the allocator stored the block through `out`.
        unsafe { *out }
    } else {
        core::ptr::null_mut()
    };
    on_alloc(p, size, m);
    rc
}

/// bionic's `free`.
///
/// # Safety
/// `free(3)`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_free(p: *mut c_void) {
    let Some(f) = dispatch::previous().and_then(|t| t.free) else {
        return;
    };
    if may_be_sampled(p) {
        // Before the allocator gets the block back (see hookpath).
        on_free(p);
    }
    // SAFETY: forwarding with the caller's arguments.
    unsafe { f(p) }
}

/// bionic's `realloc`: the old block's free (before the call), then the
/// new block, as the glibc front-end's `realloc`.
///
/// # Safety
/// `realloc(3)`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_realloc(old: *mut c_void, size: usize) -> *mut c_void {
    let f = prev!(realloc, core::ptr::null_mut());
    let m = mode();
    if m == 0 {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { f(old, size) };
    }
    let old_maybe_sampled = may_be_sampled(old);
    if !old_maybe_sampled && skip(size, m) {
        // SAFETY: forwarding with the caller's arguments.
        return unsafe { f(old, size) };
    }
    let was_sampled = old_maybe_sampled && on_free(old);
    // SAFETY: forwarding with the caller's arguments.
    let p = unsafe { f(old, size) };
    if p.is_null() {
        if was_sampled && size != 0 {
            // The old block survives a failed realloc, but its free was
            // already sent: record it again with its real size.
            // SAFETY: `old` is still a live block.
            let usable = unsafe { heapprofd_malloc_usable_size(old) };
            resample(old, usable, m);
        }
        return p;
    }
    if !skip(size, m) {
        on_alloc(p, size, m);
    }
    p
}

/// bionic's `malloc_usable_size`.
///
/// # Safety
/// `malloc_usable_size(3)`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_malloc_usable_size(p: *const c_void) -> usize {
    let f = prev!(malloc_usable_size, 0);
    // SAFETY: forwarding with the caller's arguments.
    unsafe { f(p) }
}

/// bionic's `mallinfo`.
///
/// # Safety
/// No preconditions beyond the allocator's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_mallinfo() -> Mallinfo {
    let f = prev!(mallinfo, Mallinfo::default());
    // SAFETY: forwarding.
    unsafe { f() }
}

/// bionic's `mallopt`.
///
/// # Safety
/// `mallopt(3)`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_mallopt(param: c_int, value: c_int) -> c_int {
    // mallopt returns 0 on error.
    let f = prev!(mallopt, 0);
    // SAFETY: forwarding with the caller's arguments.
    unsafe { f(param, value) }
}

/// bionic's `malloc_info`.
///
/// # Safety
/// `malloc_info(3)`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_malloc_info(options: c_int, fp: *mut libc::FILE) -> c_int {
    let f = prev!(malloc_info, -1);
    // SAFETY: forwarding with the caller's arguments.
    unsafe { f(options, fp) }
}

/// bionic's `malloc_iterate` (used by libmemunreachable).
///
/// # Safety
/// bionic's `malloc_iterate` contract (between `malloc_disable` and
/// `malloc_enable`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_malloc_iterate(
    base: usize,
    size: usize,
    callback: IterateCallback,
    arg: *mut c_void,
) -> c_int {
    let f = prev!(malloc_iterate, -1);
    // SAFETY: forwarding with the caller's arguments.
    unsafe { f(base, size, callback, arg) }
}

/// bionic's `malloc_disable`.
///
/// # Safety
/// Pair with [`heapprofd_malloc_enable`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_malloc_disable() {
    if let Some(f) = dispatch::previous().and_then(|t| t.malloc_disable) {
        // SAFETY: forwarding.
        unsafe { f() }
    }
}

/// bionic's `malloc_enable`.
///
/// # Safety
/// After [`heapprofd_malloc_disable`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn heapprofd_malloc_enable() {
    if let Some(f) = dispatch::previous().and_then(|t| t.malloc_enable) {
        // SAFETY: forwarding.
        unsafe { f() }
    }
}
