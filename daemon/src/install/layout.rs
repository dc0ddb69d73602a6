//! Where a system-wide install puts things, as the system sees them, and
//! the same paths under another root directory (`--root`, for tests and
//! staging, as `dpkg --root` does: files go below it, the preload file names
//! the path the system will see).

use std::path::{Path, PathBuf};

/// The preload file of glibc's dynamic linker.
pub const PRELOAD: &str = "/etc/ld.so.preload";
/// The directory the library is copied to (root-owned, 0755).
pub const LIB_DIR: &str = "/usr/lib/heapprofd-rs/preload";
/// The library's file name.
pub const LIB_NAME: &str = heapprofd_proto::attach::CLIENT_FILE_NAME;
/// The directory of the install state.
pub const STATE_DIR: &str = "/var/lib/heapprofd-rs";
/// The install state's file name ([`super::state::InstallState`]).
pub const STATE_NAME: &str = "install.json";

/// The paths of one install.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// The layout below `root` (`/` for the real system).
    pub fn new(root: &Path) -> Layout {
        Layout {
            root: root.to_path_buf(),
        }
    }

    /// `system` (an absolute path as the system sees it) below the root.
    pub fn host(&self, system: &str) -> PathBuf {
        self.root.join(system.trim_start_matches('/'))
    }

    /// The library's path as the system sees it (what the preload file names).
    pub fn library_entry() -> String {
        format!("{LIB_DIR}/{LIB_NAME}")
    }

    /// The installed library.
    pub fn library(&self) -> PathBuf {
        self.host(&Self::library_entry())
    }

    /// The preload file.
    pub fn preload(&self) -> PathBuf {
        self.host(PRELOAD)
    }

    /// The install state.
    pub fn state(&self) -> PathBuf {
        self.host(STATE_DIR).join(STATE_NAME)
    }

    /// The directories that must exist, outermost first.
    pub fn dirs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for system in [LIB_DIR, STATE_DIR] {
            let mut chain: Vec<PathBuf> = Path::new(system)
                .ancestors()
                .filter(|a| a.parent().is_some())
                .map(|a| self.host(&a.to_string_lossy()))
                .collect();
            chain.reverse();
            for d in chain {
                if !out.contains(&d) {
                    out.push(d);
                }
            }
        }
        out
    }
}
