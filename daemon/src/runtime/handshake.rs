//! The daemon side of the session handshake, under one deadline.
//!
//! A connection has [`HANDSHAKE_TIMEOUT`] from its accept to complete its
//! handshake, whatever it sends meanwhile (a timeout per read would let a
//! peer that sends a byte every 1.9 s hold it for ever):
//!
//! 1. [`receive`] (async, on the runtime, no thread of its own): the peer's
//!    credentials (SO_PEERCRED), then the [`Handshake`] bytes and the maps
//!    and mem descriptors, read as they come until the deadline. A peer
//!    that sends slowly or nothing costs a task, never a thread.
//! 2. [`establish`] (blocking, on a blocking thread; the server runs a few
//!    at a time): each descriptor is checked with `fstat` before a byte is
//!    read from it: a regular file with the device and inode of
//!    `/proc/<peer pid>/maps` and `/proc/<peer pid>/mem`, the pid being the
//!    kernel's (SO_PEERCRED), as heapprofd checks them. An `eventfd`, a
//!    pipe, `/dev/urandom` or another process's maps are refused before
//!    anything is read. Then the ring buffer is created, the maps are read
//!    (bounded, see the unwinder's `FdMaps`) and the files of the
//!    executable mappings opened (the unwinder's `PendingProcess`), the
//!    [`ClientConfig`] and the memfd are sent within what is left of the
//!    deadline. The modules are loaded from the open files and the
//!    unwinding context built (JIT perf maps only if they belong to the
//!    peer's user) by the session's worker, after it has told the
//!    bookkeeping of the session: the client does not wait for that.
//!
//! Anything unexpected is an error naming what was wrong; the connection is
//! then dropped, which the client sees as a refusal and keeps running
//! unprofiled. A handshake that says its process cannot be profiled
//! ([`Unprofilable`]) carries no descriptors and gets no reply: it is
//! [`Accepted::Unprofilable`], about the peer itself or a child it just
//! spawned (checked in `/proc`).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use heapprofd_model::profile::ProcessIdentity;
use heapprofd_model::trace::ProcessMemory;
use heapprofd_proto::socket::{recv_some_with_fds, send_with_fds};
use heapprofd_proto::wire::{ClientConfig, Handshake, Unprofilable};
use heapprofd_shmem::RingBuffer;
use heapprofd_unwinder::{
    FdMaps, FdMemory, KeptMaps, LiveOrKept, ModuleCache, PendingProcess, ProcessOptions,
};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::getsockopt;
use nix::sys::socket::sockopt::PeerCredentials;
use nix::sys::stat::{FileStat, SFlag, fstat, stat};
use nix::unistd::geteuid;
use tokio::io::Interest;

use super::clock::read_clocks;
use super::emulation;
use super::maps_keeper::MapsKeeper;
use super::procinfo;
use super::spare_ring::SpareRing;

/// How long a connection has to complete its handshake, from its accept.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

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

/// Whose processes a daemon takes as clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerAccess {
    /// The daemon's own user, root, and `extra_uid` if set (root attaching
    /// to another user's process): `record`'s daemons.
    Own {
        /// One more user.
        extra_uid: Option<u32>,
    },
    /// Only this user's processes, root's refused too: a root service
    /// running a profile that this (unprivileged) user asked for
    /// ([`crate::service::access`]).
    Only(u32),
    /// Every user's: a root service running a profile root asked for.
    Anyone,
}

impl PeerAccess {
    /// Whether a peer of effective user `uid` may connect.
    pub fn allows(self, uid: u32) -> bool {
        match self {
            PeerAccess::Own { extra_uid } => {
                peer_allowed(PeerCred { pid: 0, uid }) || Some(uid) == extra_uid
            }
            PeerAccess::Only(u) => uid == u,
            PeerAccess::Anyone => true,
        }
    }
}

