//! The daemon side of the session handshake (blocking, with timeouts).
//!
//! Runs on a blocking thread for each new connection: checks the peer's
//! credentials, receives the [`Handshake`] and the client's maps/mem
//! descriptors, creates and seals the ring buffer, parses the client's maps,
//! and replies with the [`ClientConfig`] and the memfd. Anything unexpected
//! is an error naming what was wrong; the connection is then dropped, which
//! the client sees as a refusal and keeps running unprofiled. A handshake
//! that says its process cannot be profiled ([`Unprofilable`]) carries no
//! descriptors and gets no reply: it is [`Accepted::Unprofilable`], about
//! the peer itself or a child it just spawned (checked in `/proc`).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use heapprofd_proto::socket::{recv_with_fds, send_with_fds};
use heapprofd_proto::wire::{ClientConfig, Handshake, Unprofilable};
use heapprofd_shmem::RingBuffer;
use heapprofd_unwinder::{FdMaps, FdMemory, ModuleCache, ProcessContext};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::getsockopt;
use nix::sys::socket::sockopt::PeerCredentials;
use nix::unistd::geteuid;

/// Credentials of the process at the other end of a UNIX socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id in the daemon's pid namespace.
    pub pid: u32,
    /// Effective user id.
    pub uid: u32,
}

/// Reads SO_PEERCRED.
pub fn peer_cred(sock: &impl AsFd) -> io::Result<PeerCred> {
    let cred = getsockopt(sock, PeerCredentials)?;
    Ok(PeerCred {
        pid: cred.pid() as u32,
        uid: cred.uid(),
    })
}

/// Only the daemon's own user (or root) may connect.
pub fn peer_allowed(peer: PeerCred) -> bool {
    let me = geteuid().as_raw();
    peer.uid == me || peer.uid == 0
}

/// A client that completed the handshake.
pub struct NewSession {
    /// Who connected (pid from the kernel, not from the client's message).
    pub peer: PeerCred,
    /// What the client said about itself.
    pub handshake: Handshake,
    /// The ring buffer the daemon reads.
    pub ring: RingBuffer,
    /// Unwinding state built from the client's maps and mem descriptors.
    pub process: ProcessContext,
    /// The connection; it now only carries wake bytes.
    pub stream: UnixStream,
    /// The process's command line (from /proc, best effort).
    pub cmdline: Vec<String>,
    /// A pidfd for the client process, to tell "exited" from "disconnected".
    pub pidfd: Option<OwnedFd>,
}

impl std::fmt::Debug for NewSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewSession")
            .field("peer", &self.peer)
            .field("cmdline", &self.cmdline)
            .finish_non_exhaustive()
    }
}

/// What an accepted connection brought.
#[derive(Debug)]
pub enum Accepted {
    /// A session.
    Session(Box<NewSession>),
    /// A notice: process `pid` runs unprofiled.
    Unprofilable {
        /// The process (the peer, or its child).
        pid: u32,
        /// Why.
        why: Unprofilable,
        /// Its command line (from /proc, best effort).
        cmdline: Vec<String>,
    },
}

/// The parent of `pid` (from `/proc/PID/stat`).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Performs the daemon side of the handshake on a freshly accepted connection.
pub fn accept_session(
    stream: UnixStream,
    config: &ClientConfig,
    cache: &Arc<ModuleCache>,
) -> Result<Accepted> {
    accept_session_from(stream, config, cache, None)
}

/// [`accept_session`], also accepting peers of user `extra_uid` (the user
/// of a process root attached to).
pub fn accept_session_from(
    stream: UnixStream,
    config: &ClientConfig,
    cache: &Arc<ModuleCache>,
    extra_uid: Option<u32>,
) -> Result<Accepted> {
    let peer = peer_cred(&stream).context("reading the peer's credentials (SO_PEERCRED)")?;
    if !peer_allowed(peer) && Some(peer.uid) != extra_uid {
        bail!(
            "refusing pid {} of uid {}: only the daemon's own user or root may connect",
            peer.pid,
            peer.uid
        );
    }
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;

    let mut buf = [0u8; Handshake::ENCODED_LEN];
    let mut fds: [Option<OwnedFd>; 2] = [None, None];
    let nfds = recv_with_fds(stream.as_raw_fd(), &mut buf, &mut fds)
        .with_context(|| format!("receiving the handshake of pid {}", peer.pid))?;
    let handshake =
        Handshake::decode(&buf).with_context(|| format!("handshake of pid {}", peer.pid))?;
    if handshake.unprofilable != Unprofilable::None {
        let pid = handshake.pid;
        if pid != peer.pid && parent_of(pid) != Some(peer.pid) {
            bail!(
                "pid {} said pid {pid} runs unprofiled, but that is neither itself nor its child",
                peer.pid
            );
        }
        return Ok(Accepted::Unprofilable {
            pid,
            why: handshake.unprofilable,
            cmdline: read_cmdline(pid),
        });
    }
    let [Some(maps_fd), Some(mem_fd)] = fds else {
        bail!(
            "pid {} sent {nfds} descriptors with its handshake; expected its maps and mem",
            peer.pid
        );
    };

    let (ring, memfd) =
        RingBuffer::create(config.shmem_size).context("creating the ring buffer")?;
    // Read while the client waits for our reply, so its maps and files are
    // known even if it exits right after (see ARCHITECTURE.md, daemon).
    let t0 = std::time::Instant::now();
    let process = ProcessContext::new(
        peer.pid,
        Box::new(FdMaps::new(File::from(maps_fd))),
        Box::new(FdMemory::new(File::from(mem_fd))),
        Arc::clone(cache),
    );
    log::debug!(
        "handshake of pid {}: maps and modules read in {:.2} ms",
        peer.pid,
        t0.elapsed().as_secs_f64() * 1e3
    );
    send_with_fds(stream.as_raw_fd(), &config.encode(), &[memfd.as_raw_fd()])
        .with_context(|| format!("sending the configuration to pid {}", peer.pid))?;
    drop(memfd);
    stream.set_read_timeout(None)?;
    let cmdline = read_cmdline(peer.pid);
    let pidfd = pidfd_open(peer.pid);
    Ok(Accepted::Session(Box::new(NewSession {
        peer,
        handshake,
        ring,
        process,
        stream,
        cmdline,
        pidfd,
    })))
}

/// `/proc/PID/cmdline` split at NULs (empty if the process is gone).
pub fn read_cmdline(pid: u32) -> Vec<String> {
    let Ok(bytes) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return Vec::new();
    };
    let mut args: Vec<String> = bytes
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    while args.last().is_some_and(|a| a.is_empty()) {
        args.pop();
    }
    args
}

/// `pidfd_open(2)`; `None` on kernels without it or if the process is gone.
/// (nix has no wrapper for it.)
pub fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: plain syscall; on success we own the returned descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor from the kernel.
    Some(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// Whether the process behind `pidfd` has exited, waiting up to `wait` for it.
pub fn has_exited(pidfd: &OwnedFd, wait: Duration) -> bool {
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
    poll(&mut fds, timeout).is_ok_and(|n| n > 0)
}
