//! The attach ABI: what the daemon and a client library it did not start
//! agree on, to begin a session in a process that is already running
//! (`record --pid`), and where a client looks for the daemon.
//!
//! Two ways in:
//!
//! * **Signal activation** (the client is preloaded and interposes): the
//!   daemon sends [`ACTIVATION_SIGNAL`] with `sigqueue`, the value being its
//!   id (its pid). At its next allocation the client connects to
//!   [`socket_path_for_id`]`(geteuid(), id)`; a value of 0 (or a plain
//!   `kill`) means `$HEAPPROFD_SOCKET`, else [`DEFAULT_SOCKET_PATH`].
//! * **Injection** (the daemon loaded the client with `dlopen` in a thread it
//!   stopped at a safe point): the daemon makes that thread call the entry
//!   point whose symbol name contains [`ATTACH_ENTRY`], as
//!   `extern "C" fn(id: u32, flags: u32) -> i32`, with [`FLAG_SYNC`] when the
//!   process has one thread. The result is an [`AttachStatus`] code. A
//!   synchronous session is ended by calling the entry named
//!   [`DETACH_ENTRY`], `extern "C" fn() -> i32`, the same way.
//!
//! The per-id socket lives in the private runtime directory of the
//! client's user ([`runtime_dir_for_uid`]), never directly in `/tmp`: only
//! that user (and root) can create or connect to a socket there, and a
//! daemon removes the sockets that killed daemons left behind in it.
//!
//! The client names its connecting/watcher thread [`CLIENT_THREAD_NAME`];
//! the daemon recognises a process that is already being profiled by it.
//!
//! Everything here is constants and allocation-free, panic-free code: the
//! client uses it from its constructor, its hooks and its entry points.

use core::ffi::CStr;
use core::fmt;

/// The activation signal: `__SIGRTMIN + 4` (the kernel's first real-time
/// signal is 32; glibc's `SIGRTMIN()` is 34), the number Android's heapprofd
/// uses.
pub const ACTIVATION_SIGNAL: i32 = 36;

/// The client library's file name: what the daemon loads, installs and
/// looks for in a process's maps, and what the client recognizes as
/// another copy of itself.
pub const CLIENT_FILE_NAME: &str = "libheapprofd_client.so";

/// The bionic front-end's file name as built (`android/`): named apart from
/// [`CLIENT_FILE_NAME`] so both can sit in one directory.
pub const BIONIC_CLIENT_FILE_NAME: &str = "libheapprofd_bionic.so";

/// The name bionic `dlopen`s (`heapprofd_client.so`): what the bionic
/// front-end is installed as on a device.
pub const ANDROID_CLIENT_FILE_NAME: &str = "heapprofd_client.so";

/// Substring of the (Rust-mangled) symbol name of the client's attach entry
/// point, found in the library's `.symtab`; the client's function has
/// exactly this name.
pub const ATTACH_ENTRY: &str = "heapprofd_rs_remote_attach";
/// Substring of the symbol name of the client's detach entry point.
pub const DETACH_ENTRY: &str = "heapprofd_rs_remote_detach";

/// `flags` bit of the attach entry: connect synchronously in the calling
/// thread and create no thread (the process has a single thread; glibc
/// would treat it as multi-threaded for good after a `pthread_create`).
pub const FLAG_SYNC: u32 = 1;

/// What the attach (and detach) entry points return, as an `i32`.
///
/// The daemon turns each code into an error message; codes it does not
/// know are reported by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum AttachStatus {
    /// Attach: the session was started (threaded: the connecting thread was
    /// started). Detach: the session was ended (or there was none).
    Ok = 0,
    /// A session is already active or connecting (another profiler session).
    Busy = 1,
    /// The thread was inside the library (its reentrancy guard is held).
    Reentered = 2,
    /// The program's malloc cannot be reached: its executable defines it
    /// itself (a statically linked allocator).
    OtherAllocator = 3,
    /// The connecting thread could not be created.
    NoThread = 4,
    /// Synchronous mode: the handshake with the daemon failed.
    ConnectFailed = 5,
}

impl AttachStatus {
    /// The `i32` an entry point returns.
    pub const fn code(self) -> i32 {
        self as i32
    }

    /// The status of a returned code, `None` for a code no client returns.
    pub const fn from_code(code: i32) -> Option<AttachStatus> {
        Some(match code {
            0 => AttachStatus::Ok,
            1 => AttachStatus::Busy,
            2 => AttachStatus::Reentered,
            3 => AttachStatus::OtherAllocator,
            4 => AttachStatus::NoThread,
            5 => AttachStatus::ConnectFailed,
            _ => return None,
        })
    }
}

/// Name of the client's connecting/watcher thread, as a C string (for
/// `pthread_setname_np`).
pub const CLIENT_THREAD_NAME_C: &CStr = c"heapprofd-rs";
/// Name of the client's connecting/watcher thread, as `/proc/PID/task/TID/comm`
/// shows it.
pub const CLIENT_THREAD_NAME: &str = match core::str::from_utf8(CLIENT_THREAD_NAME_C.to_bytes()) {
    Ok(s) => s,
    Err(_) => panic!("the client thread name is ASCII"),
};
// Linux thread names hold 15 bytes (TASK_COMM_LEN 16 with the NUL).
const _: () = assert!(CLIENT_THREAD_NAME.len() <= 15);

/// Socket path of a client that is given no path: neither an activation id
/// nor `$HEAPPROFD_SOCKET`.
pub const DEFAULT_SOCKET_PATH: &str = "/tmp/heapprofd-rs.sock";

