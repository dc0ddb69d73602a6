//! Reading the environment without allocating: `getenv` hands out the
//! environment's own bytes, where std's `env::var` copies them into a new
//! `String`.
//!
//! In a set-user-ID or set-group-ID program (`AT_SECURE`, which glibc's
//! `secure_getenv` checks too) every variable reads as unset: with the
//! client preloaded system-wide, a user must not be able to point a
//! privileged program at a socket of theirs (it would hand them its
//! `/proc/self/mem`) or change how it runs.

use core::ffi::CStr;

/// The value of an environment variable, if set.
pub fn get(name: &CStr) -> Option<&'static [u8]> {
    if secure() {
        return None;
    }
    // SAFETY: getenv with a valid name; the environment string lives on
    // (the client never modifies the environment).
    unsafe {
        let p = libc::getenv(name.as_ptr());
        (!p.is_null()).then(|| CStr::from_ptr(p).to_bytes())
    }
}

/// Whether the environment variable is set to exactly `1`.
pub fn is_1(name: &CStr) -> bool {
    get(name) == Some(b"1")
}

/// Whether the process runs a set-user-ID or set-group-ID program
/// (`AT_SECURE`): then the environment is not the program's to trust.
pub fn secure() -> bool {
    // SAFETY: getauxval reads the auxiliary vector; no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}
