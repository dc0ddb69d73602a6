//! The startup trigger: whether a running profiling service wants this
//! process from its first allocation (the Linux stand-in for bionic's
//! `heapprofd.enable` / `heapprofd.enable.<name>` properties), and where
//! that service listens.
//!
//! Called once, from the constructor of a preloaded (interposing) library,
//! before the program's `main`. Everything is raw system calls
//! (`syscall(SYS_openat | SYS_fstat | SYS_read | SYS_close)`, not even
//! glibc's wrappers, which a program's own preloaded interposer may have
//! replaced) into fixed buffers on the stack: nothing allocates, nothing
//! enters a hook. On a machine without a service the cost is one failed
//! `openat` per directory looked at (two: [`SYSTEM_DIR`] and the user's
//! runtime directory, or one with `$HEAPPROFD_SERVICE_DIR`).
//!
//! A store is trusted only if it is a regular file (opened `O_NOFOLLOW`,
//! `O_NONBLOCK` so a FIFO cannot block the program) owned by root or by our
//! effective user, writable by nobody else. The process's name comes from
//! `/proc/self/cmdline` ([`heapprofd_proto::triggers::process_name`]), read
//! only when a trusted store exists. The format and the matching are
//! [`heapprofd_proto::triggers`]; the directories [`heapprofd_proto::service`].

use heapprofd_proto::attach::RUNTIME_DIR_PREFIX;
use heapprofd_proto::service::{CLIENT_SOCKET, DIR_ENV, SYSTEM_DIR, TRIGGERS_FILE};
use heapprofd_proto::triggers::{CMDLINE_READ_MAX, StartupMatch, process_name};

use crate::socket_path::SocketPath;

/// `$HEAPPROFD_SERVICE_DIR`, as a C string for `getenv`.
const DIR_ENV_C: &core::ffi::CStr = c"HEAPPROFD_SERVICE_DIR";
const _: () = assert!(DIR_ENV_C.to_bytes().len() == DIR_ENV.len());

/// Longest directory path considered (the socket inside must fit
/// `sun_path`).
const DIR_MAX: usize = 96;
/// Read buffer for the store; a longer line is ignored.
const CHUNK: usize = 4096;

/// A NUL-terminated path in a fixed buffer.
struct CPath {
    buf: [u8; 128],
    len: usize,
}

impl CPath {
    fn new() -> CPath {
        CPath {
            buf: [0; 128],
            len: 0,
        }
    }

    /// Appends `b`; `false` if it does not fit (the NUL included).
    fn push(&mut self, b: &[u8]) -> bool {
        let end = self.len + b.len();
        let cap = self.buf.len();
        match self.buf.get_mut(self.len..end) {
            Some(dst) if end < cap => {
                dst.copy_from_slice(b);
                self.len = end;
                true
            }
            _ => false,
        }
    }

    fn push_decimal(&mut self, mut n: u32) -> bool {
        let mut digits = [0u8; 10];
        let mut i = digits.len();
        loop {
            i -= 1;
            if let Some(d) = digits.get_mut(i) {
                *d = b'0' + (n % 10) as u8;
            }
            n /= 10;
            if n == 0 || i == 0 {
                break;
            }
        }
        self.push(digits.get(i..).unwrap_or(&[]))
    }

    fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }

    /// The path with its NUL (the buffer is zeroed past `len`).
    fn as_ptr(&self) -> *const libc::c_char {
        self.buf.as_ptr().cast()
    }
}

/// The directories looked at, in order (see the module docs).
fn directories(each: &mut dyn FnMut(&[u8]) -> bool) {
    if let Some(dir) = crate::env::get(DIR_ENV_C) {
        each(dir);
        return;
    }
    if each(SYSTEM_DIR.as_bytes()) {
        return;
    }
    let mut user = CPath::new();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::syscall(libc::SYS_geteuid) } as u32;
    if user.push(RUNTIME_DIR_PREFIX.as_bytes()) && user.push_decimal(euid) {
        each(user.as_bytes());
    }
}

