//! Raw logging to stderr: the client's only output.
//!
//! No formatting, no allocation, no stdio lock (the program may hold it, or
//! be inside `malloc` on another thread): two or three `write(2)` calls.

/// Writes `a`, `b` and a newline to stderr. Errors are ignored.
pub fn log(a: &[u8], b: &[u8]) {
    for part in [a, b, b"\n"] {
        // SAFETY: writing our own bytes to fd 2.
        unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
}
