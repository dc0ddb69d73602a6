//! Whether the library interposes the program's malloc (it was preloaded)
//! or was loaded later without interposing (`dlopen`ed by an attach), in
//! which case a session reaches the program's calls by patching GOTs.
//!
//! Decided once, in the constructor: the library interposes if a global
//! lookup of `malloc` finds our own (the library is linked
//! `-Bsymbolic-functions`, so its own reference to its hook binds locally).

use core::ffi::c_void;
use core::sync::atomic::{AtomicU8, Ordering};

/// [`interposing`]: not decided (the constructor did not run).
const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;
static INTERPOSING: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Decides whether the library is the program's `malloc`. Called by the
/// constructor with the guard held (`dlsym` may allocate).
pub(crate) fn decide() {
    // SAFETY: dlsym with a valid NUL-terminated name.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    let ours = crate::hooks::malloc as *const () as *mut c_void;
    INTERPOSING.store(if global == ours { YES } else { NO }, Ordering::SeqCst);
}

/// Whether the library interposes the program's malloc (false also when
/// unknown, e.g. the constructor did not run).
pub(crate) fn interposing() -> bool {
    INTERPOSING.load(Ordering::SeqCst) == YES
}

/// Whether sessions of this process need GOT patching.
pub(crate) fn needs_patching() -> bool {
    INTERPOSING.load(Ordering::SeqCst) == NO
}