/// The service socket of the first directory whose trigger store wants this
/// process, if any.
pub fn startup_service() -> Option<SocketPath> {
    let mut name_buf = [0u8; CMDLINE_READ_MAX];
    let mut name_len: Option<usize> = None;
    let mut found = None;
    directories(&mut |dir| {
        let Some(fd) = open_store(dir) else {
            return false;
        };
        let n = *name_len.get_or_insert_with(|| read_cmdline(&mut name_buf));
        let name = process_name(name_buf.get(..n).unwrap_or(&[]));
        let mut m = StartupMatch::new(name);
        feed_lines(fd, &mut m);
        close(fd);
        if m.wanted() {
            found = service_socket_in(dir);
        }
        found.is_some()
    });
    found
}

/// The service socket of the first directory holding a trusted trigger
/// store: where a wake-up for "the service" (signal value 0, attach id 0)
/// connects.
pub fn service_socket() -> Option<SocketPath> {
    let mut found = None;
    directories(&mut |dir| {
        if let Some(fd) = open_store(dir) {
            close(fd);
            found = service_socket_in(dir);
        }
        found.is_some()
    });
    found
}

fn service_socket_in(dir: &[u8]) -> Option<SocketPath> {
    let mut p = CPath::new();
    (p.push(dir) && p.push(b"/") && p.push(CLIENT_SOCKET.as_bytes()))
        .then(|| SocketPath::from_bytes(p.as_bytes()))
        .flatten()
}

/// Opens `<dir>/triggers` if it is a store we may trust; the descriptor.
fn open_store(dir: &[u8]) -> Option<i32> {
    if dir.is_empty() || dir.len() > DIR_MAX || dir.first() != Some(&b'/') {
        return None;
    }
    let mut p = CPath::new();
    if !(p.push(dir) && p.push(b"/") && p.push(TRIGGERS_FILE.as_bytes())) {
        return None;
    }
    let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    // SAFETY: a NUL-terminated path in our buffer; no memory is written.
    let fd = unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, p.as_ptr(), flags, 0) };
    if fd < 0 {
        return None;
    }
    let fd = fd as i32;
    if trusted(fd) {
        Some(fd)
    } else {
        close(fd);
        None
    }
}

/// `fstat`'s system call number (the libc crate does not name it for
/// aarch64 Android; the kernel's generic table has it as 80).
#[cfg(all(target_os = "android", target_arch = "aarch64"))]
const SYS_FSTAT: libc::c_long = 80;
#[cfg(not(all(target_os = "android", target_arch = "aarch64")))]
const SYS_FSTAT: libc::c_long = libc::SYS_fstat;

/// A regular file owned by root or by us, writable by nobody else.
fn trusted(fd: i32) -> bool {
    // SAFETY: a zeroed stat buffer of the right type for the kernel to fill.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat writes only into `st`.
    let rc = unsafe { libc::syscall(SYS_FSTAT, fd, &mut st as *mut libc::stat) };
    if rc != 0 {
        return false;
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::syscall(libc::SYS_geteuid) } as u32;
    st.st_mode & libc::S_IFMT == libc::S_IFREG
        && (st.st_uid == 0 || st.st_uid == euid)
        && st.st_mode & 0o022 == 0
}

/// Reads up to `buf.len()` bytes of `/proc/self/cmdline`; the length.
fn read_cmdline(buf: &mut [u8]) -> usize {
    let flags = libc::O_RDONLY | libc::O_CLOEXEC;
    let path = c"/proc/self/cmdline";
    // SAFETY: a static NUL-terminated path.
    let fd = unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path.as_ptr(), flags, 0) };
    if fd < 0 {
        return 0;
    }
    let mut len = 0;
    while let Some(rest) = buf.get_mut(len..).filter(|r| !r.is_empty()) {
        let n = read(fd as i32, rest);
        if n == 0 {
            break;
        }
        len += n;
    }
    close(fd as i32);
    len
}

/// Feeds the store's lines to `m` until it is decided or the file ends.
fn feed_lines(fd: i32, m: &mut StartupMatch<'_>) {
    let mut buf = [0u8; CHUNK];
    let mut filled = 0;
    // A line longer than the buffer: skip to its end.
    let mut skipping = false;
    while m.undecided() {
        let Some(room) = buf.get_mut(filled..).filter(|r| !r.is_empty()) else {
            // The buffer holds one unfinished line: too long to match.
            m.line(&[]);
            skipping = true;
            filled = 0;
            continue;
        };
        let n = read(fd, room);
        if n == 0 {
            if filled > 0 && !skipping {
                m.line(buf.get(..filled).unwrap_or(&[]));
            }
            return;
        }
        filled += n;
        let mut start = 0;
        while let Some(nl) = buf
            .get(start..filled)
            .and_then(|b| b.iter().position(|&c| c == b'\n'))
        {
            if !skipping {
                m.line(buf.get(start..start + nl).unwrap_or(&[]));
            }
            skipping = false;
            start += nl + 1;
            if !m.undecided() {
                return;
            }
        }
        buf.copy_within(start..filled, 0);
        filled -= start;
    }
}

