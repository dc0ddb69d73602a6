//! The private runtime directory the daemon's socket lives in, and the
//! sockets that killed daemons left behind.
//!
//! `record -- CMD` listens in `$XDG_RUNTIME_DIR/heapprofd-rs/` when
//! `XDG_RUNTIME_DIR` is a directory of ours that nobody else may enter,
//! else in `/tmp/heapprofd-rs-<euid>/`. `record --pid` always listens in
//! the directory of the attach ABI's rule for the target's effective user
//! (`heapprofd_proto::attach::runtime_dir_for_uid`), because the client
//! derives the path from its own `geteuid()` and our pid alone
//! (`socket_path_for_id`); root attaching to another user's process makes
//! that user's directory (owned by that user) and gives the socket to it.
//!
//! A directory is used only if it is a directory (not a symlink, opened
//! with `O_NOFOLLOW`), owned by the user it is for, with no access for
//! group or others; anything else is an error that says what to remove or
//! change. A directory we create is made 0700 (and, when root makes it for
//! another user, given to that user) through its descriptor, before it is
//! checked like any other.
//!
//! Sockets are named `<daemon pid>.sock`. A `record` killed with SIGKILL
//! cannot remove its socket, so at start every `<pid>.sock` of the
//! directory whose daemon is gone (no such process, and connecting to it
//! is refused) is removed, and so are the `/tmp/heapprofd-rs-<pid>.sock`
//! files that versions before this directory left in `/tmp` (only ours).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use heapprofd_proto::attach::{ID_SOCKET_PATH_SUFFIX, runtime_dir_for_uid};
use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::{Mode, SFlag, fchmod, fstat};
use nix::unistd::{Gid, Pid, Uid, fchown, getegid, geteuid, mkdir};

/// Name of our directory inside `$XDG_RUNTIME_DIR`.
const XDG_SUBDIR: &str = "heapprofd-rs";
/// Room in `sockaddr_un.sun_path` (with its NUL).
const SUN_PATH_MAX: usize = 108;

/// A checked private runtime directory.
#[derive(Debug, Clone)]
pub struct RuntimeDir {
    path: PathBuf,
}

impl RuntimeDir {
    /// The directory of `record -- CMD` (see the module docs): under
    /// `xdg` (`$XDG_RUNTIME_DIR`) if it is usable, else the `/tmp` one.
    pub fn for_record(xdg: Option<&Path>) -> Result<RuntimeDir> {
        let (uid, gid) = (geteuid().as_raw(), getegid().as_raw());
        if let Some(xdg) = xdg {
            match Self::under_xdg(xdg, uid, gid) {
                Ok(dir) => return Ok(dir),
                Err(e) => log::debug!("not using XDG_RUNTIME_DIR: {e:#}"),
            }
        }
        Self::for_user(uid, gid)
    }

    fn under_xdg(xdg: &Path, uid: u32, gid: u32) -> Result<RuntimeDir> {
        if !xdg.is_absolute() {
            bail!("{} is not an absolute path", xdg.display());
        }
        let fd = open_dir(xdg)?;
        check_private(&fd, xdg, uid)?;
        let path = xdg.join(XDG_SUBDIR);
        let dir = RuntimeDir { path };
        if dir.socket_for(u32::MAX).as_os_str().len() >= SUN_PATH_MAX {
            bail!("{} is too long for a socket path", dir.path.display());
        }
        ensure(&dir.path, uid, gid)?;
        Ok(dir)
    }

