//! The library's own allocator: the table bionic gave `heapprofd_initialize`
//! ([`dispatch::previous`]), called directly, never through the hooks.
//!
//! Before the first initialize there is no table; then the public `malloc`
//! family is used. That is the same allocator: bionic installs our table
//! only after initialize returned, and until then its `malloc` is the one
//! `prev` holds. So a block may be allocated one way and freed the other.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

use crate::dispatch;

/// The alignment bionic's `malloc` guarantees (16 on LP64, 8 on LP32).
const MALLOC_ALIGN: usize = 2 * core::mem::size_of::<usize>();

/// The library's `#[global_allocator]`.
#[derive(Debug)]
pub struct DispatchAlloc;

unsafe fn malloc(size: usize) -> *mut c_void {
    // SAFETY: plain calls into the allocator.
    unsafe {
        match dispatch::previous().and_then(|t| t.malloc) {
            Some(f) => f(size),
            None => libc::malloc(size),
        }
    }
}

unsafe fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: plain calls into the allocator.
    unsafe {
        match dispatch::previous().and_then(|t| t.memalign) {
            Some(f) => f(align, size),
            None => libc::memalign(align, size),
        }
    }
}

unsafe fn free(p: *mut c_void) {
    // SAFETY: `p` came from this allocator.
    unsafe {
        match dispatch::previous().and_then(|t| t.free) {
            Some(f) => f(p),
            None => libc::free(p),
        }
    }
}

unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: `p` came from this allocator.
    unsafe {
        match dispatch::previous().and_then(|t| t.realloc) {
            Some(f) => f(p, size),
            None => libc::realloc(p, size),
        }
    }
}

// SAFETY: forwards to the process's allocator, which satisfies the
// GlobalAlloc contract (memalign for over-aligned layouts).
unsafe impl GlobalAlloc for DispatchAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain calls into the allocator.
        unsafe {
            if layout.align() <= MALLOC_ALIGN {
                malloc(layout.size()).cast()
            } else {
                memalign(layout.align(), layout.size()).cast()
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from `alloc` or `realloc`.
        unsafe { free(ptr.cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above; over-aligned blocks are moved by hand (realloc
        // keeps only MALLOC_ALIGN).
        unsafe {
            if layout.align() <= MALLOC_ALIGN {
                return realloc(ptr.cast(), new_size).cast();
            }
            let new: *mut u8 = memalign(layout.align(), new_size).cast();
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                free(ptr.cast());
            }
            new
        }
    }
}
