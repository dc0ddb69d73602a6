//! Connecting to the daemon: the handshake, and the notice that a process
//! runs unprofiled.
//!
//! The handshake follows `heapprofd_proto::socket`: send a `Handshake` with
//! our `/proc/self/maps` and `/proc/self/mem` descriptors, receive the
//! `ClientConfig` and the ring-buffer memfd, map it, go active. Sends and
//! receives time out after one second. The thread that connected then stays
//! as the session's watcher (see `watcher`). [`notify_unprofilable`] sends
//! a handshake with a reason and no descriptors on a connection of its
//! own, so `record` can say which process ran unprofiled and why.

use core::ffi::{CStr, c_void};
use core::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use heapprofd_proto::socket;
use heapprofd_proto::wire::{self, ClientConfig, Handshake, Unprofilable};
use heapprofd_shmem::{RingBuffer, WriteMode};
use nix::fcntl::{OFlag, open};
use nix::sys::prctl;
use nix::sys::stat::Mode;
use nix::unistd::getpid;

use crate::session::{self, SessionParams};
use crate::socket_path::SocketPath;

/// ELF `PF_X` (the libc crate names it for glibc only).
const PF_X: u32 = 1;

/// Socket of a handshake in progress, so a forked child can close its copy.
pub(crate) static CONNECTING_FD: AtomicI32 = AtomicI32::new(-1);
/// Handshakes that failed (for debugging).
pub(crate) static CONNECT_FAILURES: AtomicU64 = AtomicU64::new(0);