/// A client that completed the handshake.
pub struct NewSession {
    /// Who connected (pid from the kernel, not from the client's message).
    pub peer: PeerCred,
    /// What the client said about itself.
    pub handshake: Handshake,
    /// The ring buffer the daemon reads (shared with `keeper`).
    pub ring: Arc<RingBuffer>,
    /// The answerer of the client's maps ask, for the session's socket
    /// task (`None` if the maps descriptor could not be duplicated: the
    /// client is then not told that asks are answered).
    pub keeper: Option<MapsKeeper>,
    /// The client's maps read and the files of its executable mappings
    /// opened, from its maps and mem descriptors; the worker loads the
    /// modules (`PendingProcess::finish`) when a record first needs them
    /// (see `lazy_process`).
    pub process: PendingProcess,
    /// The connection; it now only carries wake bytes.
    pub stream: UnixStream,
    /// The process's command line (from /proc, best effort).
    pub cmdline: Vec<String>,
    /// Its parent and threads (from /proc, before the reply).
    pub identity: ProcessIdentity,
    /// Its memory counters at `started_ns`.
    pub memory: Option<ProcessMemory>,
    /// When the session started: just before the reply
    /// (MONOTONIC_COARSE ns).
    pub started_ns: u64,
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

/// What [`receive`] got: the message and the (unchecked) descriptors.
#[derive(Debug)]
pub struct Received {
    /// Who connected.
    pub peer: PeerCred,
    /// What the client said about itself.
    pub handshake: Handshake,
    maps: OwnedFd,
    mem: OwnedFd,
    stream: UnixStream,
    deadline: Instant,
}

/// What an accepted connection brought.
#[derive(Debug)]
pub enum Accepted {
    /// A session's handshake, to be [`establish`]ed.
    Session(Box<Received>),
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

/// Step 1 (see the module docs): checks the peer's credentials (its user
/// must be one `access` allows) and receives its handshake and descriptors
/// before `deadline`.
pub async fn receive(
    stream: UnixStream,
    access: PeerAccess,
    deadline: Instant,
) -> Result<Accepted> {
    let peer = peer_cred(&stream).context("reading the peer's credentials (SO_PEERCRED)")?;
    if !access.allows(peer.uid) {
        bail!(
            "refusing pid {} of uid {}: not a user this profile may see ({access:?})",
            peer.pid,
            peer.uid
        );
    }
    stream.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(stream)?;
    let mut buf = [0u8; Handshake::ENCODED_LEN];
    let mut fds: [Option<OwnedFd>; 2] = [None, None];
    let (mut got, mut nfds) = (0, 0);
    while got < buf.len() {
        let ready = tokio::time::timeout_at(deadline.into(), stream.readable()).await;
        match ready {
            Err(_) => bail!(
                "pid {} sent {got} of the {} handshake bytes in {:.1} s; refused",
                peer.pid,
                buf.len(),
                HANDSHAKE_TIMEOUT.as_secs_f64()
            ),
            Ok(r) => r?,
        }
        let (b, f) = (&mut buf[got..], &mut fds[nfds..]);
        match stream.try_io(Interest::READABLE, || {
            recv_some_with_fds(stream.as_raw_fd(), b, f)
        }) {
            Ok((n, k)) => {
                got += n;
                nfds += k;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("receiving the handshake of pid {}", peer.pid));
            }
        }
    }
    let handshake =
        Handshake::decode(&buf).with_context(|| format!("handshake of pid {}", peer.pid))?;
    if handshake.unprofilable != Unprofilable::None {
        let pid = handshake.pid;
        if pid != peer.pid && procinfo::read_ppid(pid) != Some(peer.pid) {
            bail!(
                "pid {} said pid {pid} runs unprofiled, but that is neither itself nor its child",
                peer.pid
            );
        }
        return Ok(Accepted::Unprofilable {
            pid,
            why: handshake.unprofilable,
            cmdline: procinfo::read_cmdline(pid),
        });
    }
    let [Some(maps), Some(mem)] = fds else {
        bail!(
            "pid {} sent {nfds} descriptors with its handshake; expected its maps and mem",
            peer.pid
        );
    };
    let stream = stream.into_std()?;
    stream.set_nonblocking(false)?;
    Ok(Accepted::Session(Box::new(Received {
        peer,
        handshake,
        maps,
        mem,
        stream,
        deadline,
    })))
}

/// Step 2 (see the module docs): checks the descriptors, creates the ring
/// buffer and the unwinding context, and answers with `config`. Blocking.
pub fn establish(
    received: Received,
    config: &ClientConfig,
    cache: &Arc<ModuleCache>,
    spare: Option<&SpareRing>,
) -> Result<NewSession> {
    let Received {
        peer,
        handshake,
        maps,
        mem,
        stream,
        deadline,
    } = received;
    if let Err(e) = check_proc_file(&maps, peer.pid, "maps") {
        // Under qemu-user the guest's own view (see `emulation`).
        if !(emulation::runs_under_emulator(peer.pid) && is_regular(&maps)) {
            return Err(e);
        }
        log::debug!(
            "pid {}: emulated, using the guest's view of its maps",
            peer.pid
        );
    }
    check_proc_file(&mem, peer.pid, "mem")?;
    let (ring, memfd) = match spare {
        Some(spare) => spare.take_or_create(config.shmem_size),
        None => RingBuffer::create(config.shmem_size),
    }
    .context("creating the ring buffer")?;
    // The maps read and the files of the executable mappings opened while
    // the client waits for our reply, so they are known even if it exits
    // right after (see ARCHITECTURE.md, daemon); the modules are loaded
    // from the open files after the reply, when a record needs them.
    let t0 = Instant::now();
    let options = ProcessOptions {
        perf_map_owner: Some(peer.uid),
        ..ProcessOptions::default()
    };
    let maps = FdMaps::new(File::from(maps));
    let ring = Arc::new(ring);
    let kept = KeptMaps::default();
    let keeper = match maps.try_clone() {
        Ok(second) => Some(MapsKeeper::new(Arc::clone(&ring), second, kept.clone())),
        Err(e) => {
            log::debug!(
                "pid {}: no second maps reader ({e}): no maps kept at its exit",
                peer.pid
            );
            None
        }
    };
    let mut config = *config;
    if keeper.is_some() {
        config.flags |= ClientConfig::FLAG_KEEPS_MAPS;
    }
    let pending = PendingProcess::read(
        peer.pid,
        Box::new(LiveOrKept::new(Box::new(maps), kept)),
        Box::new(FdMemory::new(File::from(mem))),
        Arc::clone(cache),
        options,
    );
    let read_ms = t0.elapsed().as_secs_f64() * 1e3;
    // What is left of the deadline (the reply is small and the peer has
    // read nothing yet, so it fits its socket buffer unless the peer is
    // gone).
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    // What the trace says about the process besides its heap, read while
    // it waits for our reply (a process that exits right after is gone by
    // the time the bookkeeping thread hears of it): the session's start,
    // its command line, parent and threads, its memory at the start.
    let started_ns = read_clocks().monotonic_coarse_ns;
    let cmdline = procinfo::read_cmdline(peer.pid);
    let (identity, memory) = procinfo::read_identity_and_memory(peer.pid);
    stream.set_write_timeout(Some(left))?;
    send_with_fds(stream.as_raw_fd(), &config.encode(), &[memfd.as_raw_fd()])
        .with_context(|| format!("sending the configuration to pid {}", peer.pid))?;
    drop(memfd);
    stream.set_write_timeout(None)?;
    let pidfd = pidfd_open(peer.pid);
    log::debug!(
        "handshake of pid {}: maps read and files opened in {read_ms:.2} ms before the reply",
        peer.pid,
    );
    Ok(NewSession {
        peer,
        handshake,
        ring,
        keeper,
        process: pending,
        stream,
        cmdline,
        identity,
        memory,
        started_ns,
        pidfd,
    })
}

/// The descriptor `fd` a peer sent as its `/proc/self/<name>` is a regular
/// file with the device and inode of `/proc/<pid>/<name>`.
fn check_proc_file(fd: &OwnedFd, pid: u32, name: &str) -> Result<()> {
    let st =
        fstat(fd.as_fd()).with_context(|| format!("fstat of pid {pid}'s {name} descriptor"))?;
    if file_type(&st) != SFlag::S_IFREG {
        bail!(
            "pid {pid} sent {} as its {name} descriptor instead of /proc/{pid}/{name}; refused",
            type_name(file_type(&st))
        );
    }
    let path = format!("/proc/{pid}/{name}");
    let want = stat(path.as_str()).with_context(|| format!("stat of {path}"))?;
    if (st.st_dev, st.st_ino) != (want.st_dev, want.st_ino) {
        bail!(
            "pid {pid}'s {name} descriptor is not its own {path} (another file or another \
             process's); refused"
        );
    }
    Ok(())
}

/// Whether `fd` is a regular file (a memfd counts).
fn is_regular(fd: &OwnedFd) -> bool {
    fstat(fd.as_fd()).is_ok_and(|st| file_type(&st) == SFlag::S_IFREG)
}

fn file_type(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

fn type_name(t: SFlag) -> &'static str {
    match t {
        SFlag::S_IFIFO => "a pipe",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFLNK => "a symlink",
        _ => "an anonymous inode (eventfd, epoll, timerfd...)",
    }
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

#[cfg(test)]
mod tests {
    use std::os::fd::FromRawFd;

    use super::*;

    fn own(path: &str) -> OwnedFd {
        OwnedFd::from(File::open(path).expect(path))
    }

    #[test]
    fn descriptors_must_be_the_peers_own_proc_files() {
        let me = std::process::id();
        check_proc_file(&own("/proc/self/maps"), me, "maps").expect("own maps");
        check_proc_file(&own("/proc/self/mem"), me, "mem").expect("own mem");
        // The other one of the pair.
        let e = check_proc_file(&own("/proc/self/mem"), me, "maps").unwrap_err();
        assert!(e.to_string().contains("not its own /proc"), "{e}");
        // A device, read without end.
        let e = check_proc_file(&own("/dev/urandom"), me, "maps").unwrap_err();
        assert!(e.to_string().contains("a character device"), "{e}");
        // An eventfd: blocks on read.
        // SAFETY: eventfd returns a fresh descriptor (checked) we then own.
        let efd = unsafe {
            let fd = libc::eventfd(0, libc::EFD_CLOEXEC);
            assert!(fd >= 0);
            OwnedFd::from_raw_fd(fd)
        };
        let e = check_proc_file(&efd, me, "maps").unwrap_err();
        assert!(e.to_string().contains("anonymous inode"), "{e}");
        // A regular file that is not /proc/<pid>/maps.
        let e = check_proc_file(&own("/proc/self/exe"), me, "maps").unwrap_err();
        assert!(e.to_string().contains("not its own"), "{e}");
        // Another process's maps, passed off as ours.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let theirs = own(&format!("/proc/{}/maps", child.id()));
        let e = check_proc_file(&theirs, me, "maps").unwrap_err();
        assert!(e.to_string().contains("not its own"), "{e}");
        check_proc_file(&theirs, child.id(), "maps").expect("the child's own");
        let _ = child.kill();
        let _ = child.wait();
    }
}
