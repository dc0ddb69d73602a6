//! bionic's `MallocDispatch`: the table of allocator entry points bionic
//! hands to `heapprofd_initialize` (the native allocator's, or GWP-ASan's)
//! and the one it builds from our exported `heapprofd_*` functions.
//!
//! The layout follows AOSP bionic `libc/private/bionic_malloc_dispatch.h`
//! at platform_bionic commit `731631f300090436d7f5df80d50b6275c8c60a93`
//! (2025-03-26): plain function pointers in the order below, `pvalloc` and
//! `valloc` only where `HAVE_DEPRECATED_MALLOC_FUNCS` is defined (32-bit,
//! `private/bionic_config.h`), `malloc_info` last, the struct
//! `aligned(32)`. The assertions at the end pin every offset and the size
//! for both pointer widths: a change of the header shows up here, not as a
//! call through the wrong slot.
//!
//! The table we forward to is kept as a pointer ([`set_previous`]): bionic's
//! tables live as long as the process, and a re-initialization may hand a
//! different one.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};

/// bionic's `struct mallinfo` (every field a `size_t`, unlike glibc's
/// `int`s; the same layout as glibc's `struct mallinfo2`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mallinfo {
    pub arena: usize,
    pub ordblks: usize,
    pub smblks: usize,
    pub hblks: usize,
    pub hblkhd: usize,
    pub usmblks: usize,
    pub fsmblks: usize,
    pub uordblks: usize,
    pub fordblks: usize,
    pub keepcost: usize,
}

/// `malloc_iterate`'s callback: base, size, argument.
pub type IterateCallback = Option<unsafe extern "C" fn(usize, usize, *mut c_void)>;

/// bionic's `MallocDispatch` (see the module doc for the revision).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub struct MallocDispatch {
    pub calloc: Option<unsafe extern "C" fn(usize, usize) -> *mut c_void>,
    pub free: Option<unsafe extern "C" fn(*mut c_void)>,
    pub mallinfo: Option<unsafe extern "C" fn() -> Mallinfo>,
    pub malloc: Option<unsafe extern "C" fn(usize) -> *mut c_void>,
    pub malloc_usable_size: Option<unsafe extern "C" fn(*const c_void) -> usize>,
    pub memalign: Option<unsafe extern "C" fn(usize, usize) -> *mut c_void>,
    pub posix_memalign: Option<unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int>,
    #[cfg(target_pointer_width = "32")]
    pub pvalloc: Option<unsafe extern "C" fn(usize) -> *mut c_void>,
    pub realloc: Option<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>,
    #[cfg(target_pointer_width = "32")]
    pub valloc: Option<unsafe extern "C" fn(usize) -> *mut c_void>,
    pub malloc_iterate:
        Option<unsafe extern "C" fn(usize, usize, IterateCallback, *mut c_void) -> c_int>,
    pub malloc_disable: Option<unsafe extern "C" fn()>,
    pub malloc_enable: Option<unsafe extern "C" fn()>,
    pub mallopt: Option<unsafe extern "C" fn(c_int, c_int) -> c_int>,
    pub aligned_alloc: Option<unsafe extern "C" fn(usize, usize) -> *mut c_void>,
    pub malloc_info: Option<unsafe extern "C" fn(c_int, *mut libc::FILE) -> c_int>,
}

const P: usize = core::mem::size_of::<usize>();

// The layout of the AOSP header, slot by slot (see the module doc).
macro_rules! pin {
    ($field:ident, $slot:expr) => {
        const _: () = assert!(core::mem::offset_of!(MallocDispatch, $field) == $slot * P);
    };
}
pin!(calloc, 0);
pin!(free, 1);
pin!(mallinfo, 2);
pin!(malloc, 3);
pin!(malloc_usable_size, 4);
pin!(memalign, 5);
pin!(posix_memalign, 6);
#[cfg(target_pointer_width = "64")]
mod lp64 {
    use crate::dispatch::{MallocDispatch, P};
    pin!(realloc, 7);
    pin!(malloc_iterate, 8);
    pin!(malloc_disable, 9);
    pin!(malloc_enable, 10);
    pin!(mallopt, 11);
    pin!(aligned_alloc, 12);
    pin!(malloc_info, 13);
    // 14 pointers, padded to the 32-byte alignment.
    const _: () = assert!(core::mem::size_of::<MallocDispatch>() == 128);
}
#[cfg(target_pointer_width = "32")]
mod lp32 {
    use crate::dispatch::{MallocDispatch, P};
    pin!(pvalloc, 7);
    pin!(realloc, 8);
    pin!(valloc, 9);
    pin!(malloc_iterate, 10);
    pin!(malloc_disable, 11);
    pin!(malloc_enable, 12);
    pin!(mallopt, 13);
    pin!(aligned_alloc, 14);
    pin!(malloc_info, 15);
    // 16 pointers of 4 bytes, padded to 32-byte alignment.
    const _: () = assert!(core::mem::size_of::<MallocDispatch>() == 64);
}
const _: () = assert!(core::mem::align_of::<MallocDispatch>() == 32);
const _: () = assert!(core::mem::size_of::<Mallinfo>() == 10 * P);

/// The table our hooks forward to (null until the first initialize).
static PREVIOUS: AtomicPtr<MallocDispatch> = AtomicPtr::new(core::ptr::null_mut());

/// Keeps `prev` as the table to forward to (from `heapprofd_initialize`).
pub fn set_previous(prev: &'static MallocDispatch) {
    PREVIOUS.store(
        prev as *const MallocDispatch as *mut MallocDispatch,
        Ordering::Release,
    );
}

/// The table to forward to, if bionic gave one.
#[inline(always)]
pub fn previous() -> Option<&'static MallocDispatch> {
    // SAFETY: only ever set from a `&'static MallocDispatch`.
    unsafe { PREVIOUS.load(Ordering::Acquire).as_ref() }
}