fn set_timeouts(sock: RawFd, d: Duration) {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: setsockopt with a valid timeval.
        unsafe {
            libc::setsockopt(
                sock,
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                core::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
    }
}

fn open_ro(path: &CStr) -> Option<OwnedFd> {
    open(path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()
}

/// Opens `/proc/self/maps` and `/proc/self/mem`, making the process dumpable
/// for the moment it takes (as heapprofd does): `/proc/self/mem` of a
/// non-dumpable process is owned by root.
fn open_proc_fds() -> Option<(OwnedFd, OwnedFd)> {
    let dumpable = prctl::get_dumpable().unwrap_or(true);
    if !dumpable {
        let _ = prctl::set_dumpable(true);
    }
    let maps = open_ro(c"/proc/self/maps");
    let mem = open_ro(c"/proc/self/mem");
    if !dumpable {
        let _ = prctl::set_dumpable(false);
    }
    Some((maps?, mem?))
}

/// The client library's executable segment, so the daemon can drop our frames.
fn own_text_range() -> (u64, u64) {
    struct Search {
        addr: u64,
        found: (u64, u64),
    }
    unsafe extern "C" fn cb(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> i32 {
        // SAFETY: glibc passes a valid info struct and our `Search`.
        unsafe {
            let s = &mut *data.cast::<Search>();
            let info = &*info;
            for i in 0..info.dlpi_phnum as usize {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type != libc::PT_LOAD || ph.p_flags & PF_X == 0 {
                    continue;
                }
                let start = info.dlpi_addr.wrapping_add(ph.p_vaddr);
                let end = start.wrapping_add(ph.p_memsz);
                if s.addr >= start && s.addr < end {
                    s.found = (start, end);
                    return 1;
                }
            }
        }
        0
    }
    let mut s = Search {
        addr: own_text_range as *const () as u64,
        found: (0, 0),
    };
    // SAFETY: the callback only reads what glibc passes.
    unsafe { libc::dl_iterate_phdr(Some(cb), (&mut s as *mut Search).cast()) };
    s.found
}

/// How much of the ring's data area the connecting thread faults in (the
/// rest is the watcher's): more than the writers fill before the watcher
/// thread gets going, and 0.7 ms of page faults at most.
pub const PREFAULT_HEAD: usize = 1 << 20;

/// Set when the session was wanted by a service's trigger store rather
/// than by `record` ([`quiet`]).
static QUIET: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Failed connections are not reported on stderr from now on: a process
/// that a service's trigger store named (with the client installed
/// system-wide, any program, of any user) must not write to its stderr
/// because the service refused it (another user's profile) or is gone.
pub fn quiet() {
    QUIET.store(true, Ordering::Relaxed);
}

/// Connects and handshakes. On success the session is active and the
/// returned reference holds one writer reference for the watcher.
pub fn connect(path: &SocketPath, flags: u32) -> Option<&'static session::Session> {
    let result = try_connect(path, flags);
    if result.is_none() {
        CONNECT_FAILURES.fetch_add(1, Ordering::Relaxed);
        if !QUIET.load(Ordering::Relaxed) {
            crate::log::log(
                b"heapprofd-rs: could not start a session with ",
                path.as_bytes(),
            );
        }
    }
    result
}

fn try_connect(path: &SocketPath, flags: u32) -> Option<&'static session::Session> {
    // SAFETY: socket() has no memory preconditions.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    CONNECTING_FD.store(raw, Ordering::SeqCst);
    let r = handshake(raw, path, flags);
    CONNECTING_FD.store(-1, Ordering::SeqCst);
    let params = r?;
    // The session owns the socket from now on.
    core::mem::forget(sock);
    let s = session::activate(params)?;
    // One wake byte says "active" (the hooks record from now on): the
    // daemon may wait for it before it tells anyone the profile started.
    let b = socket::WAKE_BYTE;
    // SAFETY: one byte from a local on the session's socket.
    unsafe {
        libc::send(
            s.sock,
            (&b as *const u8).cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    // Custom heaps registered before the session: declared, enabled.
    crate::heaps::session_started(s);
    Some(s)
}

/// The process listening is root's or our own effective user's: we are
/// about to hand it our `/proc/self/mem`. (A socket path can be chosen by
/// the environment, which a set-user-ID program ignores, or found in a
/// trigger store's directory; this is the check that holds either way.)
fn daemon_trusted(sock: RawFd) -> bool {
    // SAFETY: a zeroed ucred for the kernel to fill, with its length.
    let mut cred: libc::ucred = unsafe { core::mem::zeroed() };
    let mut len = core::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    rc == 0 && (cred.uid == 0 || cred.uid == euid)
}

/// Connects `sock` to `path` with one-second send and receive timeouts.
fn dial(sock: RawFd, path: &SocketPath) -> bool {
    set_timeouts(sock, Duration::from_secs(1));
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, &src) in addr.sun_path.iter_mut().zip(path.as_bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: a valid address of the right length.
    let rc = unsafe {
        libc::connect(
            sock,
            (&addr as *const libc::sockaddr_un).cast(),
            core::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    rc == 0 && daemon_trusted(sock)
}

/// Tells the daemon at `path` that process `pid` (this one, or a child it
/// just spawned) runs unprofiled, and why. Raw system calls on the stack
/// only (no allocation, no lock): callable between `fork` and `exec`, in a
/// `vfork` child, in an exec hook. Returns whether the daemon got it
/// (then it says so itself).
pub fn notify_unprofilable(path: &SocketPath, pid: u32, why: Unprofilable) -> bool {
    let Some(arch) = wire::Arch::native() else {
        return false;
    };
    // SAFETY: socket() has no memory preconditions.
    let sock = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return false;
    }
    let mut sent = false;
    if dial(sock, path) {
        let hs = Handshake {
            version: wire::version::CURRENT,
            pid,
            arch,
            page_size: heapprofd_shmem::page_size() as u32,
            flags: 0,
            client_text_start: 0,
            client_text_end: 0,
            unprofilable: why,
        };
        sent = socket::send_with_fds(sock, &hs.encode(), &[]).is_ok();
        // Wait (bounded by the receive timeout) for the daemon to close
        // the connection: it has read the notice before this process
        // execs or exits.
        let mut b = [0u8; 1];
        // SAFETY: reading into our own byte.
        unsafe { libc::recv(sock, b.as_mut_ptr().cast(), 1, 0) };
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(sock) };
    sent
}

fn handshake(sock: RawFd, path: &SocketPath, flags: u32) -> Option<SessionParams> {
    if !dial(sock, path) {
        return None;
    }
    let (maps, mem) = open_proc_fds()?;
    let (text_start, text_end) = own_text_range();
    crate::mapsask::connecting();
    let pid = getpid().as_raw();
    let hs = Handshake {
        version: wire::version::CURRENT,
        pid: pid as u32,
        arch: wire::Arch::native()?,
        page_size: heapprofd_shmem::page_size() as u32,
        flags,
        client_text_start: text_start,
        client_text_end: text_end,
        unprofilable: Unprofilable::None,
    };
    use std::os::fd::AsRawFd;
    socket::send_with_fds(sock, &hs.encode(), &[maps.as_raw_fd(), mem.as_raw_fd()]).ok()?;
    drop((maps, mem));
    let mut buf = [0u8; ClientConfig::ENCODED_LEN];
    let mut fds: [Option<OwnedFd>; 1] = [None];
    let n = socket::recv_with_fds(sock, &mut buf, &mut fds).ok()?;
    let cfg = ClientConfig::decode(&buf).ok()?;
    let memfd = if n == 1 { fds[0].take()? } else { return None };
    let rb = RingBuffer::attach(&memfd).ok()?;
    drop(memfd);
    // The head of the ring is faulted in here, before the program goes on;
    // the watcher thread faults in the rest as soon as it runs
    // (`watcher::watch`), ahead of the writers, which start at the head.
    // Faulting the ring in as used (tried: 3-14 ms less at every start)
    // made the writers of a multi-threaded program block: 4 threads on 2
    // cores at 512 KiB were blocked 120-420 ms per run against 0-7 ms with
    // the ring faulted in, though no ring filled. Faulting all of it in
    // here cost every start 5-6 ms (8 MiB ring).
    rb.prefault_head(PREFAULT_HEAD);
    let write_mode = if cfg.block_client() {
        WriteMode::Block {
            timeout: (cfg.block_timeout_us != 0)
                .then(|| Duration::from_micros(cfg.block_timeout_us)),
        }
    } else {
        WriteMode::Drop
    };
    Some(SessionParams {
        pid,
        sock,
        interval: cfg.interval_for(wire::HEAP_LIBC_MALLOC_NAME),
        seed: cfg.seed,
        config: cfg,
        max_stack: cfg.max_stack_bytes,
        write_mode,
        rb,
    })
}
