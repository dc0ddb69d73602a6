//! The bookkeeping state machine: applies the workers' [`SessionEvent`]s to
//! the [`Profile`], in arrival order (the profile itself commits each
//! process's operations in sequence order).
//!
//! What it adds to the profile:
//!
//! * **Sessions.** Each session (one client connection) maps to its pid;
//!   a session's [`Op::Stack`] definitions are kept as a per-session
//!   vector id -> callsite, so a malloc costs one index instead of a walk
//!   of the callsite tree.
//! * **exec hold-back.** A process that calls exec closes its session and
//!   the new image connects with the same pid and a new sequence-number
//!   space, often before the old session's records are all drained. Every
//!   event of a session whose pid still has an older session is held back
//!   until that one ends; then the profile starts a new session for the
//!   pid (pending operations committed, the old image's live allocations
//!   counted freed: exec threw that memory away; sequence numbers from 1)
//!   and the held events are applied. A process's statistics add up the
//!   statistics of all its sessions (the images before and after each
//!   exec).
//!   [`Bookkeeping::finish`] applies what is still held (its predecessor
//!   never ended).
//! * **Statistics and flags** from each batch's [`SessionStats`] (ring
//!   overruns, corruption, the client's error), and the data of the
//!   end-of-run summary ([`Bookkeeping::summary`]).
//! * **Processes that run unprofiled** ([`SessionEvent::Unprofilable`]):
//!   the process gets an empty default heap (so every dump names it) with
//!   the `disconnected` flag (Perfetto has no field for "could not be
//!   profiled"; trace processor reports it as a disconnected client) and
//!   the reason for the summary.
//! * **Processes another profile samples differently**
//!   ([`Bookkeeping::reject_concurrent`]): an empty default heap with the
//!   `rejected_concurrent` flag.
//!
//! Dumps are the caller's: [`Bookkeeping::profile_mut`] lends the profile
//! to a [`TraceWriter`](crate::trace::TraceWriter).

use std::collections::{BTreeMap, HashMap};

use crate::messages::{Op, SessionEvent, SessionId, SessionStats};
use crate::profile::{
    Alloc, CallsiteId, ClientError, FrameId, Interner, ProcessStats, Profile, StackSample,
};
use crate::summary::{ProcessSummary, summarize};

/// The bookkeeping of one profiling run; see the module docs.
#[derive(Debug)]
pub struct Bookkeeping {
    profile: Profile,
    /// Sampling interval of the default heap of every new session.
    interval: u64,
    /// Sessions started and not ended: pid and latest stats.
    sessions: BTreeMap<SessionId, (u32, SessionStats)>,
    /// Per session: its worker's stack ids -> callsites.
    stacks: BTreeMap<SessionId, Vec<Option<CallsiteId>>>,
    /// Per session: its user context ids -> their root frames.
    contexts: BTreeMap<SessionId, HashMap<u64, FrameId>>,
    /// (callsite, context root frame) -> the callsite under that root.
    context_callsites: HashMap<(CallsiteId, Option<FrameId>), CallsiteId>,
    /// Sessions that ended: pid and final stats.
    ended: Vec<(u32, SessionStats)>,
    /// Per pid: the process statistics of its ended sessions, added up.
    ended_stats: BTreeMap<u32, ProcessStats>,
    /// Events of sessions held back behind an older session of their pid,
    /// by session (ids grow with connection order, so the oldest is first).
    held: BTreeMap<SessionId, Vec<SessionEvent>>,
}

impl Bookkeeping {
    /// Empty bookkeeping; the default heap of every session samples every
    /// `interval` bytes.
    pub fn new(interner: &Interner, interval: u64) -> Self {
        Self::with_profile(Profile::new(interner), interval)
    }

    /// Bookkeeping over `profile` (e.g. one with another reordering window).
    pub fn with_profile(profile: Profile, interval: u64) -> Self {
        Bookkeeping {
            profile,
            interval,
            sessions: BTreeMap::new(),
            stacks: BTreeMap::new(),
            contexts: BTreeMap::new(),
            context_callsites: HashMap::new(),
            ended: Vec::new(),
            ended_stats: BTreeMap::new(),
            held: BTreeMap::new(),
        }
    }

