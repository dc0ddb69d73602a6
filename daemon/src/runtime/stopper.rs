//! Which worker owns a process's sessions ([`worker_of`]: always the same
//! one, by pid, so what is sent about a pid stays in order), and
//! [`Stopper`], the handle that stops or drains single sessions from
//! another thread or task.

use std::sync::mpsc;

use heapprofd_model::messages::SessionId;

use super::worker::WorkerMsg;

/// Stops single sessions of a [`super::server::Daemon`].
#[derive(Debug, Clone)]
pub struct Stopper(pub(super) Vec<mpsc::Sender<WorkerMsg>>);

impl Stopper {
    /// Stops session `id` of process `pid` (its client stops writing, the
    /// rest is drained, then it ends).
    pub fn stop_session(&self, id: SessionId, pid: u32) {
        let _ = worker_of(&self.0, pid).send(WorkerMsg::Stop(id));
    }

    /// Has session `id` of process `pid` drained now; the receiver gets a
    /// message once its operations are on their way to the bookkeeping
    /// thread (see [`WorkerMsg::Drain`]).
    pub fn drain_session(&self, id: SessionId, pid: u32) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel();
        let _ = worker_of(&self.0, pid).send(WorkerMsg::Drain(id, tx));
        rx
    }
}

/// The worker of process `pid`'s sessions: always the same one, so what is
/// sent to it about a pid stays in order.
pub(super) fn worker_of(workers: &[mpsc::Sender<WorkerMsg>], pid: u32) -> &mpsc::Sender<WorkerMsg> {
    &workers[pid as usize % workers.len()]
}
