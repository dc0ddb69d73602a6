//! The daemon's socket path, in a fixed buffer (no allocation): from
//! `HEAPPROFD_SOCKET`, the default path, or the per-daemon path a
//! `sigqueue` activation or an attach names by id (in the runtime
//! directory of the process's effective user).

use heapprofd_proto::attach::{DEFAULT_SOCKET_PATH, socket_path_for_id};
use heapprofd_proto::socket;

/// Environment variable: socket path (see `heapprofd_proto::socket::SOCKET_ENV`).
pub const SOCKET_ENV: &core::ffi::CStr = c"HEAPPROFD_SOCKET";
const _: () = assert!(SOCKET_ENV.to_bytes().len() == socket::SOCKET_ENV.len());

/// A socket path in a fixed buffer (`sun_path` size, NUL-terminated).
#[derive(Clone, Copy)]
pub struct SocketPath {
    buf: [u8; 108],
    len: usize,
}

impl core::fmt::Debug for SocketPath {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

impl SocketPath {
    /// A path from its bytes; `None` if empty, too long for `sun_path` or
    /// holding a NUL.
    pub fn from_bytes(b: &[u8]) -> Option<SocketPath> {
        if b.is_empty() || b.len() >= 108 || b.contains(&0) {
            return None;
        }
        let mut buf = [0u8; 108];
        buf.get_mut(..b.len())?.copy_from_slice(b);
        Some(SocketPath { buf, len: b.len() })
    }

    /// `/tmp/heapprofd-rs-<euid>/<id>.sock`, the path of the daemon with
    /// that id (its pid) for a `sigqueue` activation or an attach (the
    /// attach ABI's rule, in the runtime directory of this process's user).
    pub fn for_id(id: u32) -> SocketPath {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        SocketPath::for_user_and_id(uid, id)
    }

    /// [`SocketPath::for_id`] for user `uid`.
    pub fn for_user_and_id(uid: u32, id: u32) -> SocketPath {
        SocketPath::from_bytes(socket_path_for_id(uid, id).as_bytes()).unwrap_or(SocketPath {
            buf: [0; 108],
            len: 0,
        })
    }

    /// `$HEAPPROFD_SOCKET`, else `fallback` (the profiling service's socket,
    /// see `crate::trigger::service_socket`), else the default path: where a
    /// wake-up without an id (signal value 0, as bionic sends for
    /// heapprofd; attach id 0) connects.
    pub fn from_env_or(fallback: impl FnOnce() -> Option<SocketPath>) -> SocketPath {
        crate::env::get(SOCKET_ENV)
            .and_then(SocketPath::from_bytes)
            .or_else(fallback)
            .or_else(|| SocketPath::from_bytes(DEFAULT_SOCKET_PATH.as_bytes()))
            .unwrap_or(SocketPath {
                buf: [0; 108],
                len: 0,
            })
    }

    /// The path's bytes (without the NUL).
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths() {
        assert_eq!(
            SocketPath::for_user_and_id(1000, 4242).as_bytes(),
            b"/tmp/heapprofd-rs-1000/4242.sock"
        );
        assert_eq!(
            SocketPath::for_user_and_id(0, 7).as_bytes(),
            b"/tmp/heapprofd-rs-0/7.sock"
        );
        assert_eq!(
            SocketPath::for_user_and_id(u32::MAX, u32::MAX).as_bytes(),
            b"/tmp/heapprofd-rs-4294967295/4294967295.sock"
        );
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(
            SocketPath::for_id(9).as_bytes(),
            format!("/tmp/heapprofd-rs-{me}/9.sock").as_bytes()
        );
        assert!(SocketPath::from_bytes(b"").is_none());
        assert!(SocketPath::from_bytes(&[b'a'; 108]).is_none());
        assert!(SocketPath::from_bytes(b"a\0b").is_none());
        assert_eq!(SocketPath::from_bytes(b"/x").unwrap().as_bytes(), b"/x");
    }
}
