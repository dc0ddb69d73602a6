//! Finding the original of every hook record: the definition the name
//! stands for without us, the one that would serve the program's call if
//! the client were not loaded.
//!
//! That is the first definition after this library in load order
//! (`dl_iterate_phdr`'s order: the program, the preloaded libraries, their
//! dependencies breadth-first, then what was `dlopen`ed): glibc's
//! `malloc`, or jemalloc's when it is preloaded after the client or linked
//! into the program; libstdc++'s `operator new`, or tcmalloc's. Only when
//! nothing after this library defines the name (a library `dlopen`ed by an
//! attach comes after libc) is it the first definition before it.
//!
//! A definition before this library is not forwarded to while one follows
//! it: such a library may forward to the next definition itself, through
//! `dlsym(RTLD_NEXT, ..)`, which is ours. A heaptrack preload, glibc's
//! `libmemusage.so` or an emulated libc in `LD_PRELOAD` come before the
//! client installed in `/etc/ld.so.preload` (glibc loads `LD_PRELOAD`
//! first); forwarding back to them looped for ever (a stack overflow, or a
//! spin at 100% CPU). That first definition before this library is kept
//! in the record as `earlier`: what the program's own calls reach, so what
//! GOT patching would have to replace ([`refusal`]). Symbol
//! tables are read directly (`dynsym`), never through `dlsym`, which may
//! allocate: this runs on the first call of any hook, possibly before the
//! constructor and with nowhere yet to forward an allocation to.
//!
//! The same walk decides whether the library interposes (`interpose`):
//! whether this library comes before every other definition of `malloc`.
//! A non-PIE program that takes `malloc`'s address carries an undefined
//! `malloc` with a value (its canonical PLT entry): not a definition, so it
//! neither hides our interposition nor becomes an original.
//!
//! Another copy of the client (by file name) is skipped: never an
//! original, and if it comes first, it is the one that interposes and this
//! copy stays inert ([`another_copy_first`]).
//!
//! C++ records are recorded only when their original comes from the object
//! that defines the original of their `pair` (`malloc` or `free`): see
//! [`Kind::CxxNew`](crate::hook::Kind::CxxNew). The tables are the caller's (`init`, `patching`); a
//! hook whose original is unknown resolves just itself and its pair.
//!
//! A program whose own executable defines `malloc` (an allocator linked
//! statically into it) cannot be profiled: its calls are direct, no symbol
//! lookup or GOT slot is involved ([`refusal`]). Nor, by a library that
//! does not interpose, can a program whose calls go to a `malloc` of a
//! library before it that is not the original (an allocator in
//! `LD_PRELOAD` before the installed client): the program's slots hold
//! that library's `malloc`, which the hooks do not forward to.

