//! What every profile task of the service shares ([`Service`]): its
//! directory, the bookkeeping thread and session stopper of its one
//! daemon, the [`Hub`], profile ids, and the platform's [`Triggers`]: the
//! startup triggers are published from the hub's profiles whenever one
//! starts or ends (Linux: the trigger store, rewritten atomically; Android:
//! the `heapprofd.enable` properties), and running processes are woken
//! through them, or given the client with ptrace ([`Injector`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;

use super::BookMsg;
use super::hub::Hub;
use super::server::Stopper;
use super::service_inject::Injector;
use super::triggers::{self, Triggers, Wanted};

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
    /// Serializes the publishing of triggers.
    store: std::sync::Mutex<()>,
    /// Where triggers are published, how processes are woken.
    pub(super) triggers: Box<dyn Triggers>,
    /// Loads the client into running processes that have none.
    pub(super) injector: Arc<Injector>,
}

impl Service {
    /// The service in `dir`, with its daemon's bookkeeping and stopper.
    pub(super) fn new(
        dir: PathBuf,
        book: Sender<BookMsg>,
        stopper: Stopper,
        hub: Arc<Hub>,
        injector: Injector,
    ) -> Service {
        Service {
            default_dir: is_default_dir(&dir),
            triggers: triggers::for_platform(&dir),
            dir,
            book,
            stopper,
            hub,
            injector: Arc::new(injector),
            next_profile: AtomicU64::new(1),
            store: std::sync::Mutex::new(()),
        }
    }

    /// A fresh profile id.
    pub(super) fn profile_id(&self) -> u64 {
        self.next_profile.fetch_add(1, Ordering::Relaxed)
    }

    /// Publishes the startup triggers from the hub's profiles (all
    /// cleared when none runs).
    pub(super) fn update_store(&self) {
        let _g = self.store.lock().unwrap_or_else(|p| p.into_inner());
        let any_profile = !self.hub.profile_ids().is_empty();
        let wanted = if any_profile {
            let (all, names) = self.hub.startup_triggers();
            Wanted {
                any_profile,
                all,
                names,
            }
        } else {
            Wanted::default()
        };
        if let Err(e) = self.triggers.publish(&wanted) {
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
