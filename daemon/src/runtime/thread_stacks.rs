//! The threads' stack bases: putting back the top of a malloc sample's
//! stack that its record left out.
//!
//! With stack reuse on (`ClientConfig::FLAG_STACK_REUSE`), a client sends
//! only the bottom of a sample's stack, the part that changed since its
//! thread's previous sample; `MallocHeader::stack_reused` says how many
//! top bytes it left out (see the client's `stackreuse` for the rules both
//! sides follow). A session keeps, per thread, the whole stack of its last
//! `FLAG_STACK_BASE` sample, right-aligned in a buffer of its own, so that
//! putting a sample together is one copy of the bytes its record carries,
//! below the reused top that is already in place.
//!
//! Nothing here trusts the client: a sample that reuses more than its
//! thread's base holds, or whose stack ends elsewhere, is
//! [`Missing`]: the thread's base is dropped and the caller asks every
//! writer to send its next stack whole (the ring's stack resync counter).
//! The bases are bounded ([`MAX_THREADS`], [`MAX_BYTES`]): before a base
//! would pass either, the least recently used half of the others is
//! dropped, again with a resync (a single stack larger than the byte
//! bound is kept alone: the record that carried it was as large).

use rustc_hash::FxHashMap;

/// Threads whose bases a session keeps before it drops the older half.
pub const MAX_THREADS: usize = 4096;
/// Bytes of bases a session keeps before it drops the older half.
pub const MAX_BYTES: usize = 64 << 20;

/// A sample's record reuses a base this session does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missing;

/// The buffer a stack of `total` bytes gets: a power of two, at least a page.
fn buffer_len(total: usize) -> usize {
    total.next_power_of_two().max(4096)
}

#[derive(Debug, Default)]
struct Base {
    /// One past the stack's last byte.
    end: u64,
    /// The stack is `buf[buf.len() - len..]`.
    len: usize,
    buf: Vec<u8>,
    /// [`ThreadStacks::clock`] at its last use.
    used: u64,
}

/// A session's stack bases, by thread id.
#[derive(Debug, Default)]
pub struct ThreadStacks {
    bases: FxHashMap<u32, Base>,
    /// Bytes of all bases' buffers.
    bytes: usize,
    clock: u64,
    /// Samples that reused a base this session did not have.
    pub missing: u64,
    /// Times bases were dropped to stay within bounds.
    pub evictions: u64,
}

