//! The service's bookkeeping thread: one [`Book`] (bookkeeping and trace)
//! per profile, and the session events fanned out to the profiles each
//! session feeds ([`super::hub`]).
//!
//! A session's events go, cloned, to every profile of its route. A
//! profile that joins a session later (it started while the process was
//! already profiled for another) first gets the session's start and the
//! stacks defined so far, then its events from there on: what the process
//! allocated before is unknown to it, as for `record --pid`. When a
//! profile ends ([`ServiceMsg::End`]), the sessions other profiles still
//! want end for it alone (a synthetic end, stopped by the daemon); the
//! sessions it had alone were stopped by the service, and its trace is
//! written once their last records are drained, and once every session
//! admitted for it before its end has reached this thread (a process that
//! connected just before the end is in the trace; at most [`END_WAIT`]).
//!
//! Guardrails (Perfetto's `max_heapprofd_cpu_secs`,
//! `max_heapprofd_memory_kb`) are checked per profile at each batch and
//! every 200 ms: a process past one ends for that profile, flagged
//! `hit_guardrail` in its trace, instead of growing without bound.
//!
//! Once no profile runs and no session is open, the service forgets what
//! its interner holds (mappings are interned with their addresses: every
//! process adds its own) and the symbolizer's queue, so its memory does not
//! grow from one profile to the next.

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use heapprofd_model::messages::{Op, SessionEnd, SessionEvent, SessionId, SessionStats};
use heapprofd_model::profile::FrameId;

use super::book_msg::{BookMsg, ServiceMsg};
use super::bookkeeper::{Book, BookkeeperShared};
use super::hub::{Hub, ProfileId};
use super::server::Stopper;
use super::summary::Summary;
use crate::service::spec::Guardrails;

/// How long an ending profile waits for the sessions it had alone.
pub const END_WAIT: Duration = Duration::from_secs(10);
/// How often the service's memory is read for `max_heapprofd_memory_kb`.
pub const MEMORY_CHECK: Duration = Duration::from_millis(500);

/// What the thread knows of one session.
#[derive(Debug)]
struct Feed {
    /// Its start, for profiles that join later.
    started: SessionEvent,
    /// Its stack definitions so far (id -> frames), for the same.
    stacks: Vec<Option<Box<[FrameId]>>>,
    /// Its latest statistics.
    stats: SessionStats,
    /// The profiles that got its start.
    delivered: Vec<ProfileId>,
    pid: u32,
}

struct Router {
    hub: Arc<Hub>,
    shared: BookkeeperShared,
    stopper: Arc<OnceLock<Stopper>>,
    books: BTreeMap<ProfileId, Book>,
    guardrails: BTreeMap<ProfileId, Guardrails>,
    /// The service's resident memory, read at most every [`MEMORY_CHECK`].
    rss_kb: (u64, Option<Instant>),
    feeds: HashMap<SessionId, Feed>,
    ending: Vec<(ProfileId, Sender<anyhow::Result<Summary>>, Instant)>,
}

/// Runs the thread until [`BookMsg::Finish`] (the service stops: every
/// profile still open is written).
/// `stopper` stops the sessions a guardrail ends (set once the daemon runs).
pub fn run(
    rx: Receiver<BookMsg>,
    shared: BookkeeperShared,
    hub: Arc<Hub>,
    stopper: Arc<OnceLock<Stopper>>,
) {
    let mut r = Router {
        hub,
        shared,
        stopper,
        books: BTreeMap::new(),
        guardrails: BTreeMap::new(),
        rss_kb: (0, None),
        feeds: HashMap::new(),
        ending: Vec::new(),
    };
    loop {
        let msg = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        match msg {
            Some(BookMsg::Session(e)) => r.event(*e),
            Some(BookMsg::Dump(asked)) => r.books.values_mut().for_each(|b| b.dump_at(asked)),
            Some(BookMsg::Service(m)) => r.service(m),
            Some(BookMsg::Finish(reply, _)) => {
                r.finish_all();
                let _ = reply.send(Ok(Summary::default()));
                return;
            }
            None => {}
        }
        r.check_guardrails(None);
        r.check_ending();
        r.forget_when_idle();
    }
}

