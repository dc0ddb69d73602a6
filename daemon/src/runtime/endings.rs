//! A worker's sessions whose client went away on its own while its process
//! may still run: whether the session ended with its process (an exit) or
//! without it (`disconnected`: a teardown after an error) is known only
//! once the process is reaped, which comes a moment after its socket
//! closed.
//!
//! The worker once waited for that in the session's end, up to
//! [`EXIT_WAIT`], blocking every other session it owns. A process that
//! calls exec lives on, so each exec cost the full wait, and its new
//! image's session (the same pid, so the same worker) was not drained
//! meanwhile: its client blocked on a full ring (`record -- env PROGRAM`
//! ran a 0.09 s program in 0.28 s, 0.18 s of it blocked). Now the end
//! waits here and the worker goes on; the bookkeeping holds the new
//! session's events back until the old one's end arrives (its exec
//! hold-back). An end is told when the process is seen gone, when a newer
//! session of the same pid is with the worker (an exec: its image lives
//! on, not disconnected), or when [`EXIT_WAIT`] passed (disconnected);
//! [`Endings::finish_all`] tells the rest when the worker stops.

use std::os::fd::OwnedFd;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use heapprofd_model::messages::{SessionEnd, SessionEvent, SessionId, SessionStats};

use super::BookMsg;
use super::handshake::has_exited;

/// Longest a session's end waits for its process to be reaped.
pub const EXIT_WAIT: Duration = Duration::from_millis(200);
/// How often a waiting end looks at its process again.
const LOOK_EVERY: Duration = Duration::from_millis(5);

/// One session's end, waiting to know whether its process exited.
#[derive(Debug)]
pub struct Ending {
    pub id: SessionId,
    pub pid: u32,
    pub stats: SessionStats,
    pub pidfd: OwnedFd,
    /// When it is told as disconnected if the process still runs.
    pub deadline: Instant,
}

/// The ends a worker waits to tell.
#[derive(Debug, Default)]
pub struct Endings {
    waiting: Vec<Ending>,
}

impl Endings {
    /// Waits with `e`'s end.
    pub fn add(&mut self, e: Ending) {
        self.waiting.push(e);
    }

    /// Whether no end waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// When to look again: the next deadline, or sooner to see an exit.
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        let first = self.waiting.iter().map(|e| e.deadline).min()?;
        Some(first.min(now + LOOK_EVERY))
    }

    /// Tells the ends that are known at `now`; `newer(pid)` says whether a
    /// newer session of `pid` is with the worker (the process called exec).
    pub fn settle(&mut self, now: Instant, newer: impl Fn(u32) -> bool, book: &Sender<BookMsg>) {
        self.waiting.retain(|e| {
            let gone = has_exited(&e.pidfd, Duration::ZERO);
            let exec = !gone && newer(e.pid);
            let known = gone || exec || now >= e.deadline;
            if known {
                tell(e, !gone && !exec, book);
            }
            !known
        });
    }

    /// Tells every end (the worker stops), each after waiting out what is
    /// left of its deadline for its process.
    pub fn finish_all(&mut self, book: &Sender<BookMsg>) {
        for e in self.waiting.drain(..) {
            let left = e.deadline.saturating_duration_since(Instant::now());
            let gone = has_exited(&e.pidfd, left);
            tell(&e, !gone, book);
        }
    }
}

/// Sends the end of `e`'s session.
fn tell(e: &Ending, disconnected: bool, book: &Sender<BookMsg>) {
    send_end(e.id, e.pid, e.stats.clone(), disconnected, false, book);
}

/// Sends a session's end to the bookkeeping.
pub fn send_end(
    id: SessionId,
    pid: u32,
    stats: SessionStats,
    disconnected: bool,
    stopped_by_daemon: bool,
    book: &Sender<BookMsg>,
) {
    let _ = book.send(BookMsg::Session(Box::new(SessionEvent::Ended {
        id,
        pid,
        stats,
        end: SessionEnd {
            disconnected,
            stopped_by_daemon,
        },
    })));
}

#[cfg(test)]
mod tests {
    use std::os::fd::FromRawFd;
    use std::sync::mpsc;

    use super::*;

    fn pidfd_of(pid: u32) -> OwnedFd {
        // SAFETY: pidfd_open takes a pid and flags; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        assert!(fd >= 0, "pidfd_open");
        // SAFETY: a descriptor just opened, owned by nobody else.
        unsafe { OwnedFd::from_raw_fd(fd as i32) }
    }

    fn ending(id: SessionId, pid: u32, wait: Duration) -> Ending {
        Ending {
            id,
            pid,
            stats: SessionStats::default(),
            pidfd: pidfd_of(pid),
            deadline: Instant::now() + wait,
        }
    }

    fn ends(rx: &mpsc::Receiver<BookMsg>) -> Vec<(SessionId, bool)> {
        rx.try_iter()
            .filter_map(|m| match m {
                BookMsg::Session(e) => match *e {
                    SessionEvent::Ended { id, end, .. } => Some((id, end.disconnected)),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// A live process: its end waits (the worker does not), is told at
    /// once when a newer session of its pid shows up (exec: not
    /// disconnected), and after the deadline otherwise (disconnected).
    #[test]
    fn an_end_waits_without_blocking_and_is_told_when_known() {
        let (tx, rx) = mpsc::channel();
        let me = std::process::id();
        let mut endings = Endings::default();
        endings.add(ending(1, me, Duration::from_secs(60)));
        endings.add(ending(2, me, Duration::from_secs(60)));
        let t0 = Instant::now();
        endings.settle(Instant::now(), |_| false, &tx);
        assert!(ends(&rx).is_empty(), "nothing known yet");
        let due = endings.next_due(t0).expect("due");
        assert!(due <= t0 + LOOK_EVERY);
        endings.settle(Instant::now(), |pid| pid == me, &tx);
        assert_eq!(ends(&rx), vec![(1, false), (2, false)], "exec");
        assert!(endings.is_empty());

        endings.add(ending(3, me, Duration::ZERO));
        endings.settle(Instant::now(), |_| false, &tx);
        assert_eq!(ends(&rx), vec![(3, true)], "deadline passed");
    }

    /// A process that exited: not disconnected, told at the next look or
    /// when the worker stops.
    #[test]
    fn an_exited_process_ends_its_session_without_the_flag() {
        let (tx, rx) = mpsc::channel();
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        let mut endings = Endings::default();
        endings.add(ending(7, pid, Duration::from_secs(60)));
        child.wait().expect("wait");
        let mut again = ending(8, std::process::id(), Duration::from_secs(60));
        again.deadline = Instant::now() + Duration::from_millis(1);
        endings.add(again);
        endings.settle(Instant::now(), |_| false, &tx);
        assert_eq!(ends(&rx), vec![(7, false)]);
        endings.finish_all(&tx);
        assert_eq!(ends(&rx), vec![(8, true)], "the rest at the worker's stop");
    }
}