impl ThreadStacks {
    /// The whole stack of a malloc sample of thread `tid` taken at `sp`
    /// whose record carries `fresh` and left out `reused` top bytes;
    /// with `base`, it becomes the thread's base. Without `base` (a record
    /// that takes no part in reuse), `fresh` is the whole stack.
    ///
    /// The second value says that bases were dropped (or one was found
    /// missing): the caller asks the client for whole stacks.
    ///
    /// The tests' form of [`ThreadStacks::assemble_with`], which the worker
    /// calls with the record's bytes still in the ring.
    #[cfg(test)]
    pub fn assemble<'a>(
        &'a mut self,
        tid: u32,
        sp: u64,
        fresh: &'a [u8],
        reused: usize,
        base: bool,
    ) -> (Result<&'a [u8], Missing>, bool) {
        if !base {
            return (Ok(fresh), false);
        }
        self.assemble_with(tid, sp, fresh.len(), reused, |dst| {
            dst.copy_from_slice(fresh);
            true
        })
    }

    /// The whole stack of a base malloc sample of thread `tid` taken at
    /// `sp`, whose record carries `fresh_len` bytes and left out `reused`
    /// top bytes; it becomes the thread's base. `fill` writes the carried
    /// bytes into the place they take in the thread's buffer (the worker
    /// copies them there straight from the ring). The second value says
    /// that bases were dropped (or one was found missing): the caller asks
    /// the client for whole stacks. A `fill` that returns false (the bytes
    /// could not be had) leaves the thread without a base, as a missing
    /// one: the caller unwinds from what it has.
    pub fn assemble_with(
        &mut self,
        tid: u32,
        sp: u64,
        fresh_len: usize,
        reused: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> (Result<&[u8], Missing>, bool) {
        let total = fresh_len + reused;
        let Some(end) = sp.checked_add(total as u64) else {
            return (Err(Missing), false);
        };
        if reused != 0 {
            let fits = self
                .bases
                .get(&tid)
                .map(|b| b.end == end && b.len >= reused);
            if fits != Some(true) {
                self.missing += 1;
                if let Some(b) = self.bases.remove(&tid) {
                    self.bytes -= b.buf.len();
                }
                return (Err(Missing), true);
            }
        }
        let have = self.bases.get(&tid).map(|b| b.buf.len());
        let grow = match have {
            Some(n) if n >= total => 0,
            _ => buffer_len(total) - have.unwrap_or(0),
        };
        let evicted = self.make_room(tid, have.is_none(), grow);
        self.clock += 1;
        let b = self.bases.entry(tid).or_default();
        if b.buf.len() < total {
            // Grow, keeping the reused top right-aligned.
            let mut grown = vec![0u8; buffer_len(total)];
            let (n, m) = (grown.len(), b.buf.len());
            grown[n - reused..].copy_from_slice(&b.buf[m - reused..]);
            self.bytes += n - m;
            b.buf = grown;
        }
        let n = b.buf.len();
        let filled = fill(&mut b.buf[n - total..n - reused]);
        b.used = self.clock;
        if !filled {
            // No base until the next whole stack: nothing can match it.
            (b.end, b.len) = (0, 0);
            self.missing += 1;
            return (Err(Missing), true);
        }
        b.end = end;
        b.len = total;
        (Ok(&b.buf[n - total..]), evicted)
    }

    /// Before thread `tid` (`new`: without a base yet) takes `grow` more
    /// bytes: drops the least recently used half of the other threads'
    /// bases if the table would pass a bound. True if it dropped any.
    fn make_room(&mut self, tid: u32, new: bool, grow: usize) -> bool {
        if (!new || self.bases.len() < MAX_THREADS) && self.bytes + grow <= MAX_BYTES {
            return false;
        }
        let mut uses: Vec<u64> = self
            .bases
            .iter()
            .filter(|&(&t, _)| t != tid)
            .map(|(_, b)| b.used)
            .collect();
        if uses.is_empty() {
            return false;
        }
        let mid = uses.len() / 2;
        let (_, &mut cut, _) = uses.select_nth_unstable(mid);
        let bytes = &mut self.bytes;
        self.bases.retain(|&t, b| {
            let keep = t == tid || b.used > cut;
            if !keep {
                *bytes -= b.buf.len();
            }
            keep
        });
        self.evictions += 1;
        true
    }

    /// Threads with a base.
    pub fn threads(&self) -> usize {
        self.bases.len()
    }

    /// Bytes the bases hold.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn a_reused_top_is_put_back_below_the_fresh_bytes() {
        let mut t = ThreadStacks::default();
        let whole = stack(3000, 1);
        let sp = 0x7000_0000u64;
        let (r, resync) = t.assemble(7, sp, &whole, 0, true);
        assert_eq!(r.unwrap(), &whole[..]);
        assert!(!resync);
        // Deeper by 200 bytes; the top 2000 bytes are the same.
        let mut deeper = stack(200, 9);
        deeper.extend_from_slice(&stack(1000, 3));
        let sp2 = sp - 200;
        let (r, resync) = t.assemble(7, sp2, &deeper, 2000, true);
        let mut expected = deeper.clone();
        expected.extend_from_slice(&whole[1000..]);
        assert_eq!(r.unwrap(), &expected[..]);
        assert!(!resync);
        // Shallower, reusing all of it.
        let (r, _) = t.assemble(7, sp + 1000, &[], 2000, true);
        assert_eq!(r.unwrap(), &whole[1000..]);
        // A record outside reuse leaves the base alone.
        let other = stack(100, 5);
        assert_eq!(t.assemble(7, sp, &other, 0, false).0.unwrap(), &other[..]);
        assert_eq!(
            t.assemble(7, sp + 1000, &[], 2000, true).0.unwrap(),
            &whole[1000..]
        );
    }

    #[test]
    fn a_fill_that_fails_leaves_no_base_to_reuse() {
        let mut t = ThreadStacks::default();
        let sp = 0x7000_0000u64;
        let whole = stack(512, 1);
        let (r, _) = t.assemble_with(2, sp, 512, 0, |dst| {
            dst.copy_from_slice(&whole);
            true
        });
        assert_eq!(r.unwrap(), &whole[..]);
        // The next record's bytes cannot be had: missing, and a resync.
        let (r, resync) = t.assemble_with(2, sp + 256, 0, 256, |_| false);
        assert_eq!((r, resync), (Err(Missing), true));
        // Nothing of the old base is reused after that.
        assert_eq!(
            t.assemble(2, sp + 256, &[], 256, true),
            (Err(Missing), true)
        );
        assert_eq!(t.missing, 2);
        // A whole stack starts a base again.
        let again = stack(512, 7);
        t.assemble(2, sp, &again, 0, true).0.unwrap();
        assert_eq!(
            t.assemble(2, sp + 256, &[], 256, true).0.unwrap(),
            &again[256..]
        );
    }

    #[test]
    fn a_base_grows_keeping_its_top() {
        let mut t = ThreadStacks::default();
        let top = stack(4096, 2);
        let end = 0x10_0000u64;
        t.assemble(1, end - 4096, &top, 0, true).0.unwrap();
        let fresh = stack(20_000, 4);
        let (r, _) = t.assemble(1, end - 24_096, &fresh, 4096, true);
        let mut expected = fresh.clone();
        expected.extend_from_slice(&top);
        assert_eq!(r.unwrap(), &expected[..]);
        assert_eq!(t.bytes(), 32 * 1024);
    }

    #[test]
    fn reuse_without_a_matching_base_is_missing_and_asks_for_a_resync() {
        let mut t = ThreadStacks::default();
        // No base at all.
        assert_eq!(
            t.assemble(3, 0x1000, &[1; 8], 64, true),
            (Err(Missing), true)
        );
        t.assemble(3, 0x1000, &[1; 256], 0, true).0.unwrap();
        // More than the base holds.
        assert_eq!(
            t.assemble(3, 0x1000, &[1; 8], 512, true),
            (Err(Missing), true)
        );
        // The base was dropped: the same thread's next reuse is missing too.
        assert_eq!(
            t.assemble(3, 0x1100 - 64, &[], 64, true),
            (Err(Missing), true)
        );
        // Another end.
        t.assemble(3, 0x1000, &[1; 256], 0, true).0.unwrap();
        assert_eq!(t.assemble(3, 0x1008, &[], 64, true), (Err(Missing), true));
        // An end past the address space.
        assert_eq!(
            t.assemble(3, u64::MAX - 4, &[0; 8], 8, true).0,
            Err(Missing)
        );
        assert_eq!(t.missing, 4);
    }

    #[test]
    fn the_table_stays_bounded_dropping_the_least_recently_used() {
        let mut t = ThreadStacks::default();
        let s = stack(64, 0);
        for tid in 0..MAX_THREADS as u32 {
            assert!(!t.assemble(tid, 0x1000, &s, 0, true).1);
        }
        // Thread 0 is used again: the newest.
        t.assemble(0, 0x1000, &[], 64, true).0.unwrap();
        let (r, resync) = t.assemble(u32::MAX, 0x1000, &s, 0, true);
        assert!(r.is_ok() && resync);
        assert!(t.threads() <= MAX_THREADS / 2 + 1, "{} bases", t.threads());
        assert!(
            t.assemble(0, 0x1000, &[], 64, true).0.is_ok(),
            "recent base kept"
        );
        assert_eq!(
            t.assemble(1, 0x1000, &[], 64, true).0,
            Err(Missing),
            "old one dropped"
        );
        assert_eq!(t.bytes(), t.threads() * 4096);
    }

    #[test]
    fn bases_growing_past_the_byte_bound_drop_the_others() {
        let mut t = ThreadStacks::default();
        let big = stack(4 << 20, 1);
        let n = MAX_BYTES / (4 << 20);
        for tid in 0..n as u32 {
            assert!(!t.assemble(tid, 0x1000_0000, &big, 0, true).1);
        }
        assert_eq!(t.bytes(), MAX_BYTES);
        // An existing base growing past the bound drops the older half of
        // the others and keeps its own.
        let bigger = stack(8 << 20, 2);
        let (r, resync) = t.assemble(0, 0x1000_0000, &bigger, 0, true);
        assert_eq!(r.unwrap(), &bigger[..]);
        assert!(resync);
        assert!(t.bytes() <= MAX_BYTES, "{} bytes", t.bytes());
        assert!(t.threads() <= n / 2 + 1, "{} bases", t.threads());
    }
}