    /// Applies one event, or holds it back behind an older session of the
    /// same pid (see the module docs). Returns whether it was applied now.
    pub fn handle(&mut self, event: SessionEvent) -> bool {
        if let Some(queue) = self.held.get_mut(&event.session()) {
            queue.push(event);
            return false;
        }
        match event {
            SessionEvent::Started {
                id,
                pid,
                cmdline,
                from_startup,
                started_ns,
                identity,
                memory,
            } => {
                if self.sessions.values().any(|(p, _)| *p == pid) {
                    let started = SessionEvent::Started {
                        id,
                        pid,
                        cmdline,
                        from_startup,
                        started_ns,
                        identity,
                        memory,
                    };
                    self.held.insert(id, vec![started]);
                    return false;
                }
                // A pid we already know: the process called exec (its old
                // image's session has ended) or the pid was reused.
                self.profile.new_session(pid);
                let p = self.profile.add_process(pid, cmdline, from_startup);
                p.sessions += 1;
                p.identity.update(identity);
                if p.session_start_ns == 0 {
                    p.session_start_ns = started_ns;
                }
                self.profile.set_heap(
                    pid,
                    heapprofd_proto::wire::HEAP_LIBC_MALLOC,
                    Some(heapprofd_proto::wire::HEAP_LIBC_MALLOC_NAME),
                    self.interval,
                );
                self.sessions.insert(id, (pid, SessionStats::default()));
            }
            SessionEvent::Ops { id, ops, stats } => {
                if let Some(pid) = self.sessions.get(&id).map(|s| s.0) {
                    self.apply(id, pid, ops);
                    self.set_stats(id, pid, stats);
                }
            }
            SessionEvent::Unprofilable {
                id: _,
                pid,
                cmdline,
                why,
                identity,
            } => {
                if self.profile.process(pid).is_none() {
                    self.profile.add_process(pid, cmdline, true);
                    self.profile.set_heap(
                        pid,
                        heapprofd_proto::wire::HEAP_LIBC_MALLOC,
                        Some(heapprofd_proto::wire::HEAP_LIBC_MALLOC_NAME),
                        self.interval,
                    );
                }
                if let Some(p) = self.profile.process_mut(pid) {
                    p.flags.disconnected = true;
                    p.unprofilable = Some(why);
                    p.identity.update(identity);
                }
            }
            SessionEvent::Ended {
                id,
                pid,
                stats,
                end,
            } => {
                self.set_stats(id, pid, stats.clone());
                if let Some(p) = self.profile.process_mut(pid) {
                    p.flags.disconnected |= end.disconnected;
                }
                self.profile.flush(pid);
                self.sessions.remove(&id);
                self.stacks.remove(&id);
                self.contexts.remove(&id);
                self.contexts.remove(&id);
                self.ended_stats
                    .entry(pid)
                    .or_default()
                    .add(&process_stats(&stats));
                self.ended.push((pid, stats));
                // Release the next session of this pid, if one was waiting.
                let next = self
                    .held
                    .iter()
                    .find(|(_, q)| {
                        matches!(q.first(), Some(SessionEvent::Started { pid: p, .. }) if *p == pid)
                    })
                    .map(|(&id, _)| id);
                if let Some(next) = next.and_then(|n| self.held.remove(&n)) {
                    for e in next {
                        self.handle(e);
                    }
                }
            }
        }
        true
    }

    /// Process `pid` was wanted, but another profile already samples it
    /// differently: it is in the trace with an empty default heap and the
    /// `rejected_concurrent` flag (as Perfetto's heapprofd writes it).
    pub fn reject_concurrent(&mut self, pid: u32, cmdline: Vec<String>) {
        if self.profile.process(pid).is_none() {
            self.profile.add_process(pid, cmdline, false);
            self.profile.set_heap(
                pid,
                heapprofd_proto::wire::HEAP_LIBC_MALLOC,
                Some(heapprofd_proto::wire::HEAP_LIBC_MALLOC_NAME),
                self.interval,
            );
        }
        if let Some(p) = self.profile.process_mut(pid) {
            p.flags.rejected_concurrent = true;
        }
    }