/// `read(2)` retried on EINTR; 0 at the end or on an error.
fn read(fd: i32, buf: &mut [u8]) -> usize {
    loop {
        // SAFETY: reads into our own buffer, within its length.
        let n = unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len()) };
        if n >= 0 {
            return n as usize;
        }
        if crate::errno::get() != libc::EINTR {
            return 0;
        }
    }
}

fn close(fd: i32) {
    // SAFETY: closing a descriptor we opened.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn store(dir: &std::path::Path, text: &[u8], mode: u32) {
        let p = dir.join(TRIGGERS_FILE);
        let _ = std::fs::remove_file(&p);
        let mut f = std::fs::File::create(&p).expect("store");
        f.write_all(text).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    fn dir_str(d: &tempfile::TempDir) -> Vec<u8> {
        d.path().to_str().expect("utf-8").as_bytes().to_vec()
    }

    fn matches(fd: i32, name: &[u8]) -> bool {
        let mut m = StartupMatch::new(name);
        feed_lines(fd, &mut m);
        close(fd);
        m.wanted()
    }

    #[test]
    fn reads_trusted_stores_only() {
        let d = tempfile::tempdir().expect("dir");
        let dir = dir_str(&d);
        assert!(open_store(&dir).is_none(), "no store");
        store(d.path(), b"heapprofd-rs triggers 1\nname 1 prog\n", 0o644);
        let fd = open_store(&dir).expect("a 0644 store of ours");
        assert!(matches(fd, b"prog"));
        let fd = open_store(&dir).expect("again");
        assert!(!matches(fd, b"other"));
        store(d.path(), b"heapprofd-rs triggers 1\nall 1\n", 0o666);
        assert!(open_store(&dir).is_none(), "writable by others");
        store(d.path(), b"heapprofd-rs triggers 1\nall 1\n", 0o620);
        assert!(open_store(&dir).is_none(), "writable by the group");
        assert!(open_store(b"relative").is_none());
        let link = d.path().join("l");
        std::fs::create_dir(&link).expect("subdir");
        std::os::unix::fs::symlink(d.path().join(TRIGGERS_FILE), link.join(TRIGGERS_FILE))
            .expect("symlink");
        let mut l = dir.clone();
        l.extend_from_slice(b"/l");
        assert!(open_store(&l).is_none(), "a symlink is not followed");
        let sock = service_socket_in(&dir).expect("path");
        assert!(sock.as_bytes().ends_with(b"/client.sock"));
    }

    #[test]
    fn long_lines_and_chunk_boundaries() {
        let d = tempfile::tempdir().expect("dir");
        let dir = dir_str(&d);
        let mut text = b"heapprofd-rs triggers 1\n".to_vec();
        // A line longer than the read buffer, then names that straddle
        // chunk boundaries.
        text.extend_from_slice(b"name 1 ");
        text.extend(std::iter::repeat_n(b'x', 3 * CHUNK));
        text.push(b'\n');
        for i in 0..2000 {
            text.extend_from_slice(format!("name 1 p{i}\n").as_bytes());
        }
        text.extend_from_slice(b"name 1 last");
        store(d.path(), &text, 0o644);
        for (name, want) in [
            (&b"p0"[..], true),
            (b"p1234", true),
            (b"p1999", true),
            (b"last", true),
            (b"p2000", false),
            (b"xxxx", false),
        ] {
            let fd = open_store(&dir).expect("store");
            assert_eq!(matches(fd, name), want, "{}", String::from_utf8_lossy(name));
        }
    }

    #[test]
    fn cmdline_of_the_test_process() {
        let mut buf = [0u8; CMDLINE_READ_MAX];
        let n = read_cmdline(&mut buf);
        let exe = std::env::args().next().expect("argv0");
        let name = process_name(&buf[..n]);
        assert_eq!(
            name,
            std::path::Path::new(&exe)
                .file_name()
                .expect("name")
                .as_encoded_bytes()
        );
    }
}
