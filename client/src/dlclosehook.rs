//! The `dlclose` hook: the daemon unwinds the samples taken in an object
//! before the object goes, and learns afterwards that the maps changed
//! (`heapprofd_client_core::unload`); the in-process walk's tables drop
//! the object first and are rebuilt after (`walktables`).
//!
//! Exported (a preloaded client interposes it: the program's `dlclose`
//! calls reach it) and patched (an attached client redirects the GOT
//! slots that hold glibc's). Unlike `dlopen`, glibc's `dlclose` does not
//! depend on its caller, so the hook is a plain function that forwards to
//! the original ([`DLCLOSE`]: glibc's, libc's since 2.34, libdl's before).

use core::ffi::{c_int, c_void};

use crate::hook::{Hook, Kind};
use crate::originals;

/// The record of the `dlclose` hook.
pub(crate) static DLCLOSE: Hook = Hook::new(c"dlclose", dlclose as *const (), Kind::Loader);

/// `dlclose`, with the daemon caught up first.
///
/// # Safety
/// Same contract as glibc's `dlclose`.
#[cfg_attr(not(test), unsafe(export_name = "dlclose"))]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    type F = unsafe extern "C" fn(*mut c_void) -> c_int;
    // SAFETY: the original is glibc's dlclose.
    let real: F = unsafe { originals::real::<F>(&DLCLOSE) };
    // The walk's tables stop reading the object before it can go, and
    // take back what stays loaded afterwards (`walktables`).
    crate::walktables::before_unload(handle);
    // SAFETY: the caller's handle, forwarded.
    let rc = heapprofd_client_core::unload::unloading(|| unsafe { real(handle) });
    crate::walktables::refresh_if_prepared();
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_to_glibc() {
        let lib = c"libm.so.6";
        // SAFETY: loading and unloading a system library by name.
        unsafe {
            let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            assert!(!h.is_null());
            assert_eq!(dlclose(h), 0);
        }
        assert_ne!(DLCLOSE.original(), dlclose as *const () as usize);
        assert_ne!(DLCLOSE.original(), 0);
    }
}
