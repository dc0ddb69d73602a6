//! The library's own allocator: glibc's, reached through its `__libc_*`
//! entry points (public `GLIBC_2.2.5` symbols in glibc 2.36: malloc,
//! calloc, realloc, free, memalign), never through the hooks.
//!
//! [`LibcAlloc`] is the library's `#[global_allocator]`: every Rust
//! allocation the client makes (the core's included) goes straight to
//! glibc's heap, whatever allocator the program uses (the hooks forward
//! the program's calls to that one, see `originals`); the client frees
//! only what it allocated itself, so the two never mix.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

unsafe extern "C" {
    pub(crate) fn __libc_malloc(size: usize) -> *mut c_void;
    pub(crate) fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    pub(crate) fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    pub(crate) fn __libc_free(p: *mut c_void);
    pub(crate) fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
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