use core::ffi::{CStr, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use heapprofd_client_core::frontend::Refusal;
use heapprofd_proto::wire::Unprofilable;

use crate::elfdyn::read_dynamic;
use crate::hook::Hook;
use crate::{dynsym, interpose};

/// The refusal when the program's executable defines malloc itself.
pub(crate) const BUILT_IN_ALLOCATOR: Refusal = Refusal {
    message: b"the program's executable defines malloc itself (a statically linked \
allocator): its calls cannot be intercepted; not profiled",
    unprofilable: Unprofilable::BuiltInAllocator,
};

/// The refusal when a library before this one in load order defines the
/// malloc the program calls, and something after this one defines malloc
/// too (the hooks forward there).
pub(crate) const EARLIER_ALLOCATOR: Refusal = Refusal {
    message: b"a library loaded before the client defines malloc (an allocator in \
LD_PRELOAD before the client installed in /etc/ld.so.preload): not profiled",
    unprofilable: Unprofilable::EarlierAllocator,
};

/// The refusal when no object defines malloc (cannot happen with glibc).
const NO_MALLOC: Refusal = Refusal {
    message: b"no object defines malloc; not profiled",
    unprofilable: Unprofilable::None,
};

/// `PT_DYNAMIC` of the main program (0 = not seen yet).
static MAIN_DYNAMIC: AtomicUsize = AtomicUsize::new(0);

/// `rec`'s original, resolving it first if it is not known yet (a call
/// before the constructor, or a name whose library was loaded later).
/// Never 0: a name nobody defines ends the process with a message (the
/// program could not have been linked to it without a definition).
#[inline(always)]
pub(crate) fn target(rec: &'static Hook) -> usize {
    let f = rec.original();
    if f != 0 {
        return f;
    }
    resolve_late(rec)
}

/// [`target`] as a function pointer of type `F`.
///
/// # Safety
/// `F` is a function pointer type with the C signature of the record's
/// name (the original is the definition of that very name).
#[inline(always)]
pub(crate) unsafe fn real<F: Copy>(rec: &'static Hook) -> F {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<usize>()) };
    let f = target(rec);
    // SAFETY: the caller's contract; `f` is the address of a function.
    unsafe { core::mem::transmute_copy::<usize, F>(&f) }
}

#[cold]
#[inline(never)]
fn resolve_late(rec: &'static Hook) -> usize {
    let one: [&'static Hook; 1] = [rec];
    match rec.pair {
        Some(p) => resolve(&[&one, &[p]]),
        None => resolve(&[&one]),
    }
    let f = rec.original();
    if f == 0 {
        heapprofd_client_core::log::log(
            b"heapprofd-rs: no definition to forward this call to: ",
            rec.name.to_bytes(),
        );
        // SAFETY: abort has no preconditions.
        unsafe { libc::abort() };
    }
    f
}

struct Walk<'a> {
    tables: &'a [&'a [&'static Hook]],
    /// An address inside this library.
    ours: usize,
    /// Objects seen so far.
    index: usize,
    /// Whether a definition of `malloc` came before this library.
    malloc_before_us: bool,
    /// Whether this library was seen.
    saw_us: bool,
    /// Whether another copy of the client came before this library.
    other_copy_before_us: bool,
}

/// The client's file name: an object of that name other than this library
/// is another copy of the client (another build or path, e.g. one in
/// `LD_PRELOAD` beside the one `/etc/ld.so.preload` names). Its hooks are
/// never anyone's originals: two copies forwarding to each other would
/// loop for ever.
const CLIENT_FILE: &[u8] = heapprofd_proto::attach::CLIENT_FILE_NAME.as_bytes();

/// Set when another copy of the client comes before this library in load
/// order: that copy interposes and profiles; this one stays inert.
static OTHER_COPY_FIRST: core::sync::atomic::AtomicBool =
    core::sync::atomic::AtomicBool::new(false);

/// Set when an object after this library in load order defines `malloc`
/// (the C library): this library was preloaded (`LD_PRELOAD` or
/// `/etc/ld.so.preload`), not `dlopen`ed later.
static PRELOADED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Whether this library was loaded before the C library (preloaded), as
/// far as the walks so far saw.
pub(crate) fn preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

/// Whether another copy of the client was loaded before this library (it
/// does the work; this one must not start sessions or take signals).
pub(crate) fn another_copy_first() -> bool {
    OTHER_COPY_FIRST.load(Ordering::Relaxed)
}

/// Whether the object `info` describes is a copy of the client (by its
/// file name).
///
/// # Safety
/// `info` is one `dl_iterate_phdr` reports.
unsafe fn is_client_copy(info: &libc::dl_phdr_info) -> bool {
    if info.dlpi_name.is_null() {
        return false;
    }
    // SAFETY: glibc's object name, NUL-terminated, valid during the walk.
    let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
    let base = match name.iter().rposition(|&b| b == b'/') {
        Some(i) => name.get(i + 1..).unwrap_or(&[]),
        None => name,
    };
    base == CLIENT_FILE
}

/// Resolves every record of `tables` whose original is not known yet (one
/// walk over the loaded objects), sets the C++ records' `recorded`, and
/// decides interposition on the first walk that sees this library.
/// Allocation-free; callable from any hook.
pub(crate) fn resolve(tables: &[&[&'static Hook]]) {
    let mut w = Walk {
        tables,
        ours: resolve as *const () as usize,
        index: 0,
        malloc_before_us: false,
        saw_us: false,
        other_copy_before_us: false,
    };
    // SAFETY: the callback only reads the objects glibc reports.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut w as *mut Walk<'_>).cast()) };
    // Nothing after us defines these: forward to the first definition
    // before us (a library loaded after libc: an attach's `dlopen`).
    for h in tables.iter().flat_map(|t| t.iter()) {
        let earlier = h.earlier.load(Ordering::Relaxed);
        if h.original() == 0 && earlier != 0 {
            h.owner
                .store(h.earlier_owner.load(Ordering::Relaxed), Ordering::Relaxed);
            h.original.store(earlier, Ordering::Relaxed);
        }
    }
    if w.saw_us {
        if w.other_copy_before_us {
            OTHER_COPY_FIRST.store(true, Ordering::Relaxed);
        }
        interpose::set(!w.malloc_before_us && !w.other_copy_before_us);
    }
    for h in tables.iter().flat_map(|t| t.iter()) {
        let Some(pair) = h.pair else { continue };
        let own = h.owner.load(Ordering::Relaxed);
        let recorded = own != 0 && own == pair.owner.load(Ordering::Relaxed);
        // Release: the assembly hooks call the original once they see this.
        h.recorded.store(u8::from(recorded), Ordering::Release);
    }
}

/// Why a session of a library that does not interpose cannot patch its
/// way in, if it cannot: `malloc` is the record of `malloc`, resolved.
pub(crate) fn refusal(malloc: &Hook) -> Option<Refusal> {
    let owner = malloc.owner.load(Ordering::Relaxed);
    if owner == 0 {
        return Some(NO_MALLOC);
    }
    // What the program's calls reach: the first definition before us, if
    // any (then we do not interpose), else the original.
    let (called, called_owner) = match malloc.earlier.load(Ordering::Relaxed) {
        0 => (malloc.original(), owner),
        e => (e, malloc.earlier_owner.load(Ordering::Relaxed)),
    };
    if called_owner == MAIN_DYNAMIC.load(Ordering::Relaxed) {
        return Some(BUILT_IN_ALLOCATOR);
    }
    (called != malloc.original()).then_some(EARLIER_ALLOCATOR)
}

/// The name interposition is decided on.
const MALLOC: &CStr = c"malloc";

/// The `dl_iterate_phdr` callback of [`resolve`].
unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: glibc passes a valid info and our walk; the object stays
    // mapped while the callback runs.
    unsafe {
        let w = &mut *data.cast::<Walk<'_>>();
        let info = &*info;
        let first = w.index == 0;
        w.index += 1;
        if crate::elfdyn::in_object(info, w.ours) {
            w.saw_us = true;
            return 0;
        }
        if is_client_copy(info) {
            w.other_copy_before_us |= !w.saw_us;
            return 0;
        }
        let Some(d) = read_dynamic(info) else {
            return 0;
        };
        let id = d.address;
        if first {
            MAIN_DYNAMIC.store(id, Ordering::Relaxed);
        }
        let base = info.dlpi_addr as usize;
        if dynsym::lookup(base, &d, MALLOC).is_some() {
            if w.saw_us {
                PRELOADED.store(true, Ordering::Relaxed);
            } else {
                w.malloc_before_us = true;
            }
        }
        for h in w.tables.iter().flat_map(|t| t.iter()) {
            if h.original() != 0 {
                continue;
            }
            let Some(addr) = dynsym::lookup(base, &d, h.name) else {
                continue;
            };
            if w.saw_us {
                h.owner.store(id, Ordering::Relaxed);
                h.original.store(addr, Ordering::Relaxed);
            } else if h.earlier.load(Ordering::Relaxed) == 0 {
                h.earlier_owner.store(id, Ordering::Relaxed);
                h.earlier.store(addr, Ordering::Relaxed);
            }
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks;

    #[test]
    fn glibc_is_the_original_in_the_test_binary() {
        // The hooks are not exported in the test build: glibc's functions
        // are the first definitions.
        resolve(&[&crate::hooktable::HOOKS]);
        let libc_malloc = crate::ownalloc::__libc_malloc as *const () as usize;
        // SAFETY: dlsym with valid names.
        let (malloc, free) = unsafe {
            (
                libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) as usize,
                libc::dlsym(libc::RTLD_DEFAULT, c"free".as_ptr()) as usize,
            )
        };
        assert_eq!(hooks::MALLOC.original(), malloc);
        assert_eq!(hooks::MALLOC.original(), libc_malloc);
        assert_eq!(hooks::FREE.original(), free);
        assert_eq!(
            hooks::MALLOC.owner.load(Ordering::Relaxed),
            hooks::FREE.owner.load(Ordering::Relaxed)
        );
        assert!(refusal(&hooks::MALLOC).is_none());
    }
}
