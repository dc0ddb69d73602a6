//! Reading the environment without allocating: `getenv` hands out the
//! environment's own bytes, where std's `env::var` copies them into a new
//! `String`.

use core::ffi::CStr;

/// The value of an environment variable, if set.
pub fn get(name: &CStr) -> Option<&'static [u8]> {
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
