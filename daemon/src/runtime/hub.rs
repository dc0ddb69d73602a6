//! The service's profiles and which session feeds which: the one table the
//! accept loop, the service's profile tasks and its bookkeeping thread
//! share (behind one mutex, held only for table updates).
//!
//! A process is profiled once, whatever number of profiles want it. When a
//! client connects ([`Hub::admit`]) the profiles that want it are found:
//! those that woke it (their pending pids), and, for a client connecting
//! from its start, those that profile its name (or everything) from
//! startup. The oldest of them decides the client's configuration; every
//! other one with the same sampling (interval and heaps) shares the
//! session, its samples go to both traces; one whose sampling differs gets
//! the process flagged `rejected_concurrent` in its trace, as Perfetto's
//! heapprofd does. A profile that starts while a wanted process already
//! has a session joins it the same way ([`Hub::join`]). When a profile
//! ends ([`Hub::end_profile`]), the sessions no other profile wants are
//! the ones to stop; the others go on for the rest.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use heapprofd_model::messages::SessionId;
use heapprofd_proto::wire::ClientConfig;

use crate::service::access;
use crate::service::spec::Targets;

/// Identifies one profile of the service.
pub type ProfileId = u64;

/// What one profile wants.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// Which processes.
    pub targets: Targets,
    /// The configuration its processes get.
    pub client: ClientConfig,
    /// Pids woken (or injected) for it, not connected yet.
    pub pending: BTreeSet<u32>,
    /// The user who asked for it: it sees only the processes that user may
    /// profile ([`access::may_profile`]: everyone's for root).
    pub requester: u32,
    /// When it started, in clock ticks since boot (as `/proc/PID/stat`'s
    /// start time): the processes that started since are its startup ones.
    pub since_ticks: u64,
}

/// Which profiles one session feeds.
#[derive(Debug, Clone)]
pub struct Route {
    /// The process.
    pub pid: u32,
    /// Its effective user, as the kernel said at the handshake.
    pub uid: u32,
    /// The profiles its samples go to (oldest first).
    pub profiles: Vec<ProfileId>,
    /// The configuration the client got.
    pub client: ClientConfig,
    /// Profiles that wanted it but sample differently (flagged
    /// `rejected_concurrent` in theirs).
    pub rejected: Vec<ProfileId>,
    /// The profiles it was admitted for: they get its start even if they
    /// began to end before it reached the bookkeeping.
    pub admitted: Vec<ProfileId>,
    /// Whether it reached its worker: until then a drain asked of the
    /// worker would not find it (the client may be writing already).
    pub at_worker: bool,
}

/// The profiles that want a connecting process, as [`Hub::admit`] decides.
#[derive(Debug, Clone)]
pub struct Admission {
    /// The configuration to send.
    pub client: ClientConfig,
    /// Profiles whose sampling differs: the process is flagged
    /// `rejected_concurrent` in theirs.
    pub rejected: Vec<ProfileId>,
}

/// What [`Hub::join`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// The profile shares the session now.
    Shared,
    /// Another profile samples the process differently: rejected.
    Rejected,
    /// The process has no session.
    NoSession,
}

#[derive(Debug, Default)]
struct State {
    profiles: BTreeMap<ProfileId, Wanted>,
    sessions: HashMap<SessionId, Route>,
}

/// The shared table; see the module docs.
#[derive(Debug, Default)]
pub struct Hub {
    state: Mutex<State>,
}

/// Whether two configurations sample alike (a session can feed both).
pub fn compatible(a: &ClientConfig, b: &ClientConfig) -> bool {
    a.sampling_interval == b.sampling_interval
        && a.num_heaps == b.num_heaps
        && a.heaps == b.heaps
        && a.context_filters() == b.context_filters()
        && a.cpu_period_ns == b.cpu_period_ns
        && (a.perf_event, a.perf_period) == (b.perf_event, b.perf_period)
}

impl Hub {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a profile.
    pub fn add_profile(&self, id: ProfileId, wanted: Wanted) {
        self.state().profiles.insert(id, wanted);
    }

    /// The names every startup profile wants, and whether one wants every
    /// process: the trigger store's content.
    pub fn startup_triggers(&self) -> (u32, BTreeMap<String, u32>) {
        let st = self.state();
        let mut all = 0;
        let mut names = BTreeMap::new();
        for w in st.profiles.values().filter(|w| w.targets.startup) {
            all += u32::from(w.targets.all);
            for n in &w.targets.names {
                *names.entry(n.clone()).or_insert(0) += 1;
            }
        }
        (all, names)
    }

    /// Marks `pid` as woken for profile `id` (its connection is expected).
    pub fn expect(&self, id: ProfileId, pid: u32) {
        if let Some(w) = self.state().profiles.get_mut(&id) {
            w.pending.insert(pid);
        }
    }

