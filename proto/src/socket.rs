//! The session protocol on the UNIX socket, and descriptor passing.
//!
//! A session is one `SOCK_STREAM` UNIX connection from the client to the daemon:
//!
//! 1. client -> daemon: [`Handshake`](crate::wire::Handshake) bytes with two
//!    descriptors attached (SCM_RIGHTS): the client's `/proc/self/maps` and
//!    `/proc/self/mem`, opened by the client so the daemon needs no ptrace
//!    rights over it.
//! 2. daemon -> client: [`ClientConfig`](crate::wire::ClientConfig) bytes with
//!    one descriptor attached: the sealed ring-buffer memfd. A daemon that
//!    refuses the client closes the connection instead.
//! 3. client -> daemon: one [`WAKE_BYTE`] each time a writer finds the reader
//!    paused. Nothing else is sent in either direction.
//! 4. The daemon ends the session by setting the ring buffer's shutdown flag
//!    and closing the socket; the client ends it by closing the socket (or by
//!    exiting). Either way the daemon drains the ring buffer before it dumps.
//!
//! The functions here are thin, allocation-free wrappers over
//! `sendmsg`/`recvmsg`, usable from the client's hooks and from the daemon.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Byte the client sends to wake a paused reader.
pub const WAKE_BYTE: u8 = b'w';
/// Environment variable naming the daemon's socket (when it is not set,
/// the client uses [`DEFAULT_SOCKET_PATH`](crate::attach::DEFAULT_SOCKET_PATH)).
pub const SOCKET_ENV: &str = "HEAPPROFD_SOCKET";
/// Most descriptors one message carries.
pub const MAX_FDS: usize = 4;

/// Control-message buffer big enough for [`MAX_FDS`] descriptors, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

const _: () = assert!(
    // CMSG_SPACE(4 * sizeof(int)) on 64-bit Linux: 16-byte header + 16 bytes of fds.
    core::mem::size_of::<CmsgBuf>() >= 16 + 4 * MAX_FDS
);