/// What [`runtime_dir_for_uid`] puts before the user id.
pub const RUNTIME_DIR_PREFIX: &str = "/tmp/heapprofd-rs-";
/// What [`socket_path_for_id`] puts after the id.
pub const ID_SOCKET_PATH_SUFFIX: &str = ".sock";
/// Longest path [`socket_path_for_id`] returns (ten digits of user id,
/// `/`, ten digits of id).
pub const ID_SOCKET_PATH_MAX: usize =
    RUNTIME_DIR_PREFIX.len() + 10 + 1 + 10 + ID_SOCKET_PATH_SUFFIX.len();

/// `/tmp/heapprofd-rs-<uid>`: the private runtime directory (mode 0700,
/// owned by `uid`) where daemons listen for the clients of user `uid`.
/// The daemon creates and checks it; a client only connects inside it.
pub fn runtime_dir_for_uid(uid: u32) -> IdSocketPath {
    let mut p = IdSocketPath {
        buf: [0; ID_SOCKET_PATH_MAX],
        len: 0,
    };
    p.push(RUNTIME_DIR_PREFIX.as_bytes());
    p.push_decimal(uid);
    p
}

/// `/tmp/heapprofd-rs-<uid>/<id>.sock`: where the daemon with that id (its
/// pid) listens for an attached client whose effective user id is `uid`
/// (the client passes its own `geteuid()`; a root daemon attaching to
/// another user's process listens in that user's directory). Both numbers
/// are written in decimal.
pub fn socket_path_for_id(uid: u32, id: u32) -> IdSocketPath {
    let mut p = runtime_dir_for_uid(uid);
    p.push(b"/");
    p.push_decimal(id);
    p.push(ID_SOCKET_PATH_SUFFIX.as_bytes());
    p
}

/// A path from [`socket_path_for_id`] or [`runtime_dir_for_uid`], in a
/// fixed buffer (no allocation).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IdSocketPath {
    buf: [u8; ID_SOCKET_PATH_MAX],
    len: usize,
}

impl IdSocketPath {
    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if let Some(slot) = self.buf.get_mut(self.len) {
                *slot = b;
                self.len += 1;
            }
        }
    }

    fn push_decimal(&mut self, n: u32) {
        let mut digits = [0u8; 10];
        let mut n = n;
        let mut i = digits.len();
        while let Some(next) = i.checked_sub(1) {
            i = next;
            if let Some(d) = digits.get_mut(i) {
                *d = b'0' + (n % 10) as u8;
            }
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(digits.get(i..).unwrap_or(&[]));
    }

    /// The path's bytes (no NUL terminator).
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }

    /// The path (ASCII).
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

impl fmt::Debug for IdSocketPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for IdSocketPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_for_ids() {
        assert_eq!(runtime_dir_for_uid(0).as_str(), "/tmp/heapprofd-rs-0");
        assert_eq!(runtime_dir_for_uid(1000).as_str(), "/tmp/heapprofd-rs-1000");
        assert_eq!(
            socket_path_for_id(0, 0).as_str(),
            "/tmp/heapprofd-rs-0/0.sock"
        );
        assert_eq!(
            socket_path_for_id(1000, 7).as_str(),
            "/tmp/heapprofd-rs-1000/7.sock"
        );
        assert_eq!(
            socket_path_for_id(5, 4242).as_bytes(),
            b"/tmp/heapprofd-rs-5/4242.sock"
        );
        let longest = socket_path_for_id(u32::MAX, u32::MAX);
        assert_eq!(
            longest.as_str(),
            "/tmp/heapprofd-rs-4294967295/4294967295.sock"
        );
        assert_eq!(longest.as_bytes().len(), ID_SOCKET_PATH_MAX);
        assert_eq!(
            format!("{} {longest:?}", socket_path_for_id(1, 10)),
            "/tmp/heapprofd-rs-1/10.sock \"/tmp/heapprofd-rs-4294967295/4294967295.sock\""
        );
    }

    #[test]
    fn activation_signal_is_a_free_real_time_signal() {
        // The kernel's first real-time signal (`__SIGRTMIN`) is 32; glibc
        // keeps 32 and 33 for itself, so its `SIGRTMIN()` is 34. Signal 36
        // is the kernel's + 4, a real-time signal programs may use.
        const KERNEL_SIGRTMIN: i32 = 32;
        assert_eq!(ACTIVATION_SIGNAL, KERNEL_SIGRTMIN + 4);
        assert!((libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&ACTIVATION_SIGNAL));
    }

    #[test]
    fn status_codes_round_trip_and_are_pinned() {
        let all = [
            (AttachStatus::Ok, 0),
            (AttachStatus::Busy, 1),
            (AttachStatus::Reentered, 2),
            (AttachStatus::OtherAllocator, 3),
            (AttachStatus::NoThread, 4),
            (AttachStatus::ConnectFailed, 5),
        ];
        for (status, code) in all {
            assert_eq!(status.code(), code);
            assert_eq!(AttachStatus::from_code(code), Some(status));
        }
        assert_eq!(AttachStatus::from_code(6), None);
        assert_eq!(AttachStatus::from_code(-1), None);
    }

    #[test]
    fn thread_name_forms_agree() {
        assert_eq!(CLIENT_THREAD_NAME, "heapprofd-rs");
        assert_eq!(
            CLIENT_THREAD_NAME_C.to_bytes(),
            CLIENT_THREAD_NAME.as_bytes()
        );
    }
}
