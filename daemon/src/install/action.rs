//! One change an install or uninstall makes to the file system, printable
//! (`--dry-run` prints them instead of making them) and carried out so that
//! a process starting meanwhile never sees a half-written file: every file
//! is written to a temporary name in its directory, synced, and renamed over
//! the old one (a library that running processes have mapped is never
//! rewritten in place).

use std::fmt;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::state::InstallState;

/// Owner and permission bits for a written file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

/// Root's, mode 0644.
pub const ROOT_0644: Owner = Owner {
    mode: 0o644,
    uid: 0,
    gid: 0,
};

/// One change.
#[derive(Debug, Clone)]
pub enum Action {
    /// Create a directory (root's, 0755).
    CreateDir(PathBuf),
    /// Copy the client library.
    CopyLibrary {
        /// The library of this build.
        from: PathBuf,
        /// Where it goes.
        to: PathBuf,
    },
    /// Load the installed library into `/bin/true` (`LD_PRELOAD`) before
    /// the preload file names it: a library that does not load would break
    /// every program on the machine.
    CheckLoads(PathBuf),
    /// Write the install state.
    WriteState {
        /// The state file.
        path: PathBuf,
        /// What it holds.
        state: Box<InstallState>,
    },
    /// Write the preload file.
    WritePreload {
        /// The preload file.
        path: PathBuf,
        /// Its new bytes.
        bytes: Vec<u8>,
        /// Its owner and mode.
        owner: Owner,
        /// What changes, for people.
        what: String,
    },
    /// Remove a file.
    RemoveFile {
        /// The file.
        path: PathBuf,
        /// What it is, for people.
        what: &'static str,
    },
    /// Remove a directory the install created, if it is empty.
    RemoveDir(PathBuf),
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::CreateDir(d) => write!(f, "create directory {} (root, 0755)", d.display()),
            Action::CopyLibrary { from, to } => write!(
                f,
                "copy the client library {} to {} (root, 0644)",
                from.display(),
                to.display()
            ),
            Action::CheckLoads(p) => write!(f, "check that {} loads (/bin/true)", p.display()),
            Action::WriteState { path, .. } => {
                write!(f, "write the install state {}", path.display())
            }
            Action::WritePreload { path, what, .. } => write!(f, "{what} {}", path.display()),
            Action::RemoveFile { path, what } => write!(f, "remove {what} {}", path.display()),
            Action::RemoveDir(d) => write!(f, "remove directory {} if empty", d.display()),
        }
    }
}

impl Action {
    /// Makes the change.
    pub fn apply(&self) -> Result<()> {
        match self {
            Action::CreateDir(d) => std::fs::DirBuilder::new()
                .mode(0o755)
                .create(d)
                .with_context(|| format!("creating {}", d.display())),
            Action::CopyLibrary { from, to } => {
                let bytes =
                    std::fs::read(from).with_context(|| format!("reading {}", from.display()))?;
                write_atomic(to, &bytes, ROOT_0644)
            }
            Action::CheckLoads(p) => check_loads(p),
            Action::WriteState { path, state } => write_atomic(path, &state.to_json(), ROOT_0644),
            Action::WritePreload {
                path, bytes, owner, ..
            } => write_atomic(path, bytes, *owner),
            Action::RemoveFile { path, .. } => match std::fs::remove_file(path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
            },
            Action::RemoveDir(d) => {
                // Something else put files there: keep it (and say so).
                if let Err(e) = std::fs::remove_dir(d)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    log::warn!("kept {}: {e}", d.display());
                }
                Ok(())
            }
        }
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory
/// (synced, then renamed over `path`), with `owner`'s ids and mode.
pub fn write_atomic(path: &Path, bytes: &[u8], owner: Owner) -> Result<()> {
    let dir = path.parent().context("a file path without a directory")?;
    let name = path
        .file_name()
        .context("a file path without a name")?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.heapprofd-rs-tmp"));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| -> Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::os::unix::fs::fchown(&f, Some(owner.uid), Some(owner.gid))
            .with_context(|| format!("setting the owner of {}", tmp.display()))?;
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(owner.mode))
            .with_context(|| format!("setting the mode of {}", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("syncing {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Runs `/bin/true` with `lib` preloaded: it must exit 0 and print nothing.
fn check_loads(lib: &Path) -> Result<()> {
    let out = Command::new("/bin/true")
        .env_clear()
        .env("LD_PRELOAD", lib)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running /bin/true with {} preloaded", lib.display()))?;
    if !out.status.success() || !out.stderr.is_empty() {
        bail!(
            "{} does not load cleanly (/bin/true with it preloaded: {}, {:?}); nothing \
             was added to the preload file",
            lib.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
