//! The maps ask: how a client about to exit gets its maps read while its
//! process still has them.
//!
//! The daemon unwinds samples after the fact. A sample taken in an object
//! loaded after the daemon last read the process's maps is resolved by
//! reading them again, which works while the process lives; once it has
//! exited its maps read as empty and such a sample's stack is cut there
//! (`ERROR INVALID_MAP`). Python imports its C extensions with `dlopen`
//! moments before a short script ends, so this was common. So a client
//! that loaded objects since its handshake bumps [`RingBuffer::ask_maps`]
//! before it exits, pokes the daemon, and waits (bounded) until the daemon
//! has read and kept the maps and stored the value it answered in
//! [`RingBuffer::maps_kept`].
//!
//! Both counters live in what was padding of the metadata page's first
//! line: a peer that predates them leaves them at zero and never reads
//! them (the client asks only when the daemon's configuration says it
//! answers).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::ring::RingBuffer;

/// The first sleep between checks of an answer; each next one doubles, up
/// to [`MAX_NAP`].
const FIRST_NAP: Duration = Duration::from_micros(50);
/// The longest sleep between checks.
const MAX_NAP: Duration = Duration::from_millis(2);

impl RingBuffer {
    /// The client wants its maps read now; returns the value to wait for in
    /// [`RingBuffer::maps_kept`].
    pub fn ask_maps(&self) -> u32 {
        self.meta()
            .maps_asked
            .fetch_add(1, Ordering::AcqRel)
            .wrapping_add(1)
    }

    /// The latest ask (untrusted by the daemon; only a change matters).
    pub fn maps_asked(&self) -> u32 {
        self.meta().maps_asked.load(Ordering::Acquire)
    }

    /// The daemon has read and kept the maps for ask `asked`.
    pub fn set_maps_kept(&self, asked: u32) {
        self.meta().maps_kept.store(asked, Ordering::Release);
    }

    /// The last ask the daemon answered.
    pub fn maps_kept(&self) -> u32 {
        self.meta().maps_kept.load(Ordering::Acquire)
    }

    /// Waits until the daemon answered ask `asked` (true), the session
    /// shuts down or `timeout` passes (false). Holds no lock and allocates
    /// nothing.
    pub fn wait_maps_kept(&self, asked: u32, timeout: Duration) -> bool {
        let start = Instant::now();
        let mut nap = FIRST_NAP;
        loop {
            if self.maps_kept() == asked {
                return true;
            }
            if self.is_shutdown() || start.elapsed() >= timeout {
                return false;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(MAX_NAP);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::RingBuffer;

    #[test]
    fn an_ask_is_answered_once_the_daemon_stores_its_value() {
        let (rb, _fd) = RingBuffer::create(1 << 16).unwrap();
        assert_eq!((rb.maps_asked(), rb.maps_kept()), (0, 0));
        let first = rb.ask_maps();
        assert_eq!(rb.maps_asked(), first);
        assert_ne!(rb.maps_kept(), first, "not answered yet");
        rb.set_maps_kept(rb.maps_asked());
        assert_eq!(rb.maps_kept(), first);
        let second = rb.ask_maps();
        assert_ne!(second, first);
        assert_ne!(rb.maps_kept(), second);
        // Unanswered: the wait ends at its timeout, or at once on shutdown.
        assert!(!rb.wait_maps_kept(second, Duration::from_millis(1)));
        rb.set_shutdown();
        assert!(!rb.wait_maps_kept(second, Duration::from_secs(600)));
    }

    #[test]
    fn a_waiter_returns_once_another_thread_answers() {
        let (rb, _fd) = RingBuffer::create(1 << 16).unwrap();
        let asked = rb.ask_maps();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| rb.wait_maps_kept(asked, Duration::from_secs(600)));
            rb.set_maps_kept(rb.maps_asked());
            assert!(waiter.join().unwrap());
        });
    }
}
