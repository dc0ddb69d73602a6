//! Connecting to the daemon: socket path, handshake, and the watcher thread.
//!
//! The handshake follows `heapprofd_proto::socket`: send a `Handshake` with
//! our `/proc/self/maps` and `/proc/self/mem` descriptors, receive the
//! `ClientConfig` and the ring-buffer memfd, map it, go active. Sends and
//! receives time out after one second. The thread that connected then stays
//! as the session's watcher: it sleeps in `poll` on the socket and tears the
//! session down when the daemon closes it or dies, so the hooks go back to
//! pass-through even if the program never allocates again (and a writer
//! blocked on a full buffer is released). In a process where the library
//! does not interpose (attach), the watcher also patches the GOTs when the
//! session starts, patches objects loaded later, and restores every entry
//! when the session ends, before the thread exits (`got`).
//!
//! Threads are created with `pthread_create` directly, not `std::thread`:
//! std's thread bookkeeping uses global-dynamic TLS, which must not be linked
//! into the library (see `tls`).

use core::ffi::c_void;
use core::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use heapprofd_proto::attach::{CLIENT_THREAD_NAME_C, DEFAULT_SOCKET_PATH, socket_path_for_id};
use heapprofd_proto::socket;
use heapprofd_proto::wire::{self, ClientConfig, Handshake};
use heapprofd_shmem::{RingBuffer, WriteMode};

use crate::session::{self, CONNECTING, IDLE, SessionParams};
use crate::tls::Guard;

/// Environment variable: socket path (see `heapprofd_proto::socket::SOCKET_ENV`).
pub(crate) const SOCKET_ENV: &core::ffi::CStr = c"HEAPPROFD_SOCKET";
const _: () = assert!(SOCKET_ENV.to_bytes().len() == socket::SOCKET_ENV.len());

/// A socket path in a fixed buffer (`sun_path` size, NUL-terminated).
#[derive(Clone, Copy)]
pub(crate) struct SocketPath {
    buf: [u8; 108],
    len: usize,
}

impl core::fmt::Debug for SocketPath {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

impl SocketPath {
    pub(crate) fn from_bytes(b: &[u8]) -> Option<SocketPath> {
        if b.is_empty() || b.len() >= 108 || b.contains(&0) {
            return None;
        }
        let mut buf = [0u8; 108];
        buf.get_mut(..b.len())?.copy_from_slice(b);
        Some(SocketPath { buf, len: b.len() })
    }

    /// `/tmp/heapprofd-rs-<id>.sock`, the path of the daemon with that id
    /// (its pid) for a `sigqueue` activation (the attach ABI's rule).
    pub(crate) fn for_id(id: u32) -> SocketPath {
        SocketPath::from_bytes(socket_path_for_id(id).as_bytes()).unwrap_or(SocketPath {
            buf: [0; 108],
            len: 0,
        })
    }

