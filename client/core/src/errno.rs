//! This thread's `errno`, read and written without going through std
//! (whose `io::Error::last_os_error` is fine but the client only ever needs
//! the raw number).

/// This thread's errno slot: glibc's `__errno_location`, bionic's `__errno`.
#[inline]
fn slot() -> *mut i32 {
    // SAFETY: both return this thread's errno slot; no preconditions.
    #[cfg(target_os = "android")]
    return unsafe { libc::__errno() };
    // SAFETY: as above.
    #[cfg(not(target_os = "android"))]
    return unsafe { libc::__errno_location() };
}

/// This thread's errno.
#[inline]
pub fn get() -> i32 {
    // SAFETY: the slot is valid for the thread's lifetime.
    unsafe { *slot() }
}

/// Sets this thread's errno.
#[inline]
pub fn set(e: i32) {
    // SAFETY: the slot is valid for the thread's lifetime.
    unsafe { *slot() = e };
}