/// Sends all of `bytes` on the stream socket `sock`, with `fds` attached to the
/// first chunk. Retries on EINTR and short writes.
pub fn send_with_fds(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut sent = 0;
    let mut first = true;
    while sent < bytes.len() || (first && !fds.is_empty()) {
        let mut iov = libc::iovec {
            iov_base: bytes[sent..].as_ptr() as *mut libc::c_void,
            iov_len: bytes.len() - sent,
        };
        let mut cmsg = CmsgBuf([0; 64]);
        // SAFETY: msghdr is plain data; zero is a valid initial state.
        let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if first && !fds.is_empty() {
            let fd_bytes = core::mem::size_of_val(fds) as u32;
            // SAFETY: CMSG_SPACE is a pure computation.
            let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
            msg.msg_control = cmsg.0.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: msg_control points at a buffer of `space` bytes, enough
            // for one header and the descriptors (checked above).
            unsafe {
                let hdr = libc::CMSG_FIRSTHDR(&msg);
                (*hdr).cmsg_level = libc::SOL_SOCKET;
                (*hdr).cmsg_type = libc::SCM_RIGHTS;
                (*hdr).cmsg_len = libc::CMSG_LEN(fd_bytes) as _;
                core::ptr::copy_nonoverlapping(
                    fds.as_ptr(),
                    libc::CMSG_DATA(hdr).cast::<RawFd>(),
                    fds.len(),
                );
            }
        }
        // SAFETY: msg points at live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        first = false;
        sent += n as usize;
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes from the stream socket `sock`, and the
/// descriptors attached to them (at most `fds.len()`, at most [`MAX_FDS`]).
///
/// Returns the number of descriptors received. Descriptors beyond the
/// caller's room are closed, never leaked. EOF before `buf` is full is an
/// `UnexpectedEof` error.
pub fn recv_with_fds(
    sock: RawFd,
    buf: &mut [u8],
    fds: &mut [Option<OwnedFd>],
) -> io::Result<usize> {
    let mut got = 0;
    let mut nfds = 0;
    while got < buf.len() {
        let (n, f) = match recv_some_with_fds(
            sock,
            buf.get_mut(got..).unwrap_or_default(),
            fds.get_mut(nfds..).unwrap_or_default(),
        ) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        got += n;
        nfds += f;
    }
    Ok(nfds)
}

/// One `recvmsg` on the stream socket `sock`: up to `buf.len()` bytes and
/// the descriptors attached to them (stored in `fds` from the start, at
/// most `fds.len()`; the others are closed, never leaked). Returns (bytes,
/// descriptors) received. EOF is an `UnexpectedEof` error, so is an empty
/// `buf`; a non-blocking socket with nothing to read gives `WouldBlock`
/// (what [`recv_with_fds`] loops over, and what a caller that waits with
/// its own deadline calls once per readiness).
pub fn recv_some_with_fds(
    sock: RawFd,
    buf: &mut [u8],
    fds: &mut [Option<OwnedFd>],
) -> io::Result<(usize, usize)> {
    if buf.is_empty() {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    let mut nfds = 0;
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cmsg = CmsgBuf([0; 64]);
    // SAFETY: msghdr is plain data; zero is a valid initial state.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.0.as_mut_ptr().cast();
    msg.msg_controllen = cmsg.0.len() as _;
    // SAFETY: msg points at live buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // Take ownership of every descriptor received before anything else,
    // so none leaks whatever happens next.
    // SAFETY: walking the control messages the kernel wrote into our buffer.
    unsafe {
        let mut hdr = libc::CMSG_FIRSTHDR(&msg);
        while !hdr.is_null() {
            if (*hdr).cmsg_level == libc::SOL_SOCKET && (*hdr).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(hdr);
                let payload = (*hdr).cmsg_len as usize - (data as usize - hdr as usize);
                let count = payload / core::mem::size_of::<RawFd>();
                for i in 0..count {
                    let raw = core::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    let owned = OwnedFd::from_raw_fd(raw);
                    if let Some(slot) = fds.get_mut(nfds) {
                        *slot = Some(owned);
                        nfds += 1;
                    } // else: dropped, i.e. closed
                }
            }
            hdr = libc::CMSG_NXTHDR(&msg, hdr);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "too many descriptors attached",
        ));
    }
    if n == 0 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    Ok((n as usize, nfds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn bytes_and_descriptors_cross_a_socketpair() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut f = tempfile_with(b"hello");
        send_with_fds(
            a.as_raw_fd(),
            b"0123456789",
            &[f.as_raw_fd(), f.as_raw_fd()],
        )
        .unwrap();
        let mut buf = [0u8; 10];
        let mut fds: [Option<OwnedFd>; 2] = [None, None];
        assert_eq!(recv_with_fds(b.as_raw_fd(), &mut buf, &mut fds).unwrap(), 2);
        assert_eq!(&buf, b"0123456789");
        let mut got = std::fs::File::from(fds[0].take().unwrap());
        got.seek(SeekFrom::Start(0)).unwrap();
        let mut s = String::new();
        got.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        f.flush().unwrap();
    }

    #[test]
    fn eof_and_extra_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = tempfile_with(b"x");
        send_with_fds(
            a.as_raw_fd(),
            b"abc",
            &[f.as_raw_fd(), f.as_raw_fd(), f.as_raw_fd()],
        )
        .unwrap();
        drop(a);
        let mut buf = [0u8; 3];
        let mut fds: [Option<OwnedFd>; 1] = [None];
        // Room for one: the other two are closed.
        assert_eq!(recv_with_fds(b.as_raw_fd(), &mut buf, &mut fds).unwrap(), 1);
        let mut more = [0u8; 1];
        let err = recv_with_fds(b.as_raw_fd(), &mut more, &mut []).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(send_with_fds(b.as_raw_fd(), b"z", &[0; 5]).is_err());
    }

    #[test]
    fn one_recvmsg_at_a_time() {
        let (a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 8];
        let mut fds: [Option<OwnedFd>; 2] = [None, None];
        let err = recv_some_with_fds(b.as_raw_fd(), &mut buf, &mut fds).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        let f = tempfile_with(b"zz");
        send_with_fds(a.as_raw_fd(), b"abc", &[f.as_raw_fd()]).unwrap();
        // Part of what the caller wants, with its descriptor.
        assert_eq!(
            recv_some_with_fds(b.as_raw_fd(), &mut buf, &mut fds).unwrap(),
            (3, 1)
        );
        assert_eq!(&buf[..3], b"abc");
        assert!(fds[0].is_some());
        drop(a);
        let err = recv_some_with_fds(b.as_raw_fd(), &mut buf, &mut fds).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        let err = recv_some_with_fds(b.as_raw_fd(), &mut [], &mut fds).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    fn tempfile_with(content: &[u8]) -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "hp-sock-test-{}-{}",
            std::process::id(),
            content.len()
        ));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all(content).unwrap();
        f
    }
}
