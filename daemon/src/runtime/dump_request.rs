//! A dump asked for now (SIGUSR1, `--continuous-dump`) covers every record
//! the clients wrote before it was asked.
//!
//! The bookkeeping thread only knows what the workers sent it, and a
//! session's start reaches it when its worker takes the session, after
//! the client was answered. Sent straight to the bookkeeping thread, a
//! dump could come before a process it should show was known at all
//! (the dump then has no heap for it), or before a worker read records
//! that were already in a ring. So a request first waits (bounded) for handshakes in flight to hand their
//! sessions over, has every worker drain what its rings hold, and only
//! then asks the bookkeeping thread for the dump (one thread,
//! [`DumpRequests`], takes the requests in order). Both waits are bounded,
//! so a hot client or a stream of new connections delays a dump by at
//! most [`HANDOVER_WAIT`] + [`DRAIN_WAIT`], never stops it.

use std::sync::mpsc::{self, Sender};
use std::time::{Duration, Instant};

use super::book_msg::BookMsg;
use super::worker::WorkerMsg;

/// Longest wait for handshakes in flight to hand their sessions over.
pub const HANDOVER_WAIT: Duration = Duration::from_millis(500);
/// Longest wait for the workers to drain their rings.
pub const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// The thread that turns dump requests into dumps, one at a time and in
/// the order asked (a `--continuous-dump` tick is never overtaken by the
/// next one). It ends when this is dropped.
#[derive(Debug)]
pub struct DumpRequests {
    tx: Option<Sender<u64>>,
    book: Sender<BookMsg>,
}

impl DumpRequests {
    /// Starts the thread. `handshakes` counts connections whose session has
    /// not reached a worker yet.
    pub fn start(
        handshakes: impl Fn() -> usize + Send + 'static,
        workers: Vec<Sender<WorkerMsg>>,
        book: Sender<BookMsg>,
    ) -> Self {
        let (tx, rx) = mpsc::channel::<u64>();
        let to_book = book.clone();
        let spawned = std::thread::Builder::new()
            .name("dump-request".into())
            .spawn(move || {
                while let Ok(asked_ns) = rx.recv() {
                    settle(&handshakes, &workers);
                    let _ = to_book.send(BookMsg::Dump(asked_ns));
                }
            });
        Self {
            tx: spawned.is_ok().then_some(tx),
            book,
        }
    }

    /// Asks for a dump stamped `asked_ns` once the sessions known or in
    /// flight now have had their records read; returns at once.
    pub fn ask(&self, asked_ns: u64) {
        let queued = self.tx.as_ref().is_some_and(|t| t.send(asked_ns).is_ok());
        if !queued {
            // No thread to wait on: a dump now beats no dump.
            let _ = self.book.send(BookMsg::Dump(asked_ns));
        }
    }
}

/// Waits for the handshakes in flight, then for every worker to drain its
/// rings (each answers once what it read is on its way to the bookkeeping
/// thread). A worker that is gone counts as drained.
fn settle(handshakes: &impl Fn() -> usize, workers: &[Sender<WorkerMsg>]) {
    let deadline = Instant::now() + HANDOVER_WAIT;
    while handshakes() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (tx, rx) = mpsc::channel();
    let asked = workers
        .iter()
        .filter(|w| w.send(WorkerMsg::DrainAll(tx.clone())).is_ok())
        .count();
    drop(tx);
    let deadline = Instant::now() + DRAIN_WAIT;
    for _ in 0..asked {
        let left = deadline.saturating_duration_since(Instant::now());
        if rx.recv_timeout(left).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_dump_follows_the_handover_and_every_workers_drain() {
        let pending = Arc::new(AtomicUsize::new(1));
        let (w1, r1) = mpsc::channel();
        let (w2, r2) = mpsc::channel();
        let (book, book_rx) = mpsc::channel();
        let p = Arc::clone(&pending);
        let requests = DumpRequests::start(move || p.load(Ordering::Acquire), vec![w1, w2], book);
        requests.ask(7);
        // A handshake in flight holds the drains back.
        std::thread::sleep(Duration::from_millis(30));
        assert!(r1.try_recv().is_err(), "drained before the handover");
        pending.store(0, Ordering::Release);
        let WorkerMsg::DrainAll(done1) = r1.recv().unwrap() else {
            panic!("not a drain")
        };
        let WorkerMsg::DrainAll(done2) = r2.recv().unwrap() else {
            panic!("not a drain")
        };
        // Nothing reaches the bookkeeping until both workers answered.
        done1.send(()).unwrap();
        assert!(book_rx.recv_timeout(Duration::from_millis(30)).is_err());
        done2.send(()).unwrap();
        let msg = book_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(msg, BookMsg::Dump(7)));
    }

    #[test]
    fn gone_workers_and_stuck_handshakes_do_not_stop_the_dump() {
        let (w1, r1) = mpsc::channel::<WorkerMsg>();
        drop(r1);
        let (book, book_rx) = mpsc::channel();
        let requests = DumpRequests::start(|| 1, vec![w1], book);
        requests.ask(9);
        let msg = book_rx
            .recv_timeout(HANDOVER_WAIT + Duration::from_secs(5))
            .unwrap();
        assert!(matches!(msg, BookMsg::Dump(9)));
    }
}
