//! The daemon's side of the maps ask (see the shared memory's `maps_ask`):
//! a client about to exit with objects loaded since its handshake asks for
//! its maps to be read while it still has them; the session's socket task
//! reads them at the wake byte that follows, keeps them for the session's
//! unwinder (the unwinder's `KeptMaps`, read through its `LiveOrKept` once
//! the process is gone) and answers in the ring.
//!
//! The ask is untrusted: a client that asks over and over gets its maps
//! read at most every [`MIN_INTERVAL`], on a blocking thread, one read at a
//! time per session, each bounded by the unwinder's `MAX_MAPS_BYTES`.

use std::sync::Arc;
use std::time::Duration;

use heapprofd_shmem::RingBuffer;
use heapprofd_unwinder::{FdMaps, KeptMaps, MapsSource};
use tokio::time::Instant;

/// Shortest time between two reads for one session.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// One session's answerer of maps asks.
#[derive(Debug)]
pub struct MapsKeeper {
    ring: Arc<RingBuffer>,
    /// A second reader of the client's maps descriptor (`None` while a
    /// read runs, or for good once a read thread failed).
    maps: Option<FdMaps>,
    kept: KeptMaps,
    answered: u32,
    last_read: Option<Instant>,
}

impl MapsKeeper {
    /// Answers the asks of the client of `ring`, reading `maps` into `kept`.
    pub fn new(ring: Arc<RingBuffer>, maps: FdMaps, kept: KeptMaps) -> MapsKeeper {
        let answered = ring.maps_asked();
        MapsKeeper {
            ring,
            maps: Some(maps),
            kept,
            answered,
            last_read: None,
        }
    }

    /// At a wake byte: if the client asked since the last answer, reads
    /// its maps, keeps them and answers.
    pub async fn on_wake(&mut self) {
        let asked = self.ring.maps_asked();
        if asked == self.answered {
            return;
        }
        let Some(maps) = self.maps.take() else {
            return;
        };
        if let Some(t) = self.last_read {
            tokio::time::sleep_until(t + MIN_INTERVAL).await;
        }
        self.last_read = Some(Instant::now());
        let read = tokio::task::spawn_blocking(move || {
            let mut maps = maps;
            let text = maps.read_maps();
            (maps, text)
        })
        .await;
        let Ok((maps, text)) = read else {
            return;
        };
        self.maps = Some(maps);
        match text {
            Ok(text) => {
                log::debug!("maps kept for an exiting client ({} bytes)", text.len());
                self.kept.keep(text)
            }
            Err(e) => log::debug!("reading the maps a client asked for at its exit: {e}"),
        }
        // Answered even if the read failed: the client waits for nothing.
        self.answered = asked;
        self.ring.set_maps_kept(asked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn an_ask_gets_the_maps_kept_and_answered() {
        let (ring, _fd) = RingBuffer::create(1 << 16).unwrap();
        let ring = Arc::new(ring);
        let kept = KeptMaps::default();
        let maps = FdMaps::open_pid(std::process::id()).unwrap();
        let mut keeper = MapsKeeper::new(Arc::clone(&ring), maps, kept.clone());
        // A wake byte without an ask reads nothing.
        keeper.on_wake().await;
        assert!(kept.get().is_none());
        let asked = ring.ask_maps();
        keeper.on_wake().await;
        assert_eq!(ring.maps_kept(), asked);
        assert!(kept.get().is_some_and(|t| t.contains("[stack]")));
        // A second ask right away (after the interval) is answered too.
        let again = ring.ask_maps();
        keeper.on_wake().await;
        assert_eq!(ring.maps_kept(), again);
    }
}