    /// Whether some profile takes the processes of a command (their
    /// environment must then be read at admission).
    pub fn wants_commands(&self) -> bool {
        self.state()
            .profiles
            .values()
            .any(|w| w.targets.command.is_some())
    }

    /// Decides whether the connecting process `pid` (named `name`,
    /// connecting from its start or not, carrying a command's `token` in
    /// its environment or not) is wanted; if so, records session
    /// `session`'s route and returns the configuration to send.
    pub fn admit(
        &self,
        session: SessionId,
        pid: u32,
        uid: u32,
        name: &str,
        from_startup: bool,
        token: Option<&str>,
    ) -> Option<Admission> {
        let mut st = self.state();
        let mut wanting = Vec::new();
        for (&id, w) in st.profiles.iter_mut() {
            if !access::may_profile(w.requester, uid) {
                continue;
            }
            let woken = w.pending.remove(&pid);
            let t = &w.targets;
            let at_start =
                from_startup && t.startup && (t.all || t.names.iter().any(|n| n == name));
            let of_command = token.is_some() && t.command.as_deref() == token;
            if woken || at_start || of_command {
                wanting.push(id);
            }
        }
        let first = *wanting.first()?;
        let client = st.profiles.get(&first)?.client;
        let (mut profiles, mut rejected) = (Vec::new(), Vec::new());
        for id in wanting {
            match st.profiles.get(&id) {
                Some(w) if compatible(&w.client, &client) => profiles.push(id),
                Some(_) => rejected.push(id),
                None => {}
            }
        }
        st.sessions.insert(
            session,
            Route {
                pid,
                uid,
                admitted: profiles.clone(),
                profiles,
                client,
                rejected: rejected.clone(),
                at_worker: false,
            },
        );
        Some(Admission { client, rejected })
    }

    /// Profile `id` wants running process `pid`: shares its session if it
    /// has one and samples alike.
    pub fn join(&self, id: ProfileId, pid: u32) -> Joined {
        let mut st = self.state();
        let Some((mine, requester)) = st.profiles.get(&id).map(|w| (w.client, w.requester)) else {
            return Joined::NoSession;
        };
        let Some(route) = st.sessions.values_mut().find(|r| {
            r.pid == pid && !r.profiles.is_empty() && access::may_profile(requester, r.uid)
        }) else {
            return Joined::NoSession;
        };
        if !compatible(&route.client, &mine) {
            return Joined::Rejected;
        }
        if !route.profiles.contains(&id) {
            route.profiles.push(id);
        }
        Joined::Shared
    }

    /// The profiles session `session` feeds now (none: stop it).
    pub fn route(&self, session: SessionId) -> Option<Route> {
        self.state().sessions.get(&session).cloned()
    }

    /// The sessions admitted for profile `id` (whatever they feed now).
    pub fn admitted_for(&self, id: ProfileId) -> Vec<SessionId> {
        self.state()
            .sessions
            .iter()
            .filter(|(_, r)| r.admitted.contains(&id))
            .map(|(&s, _)| s)
            .collect()
    }

    /// Whether process `pid` has a session that feeds some profile.
    pub fn has_session(&self, pid: u32) -> bool {
        self.state()
            .sessions
            .values()
            .any(|r| r.pid == pid && !r.profiles.is_empty())
    }

    /// Session `session` reached its worker; whether some profile still
    /// wants it.
    pub fn reached_worker(&self, session: SessionId) -> bool {
        match self.state().sessions.get_mut(&session) {
            Some(r) => {
                r.at_worker = true;
                !r.profiles.is_empty()
            }
            None => false,
        }
    }

    /// Whether session `session` is known to its worker (or gone: nothing
    /// to wait for).
    pub fn at_worker(&self, session: SessionId) -> bool {
        self.state()
            .sessions
            .get(&session)
            .is_none_or(|r| r.at_worker)
    }

    /// A session ended: forgets it.
    pub fn session_ended(&self, session: SessionId) {
        self.state().sessions.remove(&session);
    }

    /// Profile `id` leaves session `session` (a guardrail); whether no
    /// profile wants the session any more (stop it).
    pub fn leave(&self, session: SessionId, id: ProfileId) -> bool {
        let mut st = self.state();
        match st.sessions.get_mut(&session) {
            Some(r) => {
                let before = r.profiles.len();
                r.profiles.retain(|&p| p != id);
                before > 0 && r.profiles.is_empty()
            }
            None => false,
        }
    }

    /// The sessions (and their pids) that feed profile `id` and another
    /// profile too.
    pub fn shared_by(&self, id: ProfileId) -> Vec<(SessionId, u32)> {
        self.state()
            .sessions
            .iter()
            .filter(|(_, r)| r.profiles.contains(&id) && r.profiles.len() > 1)
            .map(|(&s, r)| (s, r.pid))
            .collect()
    }