    /// Process `pid` was wanted, but the client could not be loaded into
    /// it (`why`): it is in the trace with an empty default heap and the
    /// `disconnected` flag (Perfetto has no field for "could not be
    /// profiled"), and the summary names it with the reason. A process
    /// that has a session, or that another profile's sampling got
    /// rejected, keeps what it is (the failed load came second).
    pub fn not_attached(&mut self, pid: u32, cmdline: Vec<String>, why: String) {
        if self.profile.process(pid).is_none() {
            self.profile.add_process(pid, cmdline, false);
            self.profile.set_heap(
                pid,
                heapprofd_proto::wire::HEAP_LIBC_MALLOC,
                Some(heapprofd_proto::wire::HEAP_LIBC_MALLOC_NAME),
                self.interval,
            );
        }
        if let Some(p) = self
            .profile
            .process_mut(pid)
            .filter(|p| p.sessions == 0 && !p.flags.rejected_concurrent)
        {
            p.flags.disconnected = true;
            p.not_attached = Some(why);
        }
    }

    fn apply(&mut self, id: SessionId, pid: u32, ops: Vec<Op>) {
        let stacks = self.stacks.entry(id).or_default();
        let contexts = self.contexts.entry(id).or_default();
        for op in ops {
            match op {
                Op::Stack { id, frames } => {
                    let callsite = self.profile.intern_callsite(&frames);
                    let i = id as usize;
                    if stacks.len() <= i {
                        stacks.resize(i + 1, None);
                    }
                    stacks[i] = Some(callsite);
                }
                Op::Malloc {
                    heap,
                    seq,
                    address,
                    sample_size,
                    size,
                    tid,
                    timestamp_ns,
                    stack,
                    context,
                    interval_shift,
                } => {
                    // Every id is defined before use; an undefined one
                    // would be a worker bug, kept visible as an empty stack.
                    let mut callsite = match stacks.get(stack as usize) {
                        Some(&Some(c)) => c,
                        _ => self.profile.intern_callsite(&[]),
                    };
                    if context != 0 {
                        let frame = contexts.get(&context).copied();
                        if frame.is_none() {
                            if let Some(p) = self.profile.process_mut(pid) {
                                p.contexts.unknown_samples += 1;
                            }
                        }
                        let profile = &mut self.profile;
                        callsite = *self
                            .context_callsites
                            .entry((callsite, frame))
                            .or_insert_with(|| profile.context_callsite(callsite, frame));
                    }
                    let alloc = Alloc {
                        heap,
                        seq,
                        address,
                        sample_size,
                        size,
                        tid,
                        timestamp_ns,
                    };
                    self.profile
                        .malloc_drawn_at(pid, alloc, callsite, interval_shift)
                }
                Op::Free { heap, seq, address } => self.profile.free(pid, heap, seq, address),
                Op::StackSample {
                    tid,
                    tag,
                    timestamp_ns,
                    cpu_time_ns,
                    period,
                    stack,
                    biased,
                    lost_overrun,
                    lost_dropped,
                    unwind_error,
                } => {
                    let callsite = match stacks.get(stack as usize) {
                        Some(&Some(c)) => c,
                        _ => self.profile.intern_callsite(&[]),
                    };
                    let sample = StackSample {
                        timestamp_ns,
                        cpu_time_ns,
                        tid,
                        tag,
                        period,
                        callsite,
                        biased,
                        unwind_error,
                    };
                    let (o, d) = (u64::from(lost_overrun), u64::from(lost_dropped));
                    self.profile.stack_sample(pid, sample, o, d);
                }
                Op::SampleLosses {
                    tid,
                    tag,
                    lost_overrun,
                    lost_dropped,
                } => {
                    let (o, d) = (u64::from(lost_overrun), u64::from(lost_dropped));
                    self.profile.sample_losses(pid, tag, tid, o, d);
                }
                Op::EventName { tag, name } => self.profile.set_event_name(pid, tag, name),
                Op::Context {
                    id,
                    frame,
                    overflowed,
                } => {
                    contexts.insert(id, frame);
                    if let Some(p) = self.profile.process_mut(pid) {
                        p.contexts.defined += 1;
                        p.contexts.overflowed = p.contexts.overflowed.max(overflowed);
                    }
                }
                Op::HeapName {
                    heap,
                    name,
                    interval,
                } => {
                    let name = (!name.is_empty()).then_some(name.as_str());
                    self.profile.set_heap(pid, heap, name, interval)
                }
            }
        }
    }

