//! What every profile task of the service shares ([`Service`]): its
//! directory, the bookkeeping thread and session stopper of its one
//! daemon, the [`Hub`], profile ids, and the startup-trigger store, which
//! is rewritten (atomically: write, then rename; mode 0644, readable by the
//! clients of every user, written only by the service) from the hub's
//! profiles whenever one starts or ends, and removed with the last.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;

use anyhow::{Context, Result};
use heapprofd_proto::service::TRIGGERS_FILE;

use super::BookMsg;
use super::hub::Hub;
use super::server::Stopper;

/// What every profile task shares.
#[derive(Debug)]
pub(super) struct Service {
    /// The service directory.
    pub(super) dir: PathBuf,
    /// The bookkeeping thread of the one daemon on the client socket.
    pub(super) book: Sender<BookMsg>,
    /// Stops its sessions.
    pub(super) stopper: Stopper,
    /// Which profiles want which processes.
    pub(super) hub: Arc<Hub>,
    /// `dir` is where clients look without `HEAPPROFD_SERVICE_DIR`.
    pub(super) default_dir: bool,
    /// Profile ids.
    next_profile: AtomicU64,
    /// Serializes rewrites of the trigger store.
    store: std::sync::Mutex<()>,
}

impl Service {
    /// The service in `dir`, with its daemon's bookkeeping and stopper.
    pub(super) fn new(
        dir: PathBuf,
        book: Sender<BookMsg>,
        stopper: Stopper,
        hub: Arc<Hub>,
    ) -> Service {
        Service {
            default_dir: is_default_dir(&dir),
            dir,
            book,
            stopper,
            hub,
            next_profile: AtomicU64::new(1),
            store: std::sync::Mutex::new(()),
        }
    }

    /// A fresh profile id.
    pub(super) fn profile_id(&self) -> u64 {
        self.next_profile.fetch_add(1, Ordering::Relaxed)
    }

    /// Rewrites the trigger store from the hub's profiles (removed when
    /// none runs).
    pub(super) fn update_store(&self) {
        let _g = self.store.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.dir.join(TRIGGERS_FILE);
        if self.hub.profile_ids().is_empty() {
            let _ = std::fs::remove_file(&path);
            return;
        }
        let (all, names) = self.hub.startup_triggers();
        let bytes =
            heapprofd_proto::triggers::encode(all, names.iter().map(|(n, c)| (n.as_str(), *c)));
        if let Err(e) = write_triggers(&self.dir, &bytes) {
            log::warn!("{e:#}");
        }
    }
}

/// Whether a client without `HEAPPROFD_SERVICE_DIR` looks for the service
/// in `dir`: the system directory, or our user's runtime directory.
fn is_default_dir(dir: &Path) -> bool {
    let uid = nix::unistd::geteuid().as_raw();
    dir == Path::new(heapprofd_proto::service::SYSTEM_DIR)
        || dir == Path::new(heapprofd_proto::attach::runtime_dir_for_uid(uid).as_str())
}

/// Replaces the trigger store atomically (write, then rename), mode 0644
/// (clients of every user read it; only we write it).
fn write_triggers(dir: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{TRIGGERS_FILE}.tmp"));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, dir.join(TRIGGERS_FILE))
        .with_context(|| format!("installing {}", dir.join(TRIGGERS_FILE).display()))
}
