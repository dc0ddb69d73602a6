//! The service loads the client into running processes that have no
//! dormant one (`record -n NAME` of running programs, `record --pid`), the
//! way `record --pid` does with a daemon of its own ([`heapprofd_inject`]):
//! ptrace stops one thread at a safe point, `dlopen`s the client and calls
//! its attach entry with id 0 ("the service": the client finds the
//! service's socket as a woken one does, through its environment or the
//! trigger store). `--all` never injects: as Perfetto's heapprofd, it
//! profiles the processes that have the client.
//!
//! An injection runs on a blocking thread of its own (it may take seconds:
//! the search for a safe point, the calls in the target), so the service's
//! single-threaded runtime keeps serving; the profile task awaits it
//! before it ends. A pid already being injected for another profile is
//! only expected by the next one (the hub shares the session once it
//! connects). A process that cannot be injected (refused by the probe,
//! not permitted, gone meanwhile, no safe point) is named in the profile's
//! trace as not profiled, and `record`'s summary says why, unless its own
//! client connected meanwhile (the profile then shares that session, or is
//! flagged `rejected_concurrent` by it).
//!
//! A profile of threads (`--cpu-time`, `--event`) of a process named by
//! `-n` or `--pid` whose dormant client the signal could wake activates it
//! this way too: the signal only flags the start for the program's next
//! allocation, which a program that only computes never makes. If that
//! fails, the process is woken with the signal after all.
//!
//! A single-threaded target gets a synchronous session (no client thread),
//! unless the profile samples threads (only the client's thread would arm
//! those the program starts later);
//! when the last profile that wants it ends, the service calls the
//! client's detach entry the same way before stopping the session
//! ([`Injector::end_sync`]).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use heapprofd_inject::{self as inject, InjectOptions};
use heapprofd_unwinder::ModuleCache;

use super::BookMsg;
use super::book_msg::ServiceMsg;
use super::hub::{Hub, Joined, ProfileId};
use super::triggers::Triggers;
use crate::service::{access, running};

/// How long to look for a thread at a safe point.
const SAFE_POINT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `dlopen` and the attach entry may run in the target.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// The service's injections.
#[derive(Debug)]
pub(super) struct Injector {
    /// The client library to load (`None`: not found, said at each try).
    lib: Result<PathBuf, String>,
    /// The daemon's module cache (the safe-point checks parse unwind
    /// tables its sessions reuse).
    module_cache: Arc<ModuleCache>,
    /// Pids being injected now.
    in_flight: Mutex<HashSet<u32>>,
    /// Pids given a synchronous session, to end with the detach entry.
    sync: Mutex<HashSet<u32>>,
    /// Tests only: `HEAPPROFD_ATTACH_TEST_STALL` of the service.
    test_stall: Option<String>,
    safe_point_timeout: Duration,
}

/// What a profile asks to inject.
#[derive(Debug, Clone)]
pub(super) struct InjectRequest {
    /// The profile.
    pub(super) profile: ProfileId,
    /// The process and its name.
    pub(super) pid: u32,
    pub(super) name: String,
    /// The user who asked for the profile.
    pub(super) requester: u32,
    /// The profile samples threads (CPU time or a perf event): the client
    /// gets its thread even in a single-threaded process
    /// ([`InjectOptions::samples_threads`]).
    pub(super) samples_threads: bool,
    /// The process has a dormant client the signal can wake, activated
    /// with ptrace for a profile of threads: if that fails, it is woken
    /// with the signal instead (it then starts at its next allocation).
    pub(super) wake_fallback: bool,
}

impl Injector {
    /// The injector of a service whose daemon has `module_cache`.
    pub(super) fn new(
        module_cache: Arc<ModuleCache>,
        test_stall: Option<String>,
        safe_point_timeout: Option<Duration>,
    ) -> Injector {
        Injector {
            lib: super::setup::find_client_lib(None).map_err(|e| format!("{e:#}")),
            module_cache,
            in_flight: Mutex::default(),
            sync: Mutex::default(),
            test_stall,
            safe_point_timeout: safe_point_timeout.unwrap_or(SAFE_POINT_TIMEOUT),
        }
    }

    /// Marks `pid` as being injected; false if it already is (for another
    /// profile).
    pub(super) fn claim(&self, pid: u32) -> bool {
        lock(&self.in_flight).insert(pid)
    }

