//! glibc's real allocator, and the library's own Rust allocator on top of it.
//!
//! The hooks forward to the `__libc_*` entry points, which glibc exports for
//! exactly this purpose (public `GLIBC_2.2.5` symbols in glibc 2.36:
//! malloc, calloc, realloc, free, memalign, valloc, pvalloc). Calling them
//! needs no `dlsym`, which itself may allocate. glibc has no
//! `__libc_posix_memalign`, `__libc_aligned_alloc` or public
//! `__libc_reallocarray` (it is `GLIBC_PRIVATE`), so those are built on
//! `__libc_memalign` and `__libc_realloc`. `malloc_usable_size` has no
//! `__libc_` twin; it is looked up once with `dlsym(RTLD_NEXT)`.
//!
//! Which allocator is "real" is the front-end's choice: the core never
//! names these functions.
//!
//! [`LibcAlloc`] is the library's `#[global_allocator]`: every Rust
//! allocation the client makes goes straight to glibc and never enters the
//! hooks.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, Ordering};

unsafe extern "C" {
    pub(crate) fn __libc_malloc(size: usize) -> *mut c_void;
    pub(crate) fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    pub(crate) fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    pub(crate) fn __libc_free(p: *mut c_void);
    pub(crate) fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    pub(crate) fn __libc_valloc(size: usize) -> *mut c_void;
    pub(crate) fn __libc_pvalloc(size: usize) -> *mut c_void;
}

/// Alignment `__libc_malloc` guarantees (glibc: 2 * sizeof(size_t)).
const MALLOC_ALIGN: usize = 16;

/// The client's own allocator: glibc's, bypassing the hooks.
#[derive(Debug)]
pub struct LibcAlloc;

// SAFETY: forwards to glibc's allocator, which satisfies the GlobalAlloc
// contract for the alignments requested (memalign for over-aligned layouts).
unsafe impl GlobalAlloc for LibcAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain calls into glibc.
        unsafe {
            if layout.align() <= MALLOC_ALIGN {
                __libc_malloc(layout.size()).cast()
            } else {
                __libc_memalign(layout.align(), layout.size()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain calls into glibc; memalign memory is zeroed by hand.
        unsafe {
            if layout.align() <= MALLOC_ALIGN {
                __libc_calloc(1, layout.size()).cast()
            } else {
                let p: *mut u8 = __libc_memalign(layout.align(), layout.size()).cast();
                if !p.is_null() {
                    core::ptr::write_bytes(p, 0, layout.size());
                }
                p
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from one of the glibc functions above.
        unsafe { __libc_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above; over-aligned blocks are moved by hand because
        // glibc's realloc only keeps MALLOC_ALIGN alignment.
        unsafe {
            if layout.align() <= MALLOC_ALIGN {
                return __libc_realloc(ptr.cast(), new_size).cast();
            }
            let new: *mut u8 = __libc_memalign(layout.align(), new_size).cast();
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                __libc_free(ptr.cast());
            }
            new
        }
    }
}

/// The type of `malloc_usable_size`.
pub(crate) type UsableSizeFn = unsafe extern "C" fn(*mut c_void) -> usize;

/// glibc's `malloc_usable_size`, resolved by [`usable_size`].
static USABLE_SIZE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// glibc's `malloc_usable_size` behind `ours` (our hook, never returned),
/// looked up on the first call. The constructor makes that call, with the
/// guard held (`dlsym` may call `calloc`).
pub(crate) fn usable_size(ours: UsableSizeFn) -> UsableSizeFn {
    let cur = USABLE_SIZE.load(Ordering::Acquire);
    if !cur.is_null() {
        // SAFETY: only ever set to the address of glibc's function.
        return unsafe { core::mem::transmute::<*mut c_void, UsableSizeFn>(cur) };
    }
    // SAFETY: dlsym with a valid NUL-terminated name.
    let mut p = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) };
    if p.is_null() || p == ours as *mut c_void {
        p = usable_size_unknown as *mut c_void;
    }
    USABLE_SIZE.store(p, Ordering::Release);
    // SAFETY: `p` is a function with this signature.
    unsafe { core::mem::transmute::<*mut c_void, UsableSizeFn>(p) }
}

/// Fallback if glibc's function cannot be found: 0 is always a correct
/// (if useless) answer, as the caller may use only what it asked for.
unsafe extern "C" fn usable_size_unknown(_p: *mut c_void) -> usize {
    0
}
