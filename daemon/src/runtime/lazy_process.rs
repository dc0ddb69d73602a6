//! A session's process context, made when a record first needs it.
//!
//! The handshake reads the process's maps and opens the files of its
//! executable mappings while the client waits (see `handshake`); loading
//! the modules from those files (their unwind tables, and the symbols the
//! warm-up thread then looks at) is left to the first record that needs
//! them: a stack to walk, the maps to re-read. A process that exits before
//! its first sample, as most of the helpers a build or a shell script
//! starts do at a sparse interval, never pays for it: for `record -i 512k
//! -- /bin/true` that was 0.7-1.2 ms of the daemon's time, all of it after
//! the program had exited.

use std::time::Instant;

use heapprofd_unwinder::{PendingProcess, ProcessContext};

/// A process context, loaded or not yet.
#[derive(Debug)]
pub struct LazyProcess {
    pending: Option<PendingProcess>,
    ready: Option<ProcessContext>,
}

impl LazyProcess {
    /// A context loaded already.
    pub fn ready(process: ProcessContext) -> Self {
        LazyProcess {
            pending: None,
            ready: Some(process),
        }
    }

    /// A context to load from `pending` at the first [`LazyProcess::get`].
    pub fn pending(pending: PendingProcess) -> Self {
        LazyProcess {
            pending: Some(pending),
            ready: None,
        }
    }

    /// The context, loaded now if it was not.
    pub fn get(&mut self) -> &mut ProcessContext {
        if let Some(p) = self.pending.take() {
            let t0 = Instant::now();
            let pid = p.pid();
            self.ready = Some(p.finish());
            log::debug!(
                "session of pid {pid}: modules loaded in {:.2} ms",
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
        self.ready
            .as_mut()
            .expect("a LazyProcess is always pending or ready")
    }

    /// The context if it was loaded.
    pub fn loaded(&self) -> Option<&ProcessContext> {
        self.ready.as_ref()
    }
}
