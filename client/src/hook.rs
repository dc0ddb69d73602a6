//! One hooked function as one record: its name, the original it replaces,
//! and our hook (as heaptrack's `heaptrack_inject.cpp` keeps them).
//!
//! The original is what a call that reaches our hook stands for without
//! us: the next definition after this library in load order (what
//! `dlsym(RTLD_NEXT)` would give), or, in a library loaded after every
//! definition (`dlopen`ed by an attach), the first one (`originals` finds
//! it by reading the objects' symbol tables). Every hook forwards to it,
//! so a program is served by the allocator that would have served it
//! without the client (glibc, or jemalloc, tcmalloc, mimalloc... preloaded
//! after the client or linked into the program), and GOT patching
//! redirects only slots that hold it. A definition before this library
//! (an `LD_PRELOAD` before the installed client, heaptrack's preload, an
//! allocator in the executable) is kept apart as `earlier`: such a
//! definition may itself forward to us through `dlsym(RTLD_NEXT)`, so it
//! is never what we forward to while something follows us.
//!
//! The records are defined next to the hooks they describe (`hooks`,
//! `cxxhooks`, `exechooks`, `dlhook`, `dlclosehook`), so a hook can reach its own
//! original; `hooktable` lists them.

use core::ffi::CStr;
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// What a record is, for recording and for GOT patching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The C malloc family: always recorded, patched.
    Family,
    /// C++ `operator new`/`delete` (every variant). Recorded (and patched)
    /// only if the original comes from the object whose `malloc` (for a
    /// `new`) or `free` (for a `delete`) the program uses: the allocator's
    /// own operator (tcmalloc, mimalloc, jemalloc define them). libstdc++'s
    /// calls `malloc`/`free`, which are recorded: recording it too would
    /// count every allocation twice, so it passes through.
    CxxNew,
    /// See [`Kind::CxxNew`].
    CxxDelete,
    /// Forwarded, never recorded, never patched (`malloc_usable_size`, the
    /// exec family).
    Forward,
    /// `dlopen` and `dlclose` (both exported): patched, never recorded.
    Loader,
}

/// One hooked function.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Hook {
    /// What the hook forwards to: the next definition after us, else the
    /// first (see the module's doc; 0 = not known yet:
    /// the hooks then resolve it, see `originals::real`, and GOT patching
    /// leaves slots of this name alone). A slot is redirected only if it holds this (or an
    /// unresolved lazy-binding stub), and gets it back at the end.
    pub(crate) original: AtomicUsize,
    /// For C++ records: 1 when calls are recorded (the original is the
    /// allocator's own operator), 0 when the hook only forwards. Read by
    /// the assembly of `cxxhooks`. (The malloc family always records.)
    pub(crate) recorded: AtomicU8,
    /// The object defining the original (the address of its `PT_DYNAMIC`,
    /// 0 = not known).
    pub(crate) owner: AtomicUsize,
    /// The first definition before this library in load order (0 = none
    /// seen): what the program's own calls reach when it is not ours.
    pub(crate) earlier: AtomicUsize,
    /// The object defining `earlier` (its `PT_DYNAMIC`, 0 = none).
    pub(crate) earlier_owner: AtomicUsize,
    /// The symbol name.
    pub(crate) name: &'static CStr,
    /// Our replacement (null where this architecture has none).
    hook: *const (),
    /// What the record is.
    pub(crate) kind: Kind,
    /// For C++ records: the record whose original must come from the same
    /// object for this one to be recorded (`malloc` for a `new`, `free`
    /// for a `delete`).
    pub(crate) pair: Option<&'static Hook>,
}

// SAFETY: `hook` is the address of code, never read or written through;
// the mutable fields are atomic.
unsafe impl Sync for Hook {}

impl Hook {
    pub(crate) const fn new(name: &'static CStr, hook: *const (), kind: Kind) -> Hook {
        Hook {
            original: AtomicUsize::new(0),
            recorded: AtomicU8::new(0),
            owner: AtomicUsize::new(0),
            earlier: AtomicUsize::new(0),
            earlier_owner: AtomicUsize::new(0),
            name,
            hook,
            kind,
            pair: None,
        }
    }

    /// A C++ record, recorded when its original and `pair`'s come from the
    /// same object.
    pub(crate) const fn cxx(
        name: &'static CStr,
        hook: *const (),
        kind: Kind,
        pair: &'static Hook,
    ) -> Hook {
        Hook {
            pair: Some(pair),
            ..Hook::new(name, hook, kind)
        }
    }

    /// Our replacement's address (0 = none).
    pub(crate) fn hook_addr(&self) -> usize {
        self.hook as usize
    }

    /// The original's address (0 = not known).
    pub(crate) fn original(&self) -> usize {
        self.original.load(Ordering::Relaxed)
    }

    /// Whether calls through this hook are recorded.
    #[inline(always)]
    pub(crate) fn recorded(&self) -> bool {
        self.recorded.load(Ordering::Relaxed) != 0
    }

    /// Whether GOT patching redirects slots of this name.
    pub(crate) fn patched(&self) -> bool {
        match self.kind {
            Kind::Family | Kind::Loader => true,
            Kind::CxxNew | Kind::CxxDelete => self.recorded(),
            Kind::Forward => false,
        }
    }
}