    fn set_stats(&mut self, id: SessionId, pid: u32, s: SessionStats) {
        if let Some(p) = self.profile.process_mut(pid) {
            let mut total = self.ended_stats.get(&pid).cloned().unwrap_or_default();
            total.add(&process_stats(&s));
            p.stats = total;
            let f = &mut p.flags;
            f.buffer_overran |=
                s.ring.writes_overflow > 0 || s.client_error == ClientError::HitTimeout;
            f.buffer_corrupted |= s.ring_corrupt
                || s.corrupt_records > 0
                || s.ring.writes_corrupt > 0
                || s.ring.reads_corrupt > 0;
            if s.client_error != ClientError::None {
                f.client_error = s.client_error;
            }
        }
        if let Some(entry) = self.sessions.get_mut(&id) {
            entry.1 = s;
        }
    }

    /// The end of the run: applies every held-back session (its
    /// predecessor never ended) and commits every pending operation. Write
    /// the final dump after this.
    pub fn finish(&mut self) {
        // Oldest first; each released session is ended before the next, so
        // none is held back behind it again.
        while let Some((_, events)) = self.held.pop_first() {
            self.end_active_sessions();
            for e in events {
                self.handle(e);
            }
        }
        self.profile.flush_all();
    }

    /// Moves every session still active to the ended ones (the run is over:
    /// nothing more comes from them).
    fn end_active_sessions(&mut self) {
        for (id, (pid, stats)) in std::mem::take(&mut self.sessions) {
            self.profile.flush(pid);
            self.stacks.remove(&id);
            self.contexts.remove(&id);
            self.ended_stats
                .entry(pid)
                .or_default()
                .add(&process_stats(&stats));
            self.ended.push((pid, stats));
        }
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Retires the idle callsites after a dump (see
    /// [`Profile::retire_idle`]); what the sessions' stack ids and the
    /// context callsites refer to stays. Returns the tree nodes removed.
    pub fn retire_idle(&mut self) -> usize {
        let held = self
            .stacks
            .values()
            .flat_map(|v| v.iter().flatten().copied())
            .chain(
                self.context_callsites
                    .iter()
                    .flat_map(|(&(from, _), &to)| [from, to]),
            );
        self.profile.retire_idle(held)
    }

    /// A retirement pass of `interner` (see [`Interner::retire_unused`]):
    /// what the profile's tree, the sessions' contexts and the context
    /// callsites refer to stays. Only for an interner this bookkeeping
    /// alone uses.
    pub fn retire_interned(&self, interner: &Interner) -> crate::profile::RetiredEntries {
        let held = self
            .contexts
            .values()
            .flat_map(|m| m.values().copied())
            .chain(self.context_callsites.keys().filter_map(|&(_, f)| f));
        interner.retire_unused(self.profile.frames().chain(held))
    }

    /// The profile, to dump it.
    pub fn profile_mut(&mut self) -> &mut Profile {
        &mut self.profile
    }

    /// Sessions whose events are held back behind an older session of
    /// their pid.
    pub fn held_back(&self) -> usize {
        self.held.len()
    }

    /// Sessions started and not ended (held-back ones not included).
    pub fn active_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Pids of the sessions started and not ended.
    pub fn active_pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.sessions.values().map(|(p, _)| *p).collect();
        pids.dedup();
        pids
    }

    /// Live sampled bytes over every process and heap.
    pub fn live_bytes(&self) -> u64 {
        self.profile.live_bytes()
    }

    /// Records the clients dropped because a ring buffer was full, over
    /// every session so far.
    pub fn dropped_records(&self) -> u64 {
        self.all_stats().map(|(_, s)| s.ring.writes_overflow).sum()
    }

    fn all_stats(&self) -> impl Iterator<Item = (u32, &SessionStats)> {
        self.ended
            .iter()
            .map(|(pid, s)| (*pid, s))
            .chain(self.sessions.values().map(|(pid, s)| (*pid, s)))
    }

    /// The data of the end-of-run summary, one entry per process.
    pub fn summary(&self) -> Vec<ProcessSummary> {
        summarize(&self.profile, self.all_stats())
    }
}

/// The part of a session's statistics that goes into its process's.
fn process_stats(s: &SessionStats) -> ProcessStats {
    ProcessStats {
        unwinding_errors: s.unwinding_errors,
        heap_samples: s.heap_samples,
        map_reparses: s.map_reparses,
        unwinding_time_us: s.unwinding_time_us.clone(),
        total_unwinding_time_us: s.total_unwinding_time_us,
        client_spinlock_blocked_us: s.ring.blocked_us,
    }
}

#[cfg(test)]
mod tests;
