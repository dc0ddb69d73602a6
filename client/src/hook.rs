//! One hooked function as one record: its name, the original it replaces,
//! and our hook (as heaptrack's `heaptrack_inject.cpp` keeps them).
//!
//! The records are defined next to the hooks they describe (`hooks`,
//! `dlhook`), so a hook can reach its own original; `hooktable` lists them.

use core::ffi::CStr;
use core::sync::atomic::{AtomicUsize, Ordering};

/// Where a record's original is looked up, and what finding another
/// definition means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// glibc's, and a global lookup of the name must find glibc's too (a
    /// non-PIE program's canonical PLT entry for it counts as glibc's):
    /// otherwise another allocator interposes and sessions are refused.
    GlibcOnly,
    /// glibc's; other definitions are left alone.
    Glibc,
    /// glibc's, or where a global lookup finds it (`dlopen` lived in libdl
    /// before glibc 2.34).
    GlibcOrGlobal,
}

/// One hooked function.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Hook {
    /// The function the name stands for without us: glibc's own
    /// definition, looked up when a patched session starts (0 = not known:
    /// slots of this name are left alone). A slot is redirected only if it
    /// holds this (or an unresolved lazy-binding stub), and gets it back at
    /// the end. The `dlopen` hook forwards to it; the malloc family's
    /// hooks call glibc's `__libc_*` twins of these directly (no load on
    /// the fast path).
    pub(crate) original: AtomicUsize,
    /// The symbol name.
    pub(crate) name: &'static CStr,
    /// Our replacement (null where this architecture has none).
    hook: *const (),
    /// Where `original` comes from.
    pub(crate) lookup: Lookup,
}

// SAFETY: `hook` is the address of code, never read or written through;
// `original` is atomic.
unsafe impl Sync for Hook {}

impl Hook {
    pub(crate) const fn new(name: &'static CStr, hook: *const (), lookup: Lookup) -> Hook {
        Hook {
            original: AtomicUsize::new(0),
            name,
            hook,
            lookup,
        }
    }

    /// Our replacement's address (0 = none).
    pub(crate) fn hook_addr(&self) -> usize {
        self.hook as usize
    }

    /// The original's address (0 = not known).
    pub(crate) fn original(&self) -> usize {
        self.original.load(Ordering::SeqCst)
    }
}