    /// Injects the client for `req` (claimed with [`Self::claim`]) on a
    /// blocking thread; on failure wakes the process with the signal
    /// through `triggers` if `req` asks for it, else (or if that fails too)
    /// names the process in the profile's trace (`book`); returns what
    /// `record` should be told.
    pub(super) async fn inject(
        self: Arc<Self>,
        req: InjectRequest,
        book: std::sync::mpsc::Sender<BookMsg>,
        triggers: &dyn Triggers,
        hub: &Hub,
    ) -> Option<String> {
        let me = Arc::clone(&self);
        let r = req.clone();
        let done = tokio::task::spawn_blocking(move || me.inject_blocking(&r)).await;
        lock(&self.in_flight).remove(&req.pid);
        let why = match done {
            Ok(Ok(())) => return None,
            Ok(Err(why)) => why,
            Err(e) => format!("the injection thread failed: {e}"),
        };
        let InjectRequest {
            profile, pid, name, ..
        } = req;
        // Its own client may have connected meanwhile (a dormant one woken
        // for another profile): the profile takes that session as a
        // running process's, and the failed load does not count.
        match hub.join(profile, pid) {
            Joined::Shared => {
                log::info!(
                    "profile {profile}: pid {pid} ({name}) connected by itself while \
                     the profiler was being loaded into it ({why}); shared"
                );
                return None;
            }
            Joined::Rejected => return Some(flag_rejected(&book, profile, pid, &name)),
            Joined::NoSession => {}
        }
        let why = if req.wake_fallback {
            match triggers.wake(pid) {
                Ok(()) => {
                    let note = format!(
                        "pid {pid} ({name}): could not activate its dormant profiler with \
                         ptrace ({why}); woke it with signal {} instead: it starts at its \
                         next allocation",
                        inject::ACTIVATION_SIGNAL
                    );
                    log::info!("profile {profile}: {note}");
                    return Some(note);
                }
                Err(e) => format!("{why}; waking it with the signal: {e:#}"),
            }
        } else {
            why
        };
        log::info!("profile {profile}: pid {pid} ({name}) not profiled: {why}");
        let cmdline = super::procinfo::read_cmdline(pid);
        let _ = book.send(BookMsg::Service(ServiceMsg::NotAttached(
            profile,
            pid,
            cmdline,
            why.clone(),
        )));
        Some(format!("pid {pid} ({name}) not profiled: {why}"))
    }

    fn inject_blocking(&self, req: &InjectRequest) -> Result<(), String> {
        let pid = req.pid;
        let lib = self.lib.clone()?;
        // The kernel's rule for ptrace, for root's service acting for a user.
        let identity = running::ptrace_identity(pid).ok_or("it exited")?;
        if !access::may_inject(req.requester, &identity) {
            return Err(format!(
                "user {} may not load the profiler into it (it changed credentials, \
                 or runs a set-user-ID or set-group-ID program)",
                req.requester
            ));
        }
        let target = inject::probe(pid).map_err(|e| e.to_string())?;
        let opts = InjectOptions {
            lib,
            id: heapprofd_proto::service::SIGNAL_VALUE_SERVICE as u32,
            safe_point_timeout: self.safe_point_timeout,
            call_timeout: CALL_TIMEOUT,
            module_cache: Arc::clone(&self.module_cache),
            samples_threads: req.samples_threads,
            test_stall: self.test_stall.clone(),
        };
        let report = inject::inject(&target, &opts).map_err(|e| e.to_string())?;
        if report.sync {
            lock(&self.sync).insert(pid);
        }
        log::info!(
            "profile {}: {} the profiler in pid {pid} ({}) through thread {}, paused {:.1} ms",
            req.profile,
            if report.loaded { "loaded" } else { "activated" },
            req.name,
            report.tid,
            report.pause.as_secs_f64() * 1e3
        );
        Ok(())
    }

    /// Ends the synchronous session of `pid`, if the service started one
    /// (a call into the target, on a blocking thread); before the session
    /// is stopped. A failure is logged: the client goes dormant when it
    /// sees the service stop the session.
    pub(super) async fn end_sync(self: &Arc<Self>, pid: u32) {
        if !lock(&self.sync).remove(&pid) {
            return;
        }
        let Ok(lib) = self.lib.clone() else {
            return;
        };
        let opts = InjectOptions {
            lib,
            id: 0,
            safe_point_timeout: self.safe_point_timeout,
            call_timeout: CALL_TIMEOUT,
            module_cache: Arc::clone(&self.module_cache),
            samples_threads: false,
            test_stall: None,
        };
        let ended = tokio::task::spawn_blocking(move || {
            let t = inject::probe_loaded(pid).map_err(|e| e.to_string())?;
            inject::detach(&t, &opts).map_err(|e| e.to_string())
        })
        .await;
        match ended {
            Ok(Ok(_)) => log::info!("ended the session inside pid {pid}"),
            Ok(Err(e)) => log::info!("could not end the session inside pid {pid}: {e}"),
            Err(e) => log::warn!("the detach thread of pid {pid} failed: {e}"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Flags running process `pid` (named `name`) `rejected_concurrent` in
/// profile `profile`'s trace: another profile samples it differently.
/// Returns what `record` should be told.
pub(super) fn flag_rejected(
    book: &std::sync::mpsc::Sender<BookMsg>,
    profile: ProfileId,
    pid: u32,
    name: &str,
) -> String {
    log::info!(
        "profile {profile}: pid {pid} ({name}) is profiled by another profile with \
         other sampling: rejected_concurrent"
    );
    let cmdline = super::procinfo::read_cmdline(pid);
    let _ = book.send(BookMsg::Service(ServiceMsg::Rejected(
        profile, pid, cmdline,
    )));
    format!(
        "pid {pid} ({name}): another profile samples it differently; flagged rejected_concurrent"
    )
}
