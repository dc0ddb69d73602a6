//! Programs that cannot load the client whatever their environment says:
//! a statically linked program (the loader never runs), a 32-bit one (the
//! library is 64-bit), a set-user-ID or set-group-ID one (the loader
//! ignores `LD_PRELOAD` paths in secure mode).
//!
//! The exec hooks ([`check`] the program about to run, then [`report`]
//! it) name such a program on stderr and tell the daemon
//! (`connect::notify_unprofilable`) which process runs unprofiled and
//! why: the calling process for an exec (the pid stays), the child for a
//! `posix_spawn`. Only when the process was started to be profiled with
//! its children (`inherit::active`). Raw system calls and stack buffers
//! only: this runs between `fork` and `exec` and in `vfork` children.

use core::ffi::{CStr, c_char, c_int};

use heapprofd_client_core::connect;
use heapprofd_proto::wire::Unprofilable;

use crate::inherit::{self, Writer};

/// The program exec would run for `file`: itself if it contains a `/`,
/// else the first executable `dir/file` of `PATH` (glibc's default when
/// unset), built in `buf`.
pub(crate) fn search_path<'a>(file: &'a CStr, buf: &'a mut [u8; 4096]) -> Option<&'a CStr> {
    let name = file.to_bytes();
    if name.contains(&b'/') {
        return Some(file);
    }
    let path = heapprofd_client_core::env::get(c"PATH").unwrap_or(b"/bin:/usr/bin");
    let mut found = None;
    for dir in path.split(|&b| b == b':') {
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        let len = dir.len() + 1 + name.len();
        if len + 1 > buf.len() {
            continue;
        }
        buf[..dir.len()].copy_from_slice(dir);
        buf[dir.len()] = b'/';
        buf[dir.len() + 1..len].copy_from_slice(name);
        buf[len] = 0;
        // SAFETY: a NUL-terminated path in our buffer.
        if unsafe { libc::access(buf.as_ptr().cast(), libc::X_OK) } == 0 {
            found = Some(len);
            break;
        }
    }
    let len = found?;
    CStr::from_bytes_with_nul(&buf[..=len]).ok()
}

/// Why the program `path` (opened at `dirfd`, or `fd` itself when `path`
/// is null) cannot load the client, if it cannot.
pub(crate) fn check(dirfd: c_int, path: *const c_char, fd: c_int) -> Option<Unprofilable> {
    if !inherit::active() {
        return None;
    }
    let own_fd = if path.is_null() {
        -1
    } else {
        // SAFETY: openat with a NUL-terminated path.
        unsafe { libc::openat(dirfd, path, libc::O_RDONLY | libc::O_CLOEXEC) }
    };
    let f = if path.is_null() { fd } else { own_fd };
    if f < 0 {
        return None;
    }
    let why = unprofilable(f);
    if own_fd >= 0 {
        // SAFETY: our own descriptor.
        unsafe { libc::close(own_fd) };
    }
    why
}

/// Tells the daemon that process `pid` runs unprofiled (it is about to
/// run `path`, null when exec'd by descriptor); says it on stderr itself
/// when the daemon cannot be told.
pub(crate) fn report(why: Unprofilable, path: *const c_char, pid: u32) {
    if let Some(socket) = inherit::socket_path()
        && connect::notify_unprofilable(&socket, pid, why)
    {
        return;
    }
    let mut line = [0u8; 600];
    let mut w = Writer {
        buf: &mut line,
        at: 0,
    };
    w.put(b"heapprofd-rs: pid ");
    w.put(decimal(pid, &mut [0; 10]));
    w.put(b" runs unprofiled: ");
    w.put(why.describe().as_bytes());
    w.put(b" (");
    if path.is_null() {
        w.put(b"exec'd by descriptor");
    } else {
        // SAFETY: a NUL-terminated path.
        let p = unsafe { CStr::from_ptr(path) }.to_bytes();
        w.put(&p[..p.len().min(300)]);
    }
    w.put(b")");
    let n = w.at;
    heapprofd_client_core::log::log(&line[..n], b"");
}

/// Why the program open at `fd` cannot load the client, if it cannot.
fn unprofilable(fd: c_int) -> Option<Unprofilable> {
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    if (st.st_mode & libc::S_ISUID != 0 && st.st_uid != uid)
        || (st.st_mode & libc::S_ISGID != 0 && st.st_gid != gid)
    {
        return Some(Unprofilable::SecureExec);
    }
    let mut h = [0u8; 64];
    // SAFETY: reading into our buffer.
    let n = unsafe { libc::pread(fd, h.as_mut_ptr().cast(), h.len(), 0) };
    if n < 64 || h[..4] != *b"\x7fELF" {
        return None; // a script: its interpreter is what runs
    }
    if h[4] != 2 {
        return Some(Unprofilable::Program32Bit);
    }
    let phoff = u64::from_le_bytes(h[32..40].try_into().ok()?);
    let phentsize = usize::from(u16::from_le_bytes([h[54], h[55]]));
    let phnum = usize::from(u16::from_le_bytes([h[56], h[57]]));
    if phentsize < 56 || phnum == 0 {
        return None;
    }
    let mut ph = [0u8; 56];
    for i in 0..phnum.min(128) {
        let off = phoff.checked_add((i * phentsize) as u64)?;
        // SAFETY: reading into our buffer.
        let n = unsafe { libc::pread(fd, ph.as_mut_ptr().cast(), ph.len(), off as libc::off_t) };
        if n < 56 {
            return None;
        }
        if u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) == libc::PT_INTERP {
            return None;
        }
    }
    Some(Unprofilable::StaticProgram)
}

/// `v` in decimal, in `buf`.
fn decimal(mut v: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 || i == 0 {
            break;
        }
    }
    &buf[i..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals() {
        assert_eq!(decimal(0, &mut [0; 10]), b"0");
        assert_eq!(decimal(4_294_967_295, &mut [0; 10]), b"4294967295");
    }

    #[test]
    fn path_search_finds_sh() {
        let mut buf = [0u8; 4096];
        let p = search_path(c"sh", &mut buf).expect("sh on PATH");
        assert!(p.to_bytes().ends_with(b"/sh"));
        let mut buf = [0u8; 4096];
        assert_eq!(search_path(c"/x/y", &mut buf), Some(c"/x/y"));
    }

    #[test]
    fn unprofilable_programs_are_told_apart() {
        let open = |p: &CStr| {
            // SAFETY: open with a NUL-terminated path.
            unsafe { libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) }
        };
        // A dynamically linked program (the shell) is fine.
        let fd = open(c"/bin/sh");
        assert!(fd >= 0);
        assert_eq!(unprofilable(fd), None);
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        // ld.so itself has no PT_INTERP: it reads as statically linked.
        let fd = open(c"/lib64/ld-linux-x86-64.so.2");
        if fd >= 0 {
            assert!(unprofilable(fd).is_some());
            // SAFETY: our descriptor.
            unsafe { libc::close(fd) };
        }
    }
}
