//! A ring buffer made ready before a client asks for one.
//!
//! `record` knows the size of the ring its first client will get, and it
//! has time on its hands while that client's program starts (fork, exec,
//! the dynamic loader): so it creates the ring then, with every page
//! allocated, on the blocking pool (which also has a thread ready for the
//! handshake when it comes). The handshake takes it instead of creating
//! one ([`SpareRing::take_or_create`]). The first client's is made ahead;
//! making another after each handshake cost a run of `/bin/true` 0.5 ms
//! at its end (the runtime's shutdown waits for it, and it is freed
//! unused), so the next is made only from the second handshake on: a
//! program that started a second process (a shell, make, a test runner)
//! is likely to start more, and each of those gets a ring made while the
//! one before ran, instead of waiting for its own (`memfd_create` and the
//! `fallocate` of 1 MiB, 0.25 ms) before its handshake's reply.
//!
//! A spare ring has never been handed to anyone: no byte of one process's
//! samples can reach another.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use heapprofd_shmem::{RingBuffer, SetupError};

/// At most one prepared ring, of one size.
#[derive(Debug, Default)]
pub struct SpareRing {
    ready: Mutex<Option<(u64, RingBuffer, OwnedFd)>>,
}

impl SpareRing {
    /// Prepares a ring of `data_size` bytes if none is ready. Blocking (the
    /// pages are allocated): call it from the blocking pool. A handshake
    /// that comes meanwhile waits for it, which is shorter than creating
    /// one of its own. Best effort: a ring that cannot be made is left to
    /// the handshake, which reports the error.
    pub fn prepare(&self, data_size: u64) {
        let mut ready = lock(&self.ready);
        if ready.is_some() {
            return;
        }
        if let Ok((ring, fd)) = RingBuffer::create_allocated(data_size) {
            *ready = Some((data_size, ring, fd));
        }
    }

    /// [`Self::prepare`] on the blocking pool of the current runtime.
    pub fn prepare_on_pool(self: &Arc<Self>, data_size: u64) {
        let spare = Arc::clone(self);
        tokio::task::spawn_blocking(move || spare.prepare(data_size));
    }

    /// The prepared ring if it has `data_size` bytes, else a new one.
    pub fn take_or_create(&self, data_size: u64) -> Result<(RingBuffer, OwnedFd), SetupError> {
        let mut ready = lock(&self.ready);
        match ready.take() {
            Some((size, ring, fd)) if size == data_size => Ok((ring, fd)),
            other => {
                *ready = other;
                drop(ready);
                RingBuffer::create(data_size)
            }
        }
    }

    /// Whether a ring is ready (tests).
    #[cfg(test)]
    fn is_ready(&self) -> bool {
        lock(&self.ready).is_some()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prepared_ring_is_taken_once_and_only_at_its_size() {
        let spare = SpareRing::default();
        spare.prepare(1 << 16);
        assert!(spare.is_ready());
        // Another size: a new ring, and the spare stays.
        let (other, _fd) = spare.take_or_create(1 << 17).unwrap();
        assert_eq!(other.size(), 1 << 17);
        assert!(spare.is_ready());
        let (ring, _fd) = spare.take_or_create(1 << 16).unwrap();
        assert_eq!(ring.size(), 1 << 16);
        assert!(!spare.is_ready());
        // Nothing ready: created on the spot.
        let (again, _fd) = spare.take_or_create(1 << 16).unwrap();
        assert_eq!(again.size(), 1 << 16);
    }

    #[test]
    fn a_prepared_ring_is_fresh_and_its_pages_are_allocated() {
        use std::os::fd::AsRawFd;
        let spare = SpareRing::default();
        spare.prepare(1 << 16);
        let (ring, fd) = spare.take_or_create(1 << 16).unwrap();
        // Its memfd's blocks are allocated (st_blocks counts 512-byte units).
        // SAFETY: a plain struct of integers; all zeroes is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a descriptor we own and an out-pointer to that struct.
        let rc = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
        assert_eq!(rc, 0);
        assert!(
            st.st_blocks as u64 * 512 >= 1 << 16,
            "{} blocks",
            st.st_blocks
        );
        // Never written: a client attaching to it finds an empty ring.
        let client = RingBuffer::attach(&fd).unwrap();
        assert_eq!(client.size(), ring.size());
        let fresh = RingBuffer::create(1 << 16).unwrap().0;
        assert_eq!(
            format!("{:?}", client.writer_stats()),
            format!("{:?}", fresh.writer_stats())
        );
        assert_eq!(client.client_error(), fresh.client_error());
    }
}
