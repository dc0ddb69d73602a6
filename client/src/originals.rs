//! Finding the originals of the hook table (glibc's own definitions), and
//! refusing a program whose malloc is another allocator's.
//!
//! The originals are looked up in libc itself (the object our
//! `__libc_malloc` comes from), not in the global scope, so that a slot
//! holding anything else (another interposer, an object defining its own
//! `malloc`) is recognised and left alone. If a global lookup of one of the
//! core of the malloc family ([`Lookup::GlibcOnly`]) finds someone else's,
//! nothing is patched and the session is refused: our hooks call
//! `__libc_*`, so mixing them with another allocator would corrupt the heap.
//!
//! A non-PIE program that takes the address of `malloc` makes its own PLT
//! entry the canonical address (a global lookup returns it, and other
//! objects' `GLOB_DAT` slots hold it); that entry jumps through the
//! program's own `JUMP_SLOT`, which is patched, so it counts as glibc's.

use core::ffi::{CStr, c_void};

use heapprofd_client_core::frontend::Refusal;

use crate::elfdyn::is_canonical_plt;
use crate::hook::{Hook, Lookup};

/// The refusal when the program's malloc family is not glibc's.
pub(crate) const OTHER_ALLOCATOR: Refusal = Refusal {
    message: b"the program's malloc is not glibc's; profiling refused",
};

/// What a global lookup of `name` finds (0 = nothing).
pub(crate) fn global_symbol(name: &CStr) -> usize {
    // SAFETY: dlsym with a valid NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
}

/// glibc's definition of every record of `table`, or the refusal.
/// Call with the guard held (`dlopen`/`dlsym` may allocate).
pub(crate) fn find<const N: usize>(table: &[&Hook; N]) -> Result<[usize; N], Refusal> {
    let mut out = [0usize; N];
    let handle = libc_handle();
    let mut result = Ok(());
    for (slot, hook) in out.iter_mut().zip(table) {
        let own = if handle.is_null() {
            0
        } else {
            // SAFETY: dlsym on a valid handle with a NUL-terminated name.
            unsafe { libc::dlsym(handle, hook.name.as_ptr()) as usize }
        };
        let global = global_symbol(hook.name);
        *slot = match hook.lookup {
            Lookup::GlibcOrGlobal if own == 0 => global,
            _ => own,
        };
        if hook.lookup == Lookup::GlibcOnly
            && (own == 0 || (global != own && !is_canonical_plt(hook.name, global)))
        {
            result = Err(OTHER_ALLOCATOR);
            break;
        }
    }
    if !handle.is_null() {
        // SAFETY: the handle of our own dlopen (RTLD_NOLOAD took a reference).
        unsafe { libc::dlclose(handle) };
    }
    result.map(|()| out)
}

/// Looks up every record's original and stores it in the record.
pub(crate) fn resolve<const N: usize>(table: &[&Hook; N]) -> Result<(), Refusal> {
    let found = find(table)?;
    for (hook, addr) in table.iter().zip(found) {
        hook.original
            .store(addr, core::sync::atomic::Ordering::SeqCst);
    }
    Ok(())
}

/// A handle of the libc our `__libc_malloc` comes from (`RTLD_NOLOAD`).
fn libc_handle() -> *mut c_void {
    // SAFETY: dladdr fills the zeroed struct; dlopen with RTLD_NOLOAD only
    // returns an already loaded object (and takes a reference the caller
    // drops).
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        let f = crate::real::__libc_malloc as *const () as *const c_void;
        if libc::dladdr(f, &mut info) == 0 || info.dli_fname.is_null() {
            return core::ptr::null_mut();
        }
        libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooktable::HOOKS;

    #[test]
    fn glibc_is_the_allocator_of_the_test_binary() {
        // The hooks are not exported in the test build: glibc's malloc is global.
        let found = find(&HOOKS).expect("glibc's allocator");
        assert_eq!(found[0], global_symbol(c"malloc"));
        assert_eq!(found[0], crate::real::__libc_malloc as *const () as usize);
    }
}