    /// `$HEAPPROFD_SOCKET` or the default path.
    pub(crate) fn from_env_or_default() -> SocketPath {
        crate::getenv_bytes(SOCKET_ENV)
            .and_then(SocketPath::from_bytes)
            .or_else(|| SocketPath::from_bytes(DEFAULT_SOCKET_PATH.as_bytes()))
            .unwrap_or(SocketPath {
                buf: [0; 108],
                len: 0,
            })
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
}

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

fn open_ro(path: &core::ffi::CStr) -> Option<OwnedFd> {
    // SAFETY: valid NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    // SAFETY: a fresh descriptor we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `/proc/self/maps` and `/proc/self/mem`, making the process dumpable
/// for the moment it takes (as heapprofd does): `/proc/self/mem` of a
/// non-dumpable process is owned by root.
fn open_proc_fds() -> Option<(OwnedFd, OwnedFd)> {
    // SAFETY: prctl with integer arguments.
    let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE) };
    if dumpable == 0 {
        // SAFETY: as above.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1) };
    }
    let maps = open_ro(c"/proc/self/maps");
    let mem = open_ro(c"/proc/self/mem");
    if dumpable == 0 {
        // SAFETY: as above.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) };
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
                if ph.p_type != libc::PT_LOAD || ph.p_flags & libc::PF_X == 0 {
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

/// Connects and handshakes. On success the session is active and the
/// returned reference holds one writer reference for the watcher.
pub(crate) fn connect(path: &SocketPath, flags: u32) -> Option<&'static session::Session> {
    let result = try_connect(path, flags);
    if result.is_none() {
        CONNECT_FAILURES.fetch_add(1, Ordering::Relaxed);
        crate::log(
            b"heapprofd-rs: could not start a session with ",
            path.as_bytes(),
        );
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
    Some(s)
}

fn handshake(sock: RawFd, path: &SocketPath, flags: u32) -> Option<SessionParams> {
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
    if rc != 0 {
        return None;
    }
    let (maps, mem) = open_proc_fds()?;
    let (text_start, text_end) = own_text_range();
    // SAFETY: getpid/sysconf have no preconditions.
    let pid = unsafe { libc::getpid() };
    let hs = Handshake {
        version: wire::version::CURRENT,
        pid: pid as u32,
        arch: wire::Arch::native()?,
        page_size: heapprofd_shmem::page_size() as u32,
        flags,
        client_text_start: text_start,
        client_text_end: text_end,
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
    // Take the first-touch page faults here rather than in sampled
    // allocations (a fault costs microseconds; best effort).
    rb.prefault();
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
        interval: cfg.interval_for(wire::HEAP_LIBC_MALLOC_NAME).max(1),
        seed: cfg.seed,
        max_stack: cfg.max_stack_bytes,
        write_mode,
        rb,
    })
}

/// Waits on the session's socket until the daemon closes it (or the session
/// ends some other way), then tears down and drops the watcher's reference.
pub(crate) fn watch(s: &'static session::Session) {
    let mut sink = [0u8; 64];
    while !session::is_retired(s) {
        let mut pfd = libc::pollfd {
            fd: s.sock,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // While the GOTs are patched, objects loaded meanwhile are looked
        // for on every timeout.
        let timeout = if crate::got::is_active() {
            crate::got::POLL_MS
        } else {
            1000
        };
        // SAFETY: one valid pollfd; the socket stays open while we hold our
        // writer reference. The timeout bounds how long a retired session
        // keeps this thread.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout) };
        if n < 0 {
            if crate::errno() == libc::EINTR {
                continue;
            }
            s.teardown(None);
            break;
        }
        if n == 0 {
            crate::got::poll_new_objects();
            continue;
        }
        if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP | libc::POLLNVAL) != 0 {
            s.teardown(None);
            break;
        }
        // The daemon sends nothing after the configuration: EOF or junk.
        // SAFETY: reading into our own buffer.
        let r = unsafe {
            libc::recv(
                s.sock,
                sink.as_mut_ptr().cast(),
                sink.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r == 0 || (r < 0 && !matches!(crate::errno(), libc::EAGAIN | libc::EINTR)) {
            s.teardown(None);
            break;
        }
    }
    session::release(s);
}

/// What a connecting thread is asked to do.
#[derive(Debug, Clone, Copy)]
struct Job {
    path: SocketPath,
    flags: u32,
    /// The session to watch, already connected by the constructor (its
    /// watcher reference passes to the thread); `None`: connect first.
    session: Option<&'static session::Session>,
}

/// Starts a thread that connects (if `session` is `None`) and then watches
/// the session. Call with the guard held: `pthread_create` allocates.
/// Returns false if the thread could not be created.
pub(crate) fn spawn(
    path: SocketPath,
    flags: u32,
    session: Option<&'static session::Session>,
) -> bool {
    debug_assert!(Guard::held());
    let job: Box<Job> = Box::new(Job {
        path,
        flags,
        session,
    });
    let arg = Box::into_raw(job);
    // SAFETY: standard pthread creation; the thread takes ownership of `arg`.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 256 * 1024);
        // Block every signal in the new thread: the program's handlers must
        // not run on it (it holds the guard, so they could not be profiled).
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut th: libc::pthread_t = 0;
        let rc = libc::pthread_create(&mut th, &attr, thread_main, arg.cast());
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 {
            drop(Box::from_raw(arg));
            return false;
        }
    }
    true
}

extern "C" fn thread_main(arg: *mut c_void) -> *mut c_void {
    // Everything this thread does passes through the hooks untouched.
    let _g = Guard::enter();
    // SAFETY: `spawn` passed a leaked Box<Job> that we now own.
    let job = unsafe { Box::from_raw(arg.cast::<Job>()) };
    // SAFETY: naming our own thread with a short NUL-terminated name.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), CLIENT_THREAD_NAME_C.as_ptr()) };
    // Loaded without interposing (attach): the program's GOT entries are
    // redirected for the session and put back after it. Before connecting
    // (the hooks pass through until the session is active), so that when
    // the daemon sees the session, every object is patched.
    let patched = crate::got::on_session_start();
    let session = match patched {
        Ok(()) => job.session.or_else(|| connect(&job.path, job.flags)),
        Err(_) => {
            crate::log(
                b"heapprofd-rs: ",
                b"the program's malloc is not glibc's; profiling refused",
            );
            if let Some(s) = job.session {
                s.teardown(None);
                session::release(s);
            }
            None
        }
    };
    match session {
        Some(s) => watch(s),
        None => {
            let _ = session::STATE.compare_exchange(
                CONNECTING,
                IDLE,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
    }
    crate::got::on_session_end();
    core::ptr::null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths() {
        assert_eq!(
            SocketPath::for_id(4242).as_bytes(),
            b"/tmp/heapprofd-rs-4242.sock"
        );
        assert_eq!(
            SocketPath::for_id(7).as_bytes(),
            b"/tmp/heapprofd-rs-7.sock"
        );
        assert_eq!(
            SocketPath::for_id(u32::MAX).as_bytes(),
            b"/tmp/heapprofd-rs-4294967295.sock"
        );
        assert!(SocketPath::from_bytes(b"").is_none());
        assert!(SocketPath::from_bytes(&[b'a'; 108]).is_none());
        assert!(SocketPath::from_bytes(b"a\0b").is_none());
        assert_eq!(SocketPath::from_bytes(b"/x").unwrap().as_bytes(), b"/x");
    }
}
