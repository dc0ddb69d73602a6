//! This thread's `errno`, read and written without going through std
//! (whose `io::Error::last_os_error` is fine but the client only ever needs
//! the raw number).

/// This thread's errno.
#[inline]
pub fn get() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets this thread's errno.
#[inline]
pub fn set(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}