impl Router {
    fn service(&mut self, m: ServiceMsg) {
        match m {
            ServiceMsg::Add(id, options, guardrails) => {
                match Book::open(self.shared.clone(), options) {
                    Ok(b) => {
                        self.books.insert(id, b);
                        if guardrails != Guardrails::default() {
                            self.guardrails.insert(id, guardrails);
                        }
                    }
                    Err(e) => log::warn!("profile {id}: {e}"),
                }
            }
            ServiceMsg::Rejected(id, pid, cmdline) => {
                if let Some(b) = self.books.get_mut(&id) {
                    b.bookkeeping_mut().reject_concurrent(pid, cmdline);
                }
            }
            ServiceMsg::NotAttached(id, pid, cmdline, why) => {
                if let Some(b) = self.books.get_mut(&id) {
                    b.bookkeeping_mut().not_attached(pid, cmdline, why);
                }
            }
            ServiceMsg::Dump(id, asked) => {
                if let Some(b) = self.books.get_mut(&id) {
                    b.dump_at(asked);
                }
            }
            ServiceMsg::Unprofilable(ids, pid, cmdline, why) => {
                let identity = super::procinfo::read_identity(pid);
                for id in ids {
                    if let Some(b) = self.books.get_mut(&id) {
                        b.handle(SessionEvent::Unprofilable {
                            id: 0,
                            pid,
                            cmdline: cmdline.clone(),
                            why,
                            identity: identity.clone(),
                        });
                    }
                }
            }
            ServiceMsg::End(id, reply) => {
                self.ending.push((id, reply, Instant::now() + END_WAIT));
            }
            ServiceMsg::Barrier(reply) => {
                let _ = reply.send(());
            }
        }
    }

    /// Whether session `s` still feeds some profile.
    fn still_routed(&self, s: SessionId) -> bool {
        self.hub.route(s).is_some_and(|r| !r.profiles.is_empty())
    }

    /// Ends session `s` for profile `id` alone.
    fn end_for(&mut self, s: SessionId, id: ProfileId) {
        let Some(f) = self.feeds.get_mut(&s) else {
            return;
        };
        f.delivered.retain(|&p| p != id);
        let ended = SessionEvent::Ended {
            id: s,
            pid: f.pid,
            stats: f.stats.clone(),
            end: SessionEnd {
                disconnected: false,
                stopped_by_daemon: true,
            },
        };
        if let Some(b) = self.books.get_mut(&id) {
            b.handle(ended);
        }
    }

    /// Writes the profiles whose own sessions are drained (or waited for
    /// long enough) and answers. Sessions other profiles still want end for
    /// an ending profile at once; those it had alone are waited for, and so
    /// are sessions admitted for it whose start has not arrived yet.
    fn check_ending(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.ending.len() {
            let id = self.ending[i].0;
            let mine: Vec<SessionId> = self
                .feeds
                .iter()
                .filter(|(_, f)| f.delivered.contains(&id))
                .map(|(&s, _)| s)
                .collect();
            let mut waiting = Vec::new();
            for s in mine {
                if self.still_routed(s) {
                    self.end_for(s, id);
                } else {
                    waiting.push(s);
                }
            }
            let on_the_way = self
                .hub
                .admitted_for(id)
                .into_iter()
                .any(|s| !self.feeds.contains_key(&s));
            if (!waiting.is_empty() || on_the_way) && now < self.ending[i].2 {
                i += 1;
                continue;
            }
            for s in waiting {
                self.end_for(s, id);
            }
            let (id, reply, _) = self.ending.swap_remove(i);
            self.guardrails.remove(&id);
            let result = match self.books.remove(&id) {
                Some(b) => b.finish(),
                None => Err(anyhow::anyhow!("the profile's trace could not be opened")),
            };
            let _ = reply.send(result);
        }
    }