    /// `/tmp/heapprofd-rs-<uid>`, created for user `uid` (group `gid`) if
    /// missing, and checked.
    pub fn for_user(uid: u32, gid: u32) -> Result<RuntimeDir> {
        let path = PathBuf::from(runtime_dir_for_uid(uid).as_str());
        ensure(&path, uid, gid)?;
        Ok(RuntimeDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `<dir>/<id>.sock`: where the daemon with that id (its pid) listens.
    pub fn socket_for(&self, id: u32) -> PathBuf {
        self.path.join(format!("{id}{ID_SOCKET_PATH_SUFFIX}"))
    }

    /// Removes the sockets of daemons that are gone; returns how many.
    /// (Only this directory: a scan of `/tmp` for the sockets of early
    /// versions cost 1-3 ms of every run's start on a machine whose `/tmp`
    /// holds thousands of files.)
    pub fn remove_stale(&self) -> usize {
        let removed = remove_stale_in(&self.path);
        if removed > 0 {
            log::debug!("removed {removed} socket(s) left by heapprofd-rs processes that are gone");
        }
        removed
    }
}

/// Removes the stale sockets `<pid>.sock` of `dir`; returns how many.
fn remove_stale_in(dir: &Path) -> usize {
    let me = std::process::id();
    let mut removed = 0;
    for (path, pid) in sockets_in(dir) {
        if pid != me && is_stale(&path, pid) && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Makes `path` (mode 0700, owned by `uid`:`gid`) unless it exists, then
/// checks it.
fn ensure(path: &Path, uid: u32, gid: u32) -> Result<()> {
    let created = match mkdir(path, Mode::S_IRWXU) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => bail!(
            "cannot create the runtime directory {}: {e}",
            path.display()
        ),
    };
    let fd = open_dir(path)?;
    if created {
        // The creation mask may have taken bits away; and root making it
        // for another user gives it to that user. Through the descriptor,
        // so it is the directory just made.
        fchmod(fd.as_fd(), Mode::S_IRWXU)
            .with_context(|| format!("setting the mode of {}", path.display()))?;
        if uid != geteuid().as_raw() {
            fchown(
                fd.as_fd(),
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
            )
            .with_context(|| format!("giving {} to uid {uid}", path.display()))?;
        }
    }
    check_private(&fd, path, uid)
}

/// Opens a directory without following a symlink in its last component.
fn open_dir(path: &Path) -> Result<OwnedFd> {
    match open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(fd),
        Err(Errno::ELOOP | Errno::ENOTDIR) => bail!(
            "{} is not a directory (a symlink or a file someone else may have put there): \
             remove it and run again",
            path.display()
        ),
        Err(e) => bail!("cannot open the runtime directory {}: {e}", path.display()),
    }
}

/// A directory owned by `uid` that nobody else may enter.
fn check_private(fd: &OwnedFd, path: &Path, uid: u32) -> Result<()> {
    let st = fstat(fd.as_fd()).with_context(|| format!("fstat of {}", path.display()))?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
        bail!("{} is not a directory", path.display());
    }
    if st.st_uid != uid {
        bail!(
            "the runtime directory {} belongs to uid {}, not to uid {uid}: someone else \
             created it; remove it (as root) and run again",
            path.display(),
            st.st_uid
        );
    }
    if st.st_mode & 0o077 != 0 {
        bail!(
            "the runtime directory {} has mode {:o}, which lets other users in: \
             `chmod 700 {}` or remove it",
            path.display(),
            st.st_mode & 0o7777,
            path.display()
        );
    }
    Ok(())
}

/// The sockets `<pid>.sock` in `dir`, with their pids.
fn sockets_in(dir: &Path) -> Vec<(PathBuf, u32)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let pid = name
                .to_str()?
                .strip_suffix(ID_SOCKET_PATH_SUFFIX)?
                .parse::<u32>()
                .ok()?;
            let is_socket = e.file_type().is_ok_and(|t| t.is_socket());
            is_socket.then(|| (e.path(), pid))
        })
        .collect()
}

/// Whether the daemon of the socket at `path` (named after `pid`) is gone:
/// no such process, and nobody listens there (a daemon of another pid
/// namespace sharing the directory still answers).
fn is_stale(path: &Path, pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if nix::sys::signal::kill(Pid::from_raw(raw), None) != Err(Errno::ESRCH) {
        return false;
    }
    matches!(
        std::os::unix::net::UnixStream::connect(path),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::net::UnixListener;

    use super::*;

    fn me() -> (u32, u32) {
        (geteuid().as_raw(), getegid().as_raw())
    }

    #[test]
    fn created_private_and_checked() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let (uid, gid) = me();
        let d = tmp.path().join("rt");
        ensure(&d, uid, gid).expect("create");
        let m = std::fs::metadata(&d).expect("metadata");
        assert_eq!((m.uid(), m.permissions().mode() & 0o7777), (uid, 0o700));
        // Existing and fine: used as it is.
        ensure(&d, uid, gid).expect("reuse");

        // Open to others: refused, with what to do.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let e = ensure(&d, uid, gid).unwrap_err().to_string();
        assert!(e.contains("mode 755") && e.contains("chmod 700"), "{e}");

        // A symlink to a private directory: refused.
        let link = tmp.path().join("link");
        let real = tmp.path().join("real");
        ensure(&real, uid, gid).expect("create real");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let e = ensure(&link, uid, gid).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");

        // A file: refused.
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").expect("file");
        assert!(ensure(&file, uid, gid).is_err());

        // Someone else's: refused (checked as if it were for another uid).
        let e = ensure(&real, uid + 1, gid).unwrap_err().to_string();
        assert!(e.contains(&format!("belongs to uid {uid}")), "{e}");
    }

    #[test]
    fn stale_sockets_are_removed_live_ones_kept() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = RuntimeDir {
            path: tmp.path().to_path_buf(),
        };
        // A pid that cannot exist (above the largest pid_max, 2^22), with a socket nobody
        // listens on: what a daemon killed with SIGKILL leaves.
        let dead = 2_000_000_000u32;
        let stale = dir.socket_for(dead);
        drop(UnixListener::bind(&stale).expect("bind"));
        // Our own pid, listening: kept.
        let live = dir.socket_for(std::process::id());
        let _listener = UnixListener::bind(&live).expect("bind live");
        // A dead pid whose socket still has a listener (a daemon of another
        // pid namespace): kept.
        let other_ns = dir.socket_for(dead + 1);
        let _other = UnixListener::bind(&other_ns).expect("bind other");
        // Not a socket: never touched.
        let file = dir.socket_for(dead + 2);
        std::fs::write(&file, b"x").expect("file");
        assert_eq!(remove_stale_in(dir.path()), 1);
        assert!(!stale.exists());
        assert!(live.exists() && other_ns.exists() && file.exists());
    }

    #[test]
    fn the_tmp_directory_is_the_attach_rule() {
        let (uid, _) = me();
        let p = PathBuf::from(runtime_dir_for_uid(uid).as_str());
        let dir = RuntimeDir { path: p };
        assert_eq!(
            dir.socket_for(4242).to_str(),
            Some(heapprofd_proto::attach::socket_path_for_id(uid, 4242).as_str())
        );
    }
}
