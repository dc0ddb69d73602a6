//! A client of the daemon's socket protocol written for abuse
//! (`tests/tests/hostile_peers.rs`): handshakes with whatever descriptors
//! and timing a test chooses, and a real session whose ring-buffer records
//! a test makes up.
//!
//! Everything here speaks the protocol of `heapprofd_proto::socket` from
//! the test process itself, so the daemon sees the test's pid and user.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use heapprofd_proto::socket::{WAKE_BYTE, recv_with_fds, send_with_fds};
use heapprofd_proto::wire::{
    Arch, ClientConfig, Handshake, HeapNameRecord, MallocHeader, RegisterFile, heap_name_field,
    version, x86_64,
};
use heapprofd_shmem::{RingBuffer, WriteMode};

/// Connects to the daemon's socket.
pub fn connect(socket: &Path) -> UnixStream {
    UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()))
}

/// Our handshake message (the test process's own pid).
pub fn handshake() -> Handshake {
    Handshake {
        version: version::CURRENT,
        pid: std::process::id(),
        arch: Arch::native().expect("a supported architecture"),
        page_size: 4096,
        flags: 0,
        client_text_start: 0,
        client_text_end: 0,
        unprofilable: heapprofd_proto::wire::Unprofilable::None,
    }
}

/// Sends the handshake with `fds` attached (in place of the maps and mem
/// descriptors a client sends). Errors are returned: the daemon may have
/// closed the connection already.
pub fn send_handshake(sock: &UnixStream, fds: &[RawFd]) -> std::io::Result<()> {
    send_with_fds(sock.as_raw_fd(), &handshake().encode(), fds)
}

/// Waits up to `timeout` for the daemon's answer to a handshake: `Some(true)`
/// a configuration came (the daemon accepted it), `Some(false)` the
/// connection was closed (refused), `None` nothing yet.
pub fn answer(sock: &UnixStream, timeout: Duration) -> Option<bool> {
    sock.set_read_timeout(Some(timeout)).expect("read timeout");
    let mut buf = [0u8; ClientConfig::ENCODED_LEN];
    let mut fds: [Option<OwnedFd>; 1] = [None];
    match recv_with_fds(sock.as_raw_fd(), &mut buf, &mut fds) {
        Ok(_) => Some(true),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(_) => Some(false),
    }
}

/// Whether the daemon closed the connection (EOF or reset pending), without waiting.
pub fn closed_by_daemon(sock: &UnixStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: recv into a 1-byte buffer we own.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n == 0 {
        return true;
    }
    n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN)
}

/// A session the daemon accepted: the socket and the ring buffer.
pub struct Session {
    /// The connection (closing it ends the session).
    pub sock: UnixStream,
    /// The ring buffer the daemon created for us.
    pub ring: RingBuffer,
    /// The configuration it sent.
    pub config: ClientConfig,
    next_seq: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("next_seq", &self.next_seq)
            .finish_non_exhaustive()
    }
}

/// A session with real `/proc/self/maps` and `/proc/self/mem`
/// descriptors, as the client opens them; panics if the daemon refuses it
/// or does not answer within `timeout`.
pub fn genuine_session(socket: &Path, timeout: Duration) -> Session {
    let maps = File::open("/proc/self/maps").expect("maps");
    let mem = File::open("/proc/self/mem").expect("mem");
    let sock = connect(socket);
    sock.set_read_timeout(Some(timeout)).expect("read timeout");
    send_handshake(&sock, &[maps.as_raw_fd(), mem.as_raw_fd()]).expect("send the handshake");
    let mut buf = [0u8; ClientConfig::ENCODED_LEN];
    let mut fds: [Option<OwnedFd>; 1] = [None];
    let n = recv_with_fds(sock.as_raw_fd(), &mut buf, &mut fds).unwrap_or_else(|e| {
        panic!("no configuration for a genuine handshake within {timeout:?}: {e}")
    });
    assert_eq!(n, 1, "the configuration comes with the ring's memfd");
    let config = ClientConfig::decode(&buf).expect("configuration");
    let ring = RingBuffer::attach(fds[0].as_ref().expect("memfd")).expect("map the ring");
    Session {
        sock,
        ring,
        config,
        next_seq: 1,
    }
}

impl Session {
    /// Writes a malloc sample of `size` bytes at `address` in heap `heap`,
    /// allocated at `pc` (one register frame, no stack copy). Returns
    /// whether it was written (a full buffer drops it).
    pub fn malloc(&mut self, heap: u32, address: u64, size: u64, pc: u64) -> bool {
        let mut regs = RegisterFile::default();
        regs.0[x86_64::RIP] = pc;
        regs.0[x86_64::RSP] = 0x7ff0_0000_0000;
        let h = MallocHeader {
            flags: MallocHeader::FLAG_NO_STACK,
            sequence: self.next_seq,
            alloc_size: size,
            sample_size: size,
            address,
            timestamp_ns: 1,
            context_id: 0,
            tid: std::process::id(),
            heap_id: heap,
            arch: Arch::native().expect("arch"),
            stack_pointer: 0x7ff0_0000_0000,
            stack_len: 0,
            stack_reused: 0,
            regs,
        };
        self.next_seq += 1;
        let mut bytes = [0u8; MallocHeader::ENCODED_LEN];
        h.encode_into(&mut bytes);
        self.write(&bytes)
    }

    /// Writes one record (dropped if the buffer is full; returns whether
    /// it was written), and wakes the reader when the ring says so.
    fn write(&self, bytes: &[u8]) -> bool {
        match self.ring.write_parts(&[bytes], WriteMode::Drop) {
            Ok(wake) => {
                if wake {
                    // SAFETY: send of one byte from a static buffer.
                    unsafe {
                        libc::send(
                            self.sock.as_raw_fd(),
                            [WAKE_BYTE].as_ptr().cast(),
                            1,
                            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                        )
                    };
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Declares heap `heap` with a name and sampling interval.
    pub fn heap_name(&mut self, heap: u32, name: &str, interval: u64) -> bool {
        let r = HeapNameRecord {
            heap_id: heap,
            interval,
            name: heap_name_field(name).expect("a heap name that fits"),
        };
        self.write(&r.encode())
    }
}

/// The socket `record` (pid `record_pid`) listens on, from the environment
/// of the program it started (`HEAPPROFD_SOCKET`).
pub fn record_socket(record_pid: i32) -> PathBuf {
    let children =
        std::fs::read_to_string(format!("/proc/{record_pid}/task/{record_pid}/children"))
            .expect("record's children");
    let child = children
        .split_whitespace()
        .next()
        .expect("record runs its program");
    let environ = std::fs::read(format!("/proc/{child}/environ")).expect("environ");
    environ
        .split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(b"HEAPPROFD_SOCKET="))
        .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned()))
        .expect("HEAPPROFD_SOCKET in the program's environment")
}

/// `VmHWM` (peak resident set) of a process, in KiB.
pub fn peak_rss_kib(pid: i32) -> u64 {
    crate::attach_harness::status_kib(pid as u32, "VmHWM")
}

/// Raises this process's soft limit on open files (the children started
/// afterwards inherit it) to at least `n` if the hard limit allows.
pub fn raise_fd_limit(n: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < n {
            r.rlim_cur = n.min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}