    /// With no profile and no session left, forgets what was interned
    /// (every process's mappings and frames: they are interned with their
    /// addresses) and the symbolizer's queue of it, so the service's memory
    /// does not grow from one profile to the next. Under the hub's lock: no
    /// process is admitted (and no worker interns) meanwhile.
    fn forget_when_idle(&mut self) {
        if !self.books.is_empty() || !self.feeds.is_empty() || !self.ending.is_empty() {
            return;
        }
        let interner = &self.shared.interner;
        let counts = interner.counts();
        if counts == (0, 0, 0) {
            return;
        }
        let symbolizer = &self.shared.symbolizer;
        if self.hub.while_idle(|| {
            interner.clear();
            symbolizer.clear();
        }) {
            log::info!(
                "service idle: forgot {} strings, {} mappings, {} frames",
                counts.0,
                counts.1,
                counts.2
            );
        }
    }

    fn finish_all(&mut self) {
        for e in &mut self.ending {
            e.2 = Instant::now();
        }
        self.check_ending();
        let ids: Vec<ProfileId> = self.books.keys().copied().collect();
        for id in ids {
            let sessions: Vec<SessionId> = self
                .feeds
                .iter()
                .filter(|(_, f)| f.delivered.contains(&id))
                .map(|(&s, _)| s)
                .collect();
            for s in sessions {
                self.end_for(s, id);
            }
            self.guardrails.remove(&id);
            if let Some(b) = self.books.remove(&id)
                && let Err(e) = b.finish()
            {
                log::warn!("profile {id}: {e:#}");
            }
        }
    }

    /// The service's resident memory in KiB (read again at most every
    /// [`MEMORY_CHECK`]).
    fn rss_kb(&mut self) -> u64 {
        let fresh = self.rss_kb.1.is_some_and(|t| t.elapsed() < MEMORY_CHECK);
        if !fresh {
            let pages = std::fs::read_to_string("/proc/self/statm")
                .ok()
                .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
                .unwrap_or(0);
            let page_kb = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
                .ok()
                .flatten()
                .map_or(4, |p| p as u64 / 1024);
            self.rss_kb = (pages * page_kb, Some(Instant::now()));
        }
        self.rss_kb.0
    }

    /// Ends, for each profile with guardrails, the sessions (of `only`, or
    /// all) past one: `max_heapprofd_cpu_secs` against the time spent
    /// unwinding the process, `max_heapprofd_memory_kb` against the
    /// service's resident memory (heapprofd's own measure: past it, every
    /// process of the profile). The process is flagged `hit_guardrail` in
    /// that profile's trace and its session ends there (and stops if no
    /// other profile wants it).
    fn check_guardrails(&mut self, only: Option<SessionId>) {
        if self.guardrails.is_empty() {
            return;
        }
        let rss = self.rss_kb();
        let mut hits = Vec::new();
        for (&s, f) in &self.feeds {
            if only.is_some_and(|o| o != s) {
                continue;
            }
            for p in &f.delivered {
                let Some(g) = self.guardrails.get(p) else {
                    continue;
                };
                let memory = g
                    .max_heapprofd_memory_kb
                    .is_some_and(|k| rss > u64::from(k));
                let cpu = g
                    .max_heapprofd_cpu_secs
                    .is_some_and(|c| f.stats.total_unwinding_time_us > c.saturating_mul(1_000_000));
                if memory || cpu {
                    hits.push((s, *p, f.pid, memory));
                }
            }
        }
        for (s, p, pid, memory) in hits {
            log::warn!(
                "profile {p}: pid {pid} hit the {} guardrail; its profile ends there",
                if memory {
                    "max_heapprofd_memory_kb"
                } else {
                    "max_heapprofd_cpu_secs"
                }
            );
            self.end_for(s, p);
            if let Some(b) = self.books.get_mut(&p)
                && let Some(proc_) = b.bookkeeping_mut().profile_mut().process_mut(pid)
            {
                proc_.flags.hit_guardrail = true;
            }
            if self.hub.leave(s, p)
                && let Some(stopper) = self.stopper.get()
            {
                stopper.stop_session(s, pid);
            }
        }
    }