    /// Profile `id` ends: removed from every route; the sessions (and
    /// their pids) no other profile wants, to stop.
    pub fn end_profile(&self, id: ProfileId) -> Vec<(SessionId, u32)> {
        let mut st = self.state();
        st.profiles.remove(&id);
        let mut stop = Vec::new();
        for (&s, r) in st.sessions.iter_mut() {
            let before = r.profiles.len();
            r.profiles.retain(|&p| p != id);
            if before > 0 && r.profiles.is_empty() {
                stop.push((s, r.pid));
            }
        }
        stop
    }

    /// The profiles that want a process named `name` from its start (for a
    /// notice that it runs unprofiled).
    pub fn wanting_name(&self, name: &str) -> Vec<ProfileId> {
        let st = self.state();
        st.profiles
            .iter()
            .filter(|(_, w)| w.targets.all || w.targets.names.iter().any(|n| n == name))
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether some profile wants processes by name (or every one) from
    /// their start.
    pub fn wants_startup(&self) -> bool {
        self.state()
            .profiles
            .values()
            .any(|w| w.targets.startup && (w.targets.all || !w.targets.names.is_empty()))
    }

    /// The profiles that want a process named `name` of user `uid`, which
    /// started at `start_ticks` (since boot), from its start (and may see
    /// it).
    pub fn wanting_at_start(&self, name: &str, uid: u32, start_ticks: u64) -> Vec<ProfileId> {
        self.state()
            .profiles
            .iter()
            .filter(|(_, w)| {
                let t = &w.targets;
                // The start time is cut to a tick: one tick of doubt.
                start_ticks + 1 >= w.since_ticks
                    && t.startup
                    && (t.all || t.names.iter().any(|n| n == name))
                    && access::may_profile(w.requester, uid)
            })
            .map(|(&id, _)| id)
            .collect()
    }

    /// Runs `f` if no profile runs and no session is open, holding the
    /// table meanwhile (no process is admitted while `f` runs); whether it
    /// ran.
    pub fn while_idle(&self, f: impl FnOnce()) -> bool {
        let st = self.state();
        if !st.profiles.is_empty() || !st.sessions.is_empty() {
            return false;
        }
        f();
        true
    }

    /// Every profile's id.
    pub fn profile_ids(&self) -> Vec<ProfileId> {
        self.state().profiles.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(names: &[&str], interval: u64) -> Wanted {
        Wanted {
            targets: Targets {
                names: names.iter().map(|s| s.to_string()).collect(),
                startup: true,
                running: true,
                ..Targets::default()
            },
            client: ClientConfig::new(interval, 1 << 20),
            pending: BTreeSet::new(),
            requester: 0,
            since_ticks: 0,
        }
    }

    #[test]
    fn a_users_profile_takes_only_that_users_processes() {
        let hub = Hub::default();
        hub.add_profile(
            1,
            Wanted {
                requester: 1000,
                ..wanted(&["a"], 1)
            },
        );
        hub.add_profile(2, wanted(&["b"], 1));
        // User 1000's profile: not root's process, not user 1001's.
        assert!(hub.admit(10, 100, 0, "a", true, None).is_none());
        assert!(hub.admit(11, 101, 1001, "a", true, None).is_none());
        let own = hub.admit(12, 102, 1000, "a", true, None).expect("own");
        assert!(own.rejected.is_empty());
        assert_eq!(hub.route(12).expect("route").profiles, vec![1]);
        // Root's profile takes anyone's; user 1000's cannot join it.
        hub.add_profile(3, wanted(&["b"], 1));
        assert!(hub.admit(13, 103, 1001, "b", true, None).is_some());
        assert_eq!(hub.route(13).expect("route").profiles, vec![2, 3]);
        hub.add_profile(
            4,
            Wanted {
                requester: 1000,
                ..wanted(&["b"], 1)
            },
        );
        assert_eq!(
            hub.join(4, 103),
            Joined::NoSession,
            "another user's session"
        );
        assert_eq!(hub.join(4, 102), Joined::Shared, "the same user's session");
    }

    #[test]
    fn cpu_sampling_is_part_of_sampling_alike() {
        let a = ClientConfig::new(4096, 1 << 20);
        let mut b = a;
        assert!(compatible(&a, &b));
        b.cpu_period_ns = 10_000_000;
        assert!(
            !compatible(&a, &b),
            "a CPU profile cannot feed a heap-only one"
        );
        let mut c = a;
        c.perf_event = heapprofd_proto::wire::PerfEvent::PageFaults as u32;
        c.perf_period = 100;
        assert!(!compatible(&a, &c));
    }

    #[test]
    fn shared_rejected_and_ended() {
        let hub = Hub::default();
        hub.add_profile(1, wanted(&["a", "b"], 1));
        hub.add_profile(2, wanted(&["b"], 1));
        hub.add_profile(3, wanted(&["b"], 4096));
        // Not wanted at all; wanted by one; by three (one rejected).
        assert!(hub.admit(10, 100, 0, "c", true, None).is_none());
        assert!(
            hub.admit(10, 100, 0, "a", false, None).is_none(),
            "not woken"
        );
        let a = hub.admit(11, 101, 0, "a", true, None).expect("a");
        assert!(a.rejected.is_empty());
        let b = hub.admit(12, 102, 0, "b", true, None).expect("b");
        assert_eq!(b.rejected, vec![3]);
        assert_eq!(hub.route(12).expect("route").profiles, vec![1, 2]);
        // A woken process is wanted by the profile that woke it only.
        hub.expect(3, 103);
        let w = hub.admit(13, 103, 0, "zzz", false, None).expect("woken");
        assert_eq!(w.client.sampling_interval, 4096);
        assert_eq!(hub.route(13).expect("route").profiles, vec![3]);
        // Joining: alike shares, different is rejected.
        hub.add_profile(4, wanted(&[], 4096));
        assert_eq!(hub.join(4, 103), Joined::Shared);
        assert_eq!(hub.join(4, 101), Joined::Rejected);
        assert_eq!(hub.join(4, 999), Joined::NoSession);
        // Profile 1 ends: 101 is its alone (stop), 102 goes on for 2; both
        // stay admitted for 1 (their start still goes to it).
        assert_eq!(hub.end_profile(1), vec![(11, 101)]);
        assert_eq!(hub.route(12).expect("route").profiles, vec![2]);
        let mut admitted = hub.admitted_for(1);
        admitted.sort_unstable();
        assert_eq!(admitted, vec![11, 12]);
        let mut stop = hub.end_profile(3);
        stop.extend(hub.end_profile(4));
        assert_eq!(stop, vec![(13, 103)]);
        let (all, names) = hub.startup_triggers();
        assert_eq!((all, names.get("b").copied()), (0, Some(1)));
    }

    #[test]
    fn a_session_is_at_its_worker_only_once_handed_over() {
        let hub = Hub::default();
        hub.add_profile(1, wanted(&["a"], 1));
        hub.add_profile(2, wanted(&["a"], 1));
        hub.admit(10, 100, 0, "a", true, None).expect("admitted");
        // Admitted, not handed over: an ending profile must wait to drain it.
        assert!(!hub.at_worker(10));
        assert_eq!(hub.shared_by(1), vec![(10, 100)]);
        assert!(hub.reached_worker(10), "still wanted");
        assert!(hub.at_worker(10));
        // Every profile ended before the hand-over: not wanted (stop it).
        hub.admit(11, 101, 0, "a", true, None).expect("admitted");
        assert!(hub.end_profile(1).is_empty());
        let mut stop = hub.end_profile(2);
        stop.sort_unstable();
        assert_eq!(stop, vec![(10, 100), (11, 101)]);
        assert!(!hub.reached_worker(11));
        // A session gone from the table has nothing to wait for.
        hub.session_ended(10);
        assert!(hub.at_worker(10));
        assert!(!hub.reached_worker(10));
    }

    #[test]
    fn a_commands_profile_takes_the_processes_with_its_token() {
        let hub = Hub::default();
        assert!(!hub.wants_commands());
        let token = "0123456789abcdef0123456789abcdef";
        hub.add_profile(
            1,
            Wanted {
                targets: Targets {
                    command: Some(token.into()),
                    startup: true,
                    ..Targets::default()
                },
                requester: 1000,
                ..wanted(&[], 1)
            },
        );
        assert!(hub.wants_commands());
        assert!(
            hub.admit(10, 100, 1000, "x", true, None).is_none(),
            "no token"
        );
        let other = "fedcba9876543210fedcba9876543210";
        assert!(hub.admit(11, 101, 1000, "x", true, Some(other)).is_none());
        assert!(
            hub.admit(12, 102, 1001, "x", true, Some(token)).is_none(),
            "another user's process"
        );
        assert!(hub.admit(13, 103, 1000, "x", true, Some(token)).is_some());
        assert!(hub.admit(14, 104, 1000, "y", false, Some(token)).is_some());
        assert_eq!(hub.route(13).expect("route").profiles, vec![1]);
        let mut stop = hub.end_profile(1);
        stop.sort_unstable();
        assert_eq!(stop, vec![(13, 103), (14, 104)]);
        assert!(!hub.wants_commands());
    }
}