    /// Gives the session's start (and stacks so far) to the profiles of
    /// its route that did not get it yet.
    fn reconcile(&mut self, s: SessionId, at_start: bool) {
        let Some(route) = self.hub.route(s) else {
            return;
        };
        let Some(f) = self.feeds.get_mut(&s) else {
            return;
        };
        // At its start: every profile it was admitted for that is still
        // open or ending; later: the profiles that joined since.
        let mut targets = route.profiles;
        if at_start {
            for p in route.admitted {
                if !targets.contains(&p) {
                    targets.push(p);
                }
            }
        }
        for p in targets {
            if f.delivered.contains(&p) {
                continue;
            }
            let Some(b) = self.books.get_mut(&p) else {
                continue;
            };
            f.delivered.push(p);
            let mut started = f.started.clone();
            if let SessionEvent::Started { from_startup, .. } = &mut started
                && f.stats != SessionStats::default()
            {
                // Joined a running session: not from its start.
                *from_startup = false;
            }
            b.handle(started);
            let ops: Vec<Op> = f
                .stacks
                .iter()
                .enumerate()
                .filter_map(|(i, fr)| {
                    fr.as_ref().map(|frames| Op::Stack {
                        id: i as u32,
                        frames: frames.clone(),
                    })
                })
                .collect();
            if !ops.is_empty() {
                b.handle(SessionEvent::Ops {
                    id: s,
                    ops,
                    stats: f.stats.clone(),
                });
            }
        }
    }

    /// Sends `e` to every profile that got the session's start.
    fn deliver(&mut self, s: SessionId, e: SessionEvent) {
        let Some(f) = self.feeds.get(&s) else {
            return;
        };
        let targets: Vec<ProfileId> = f.delivered.clone();
        let Some((last, rest)) = targets.split_last() else {
            return;
        };
        for p in rest {
            if let Some(b) = self.books.get_mut(p) {
                b.handle(e.clone());
            }
        }
        if let Some(b) = self.books.get_mut(last) {
            b.handle(e);
        }
    }

    fn event(&mut self, e: SessionEvent) {
        let s = e.session();
        match &e {
            SessionEvent::Started { pid, cmdline, .. } => {
                let pid = *pid;
                if let Some(route) = self.hub.route(s) {
                    for p in &route.rejected {
                        if let Some(b) = self.books.get_mut(p) {
                            b.bookkeeping_mut().reject_concurrent(pid, cmdline.clone());
                        }
                    }
                }
                self.feeds.insert(
                    s,
                    Feed {
                        started: e,
                        stacks: Vec::new(),
                        stats: SessionStats::default(),
                        delivered: Vec::new(),
                        pid,
                    },
                );
                self.reconcile(s, true);
                self.check_guardrails(Some(s));
            }
            SessionEvent::Ops { ops, stats, .. } => {
                self.reconcile(s, false);
                if let Some(f) = self.feeds.get_mut(&s) {
                    for op in ops {
                        if let Op::Stack { id, frames } = op {
                            let i = *id as usize;
                            if f.stacks.len() <= i {
                                f.stacks.resize(i + 1, None);
                            }
                            f.stacks[i] = Some(frames.clone());
                        }
                    }
                    f.stats = stats.clone();
                }
                self.deliver(s, e);
                self.check_guardrails(Some(s));
            }
            SessionEvent::Ended { .. } => {
                self.reconcile(s, false);
                self.deliver(s, e);
                self.feeds.remove(&s);
                self.hub.session_ended(s);
            }
            SessionEvent::Unprofilable { cmdline, .. } => {
                let first = cmdline.first().map_or("", String::as_str);
                let name = String::from_utf8_lossy(heapprofd_proto::triggers::process_name(
                    first.as_bytes(),
                ))
                .into_owned();
                for p in self.hub.wanting_name(&name) {
                    if let Some(b) = self.books.get_mut(&p) {
                        b.handle(e.clone());
                    }
                }
            }
        }
    }
}
