//! Where the daemon's time goes: relaxed totals over a whole run, printed
//! with `HEAPPROFD_DEBUG=1` as one `costs:` line at the end (read by
//! `scripts/bench-workloads.sh`, docs/PERFORMANCE.md).
//!
//! Nothing here reads a clock per sample that was not read before: the
//! workers time each drain turn (up to a thousand records), the unwinding
//! split comes from the session's existing unwinding time plus clock reads
//! around the walks that keep a replay trace and around new stacks (each
//! costs microseconds), the bookkeeping thread times each message (a batch)
//! and each dump, the symbolizer each frame it names. The client side is
//! what its ring says: bytes written and the time its writers waited for
//! room (`blocked_us`); its own CPU per sample is the program's CPU over the
//! bare run, which only the benchmark (measuring both) knows.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A session's unwinding time split by path (see
/// [`SessionUnwinder`](super::session_unwinder::SessionUnwinder)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindSplit {
    /// Samples answered by the replay memo.
    pub replays: u64,
    /// Their time (one in `HIT_TIMING` timed, scaled: an estimate).
    pub replay: Duration,
    /// Samples walked (the memo did not answer).
    pub walks: u64,
    /// Walks that kept a trace for the memo.
    pub traced_walks: u64,
    /// Their time (walk, relevance checks, memo insert).
    pub traced: Duration,
    /// Walks that found a stack not seen before.
    pub new_stacks: u64,
    /// The time spent defining them (pc lookups, interning).
    pub new_stack: Duration,
}

impl UnwindSplit {
    /// Adds `other` to these totals.
    pub fn add(&mut self, other: &UnwindSplit) {
        self.replays += other.replays;
        self.replay += other.replay;
        self.walks += other.walks;
        self.traced_walks += other.traced_walks;
        self.traced += other.traced;
        self.new_stacks += other.new_stacks;
        self.new_stack += other.new_stack;
    }
}

/// Relaxed totals of a run (see the module docs).
#[derive(Debug, Default)]
pub struct Costs {
    /// Records read out of the rings.
    pub records: AtomicU64,
    /// Malloc samples unwound.
    pub samples: AtomicU64,
    /// Bytes the clients wrote into their rings.
    pub ring_bytes: AtomicU64,
    /// Time the clients' writers waited for room in a full ring (µs,
    /// summed over threads).
    pub blocked_us: AtomicU64,
    /// Samples the clients thinned away rather than wait for room.
    pub thinned: AtomicU64,
    /// Workers' time in drain turns: reading, decoding, unwinding (ns).
    pub drain_ns: AtomicU64,
    /// Of which unwinding (the sessions' unwinding time, ns).
    pub unwind_ns: AtomicU64,
    /// Samples answered by the replay memo and their estimated time (ns).
    pub replays: AtomicU64,
    /// See [`UnwindSplit::replay`].
    pub replay_ns: AtomicU64,
    /// Samples walked.
    pub walks: AtomicU64,
    /// Walks that kept a trace, and their time (ns).
    pub traced_walks: AtomicU64,
    /// See [`UnwindSplit::traced`].
    pub traced_ns: AtomicU64,
    /// New stacks defined, and the time to define them (ns).
    pub new_stacks: AtomicU64,
    /// See [`UnwindSplit::new_stack`].
    pub new_stack_ns: AtomicU64,
    /// The bookkeeping thread applying the workers' batches (ns).
    pub book_ns: AtomicU64,
    /// The bookkeeping thread dumping, the final dump included (ns; the
    /// symbolization before each dump included).
    pub dump_ns: AtomicU64,
}

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

impl Costs {
    /// Adds `d` to a nanosecond total.
    pub fn add_time(total: &AtomicU64, d: Duration) {
        total.fetch_add(ns(d), Ordering::Relaxed);
    }

    /// Adds an ended session's totals: its ring's and its unwinding's.
    pub fn add_session(
        &self,
        ring: &heapprofd_shmem::Stats,
        unwind: Duration,
        split: &UnwindSplit,
    ) {
        let add = |c: &AtomicU64, v: u64| {
            c.fetch_add(v, Ordering::Relaxed);
        };
        add(&self.ring_bytes, ring.bytes_written);
        add(&self.blocked_us, ring.blocked_us);
        add(&self.thinned, ring.thinned);
        add(&self.unwind_ns, ns(unwind));
        add(&self.replays, split.replays);
        add(&self.replay_ns, ns(split.replay));
        add(&self.walks, split.walks);
        add(&self.traced_walks, split.traced_walks);
        add(&self.traced_ns, ns(split.traced));
        add(&self.new_stacks, split.new_stacks);
        add(&self.new_stack_ns, ns(split.new_stack));
    }

    /// The `costs:` line: counts, and times in ms. `symbolize` and `warm`
    /// are the symbolizer's (before dumps, and on its warm-up thread).
    pub fn render(&self, symbolize: Duration, warm: Duration) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let ms = |c: &AtomicU64| get(c) as f64 / 1e6;
        let mut s = String::from("costs:");
        for (name, v) in [
            ("records", &self.records),
            ("samples", &self.samples),
            ("ring_bytes", &self.ring_bytes),
            ("blocked_us", &self.blocked_us),
            ("thinned", &self.thinned),
            ("replays", &self.replays),
            ("walks", &self.walks),
            ("traced_walks", &self.traced_walks),
            ("new_stacks", &self.new_stacks),
        ] {
            let _ = write!(s, " {name}={}", get(v));
        }
        for (name, v) in [
            ("drain_ms", &self.drain_ns),
            ("unwind_ms", &self.unwind_ns),
            ("replay_ms", &self.replay_ns),
            ("traced_ms", &self.traced_ns),
            ("new_stack_ms", &self.new_stack_ns),
            ("book_ms", &self.book_ns),
            ("dump_ms", &self.dump_ns),
        ] {
            let _ = write!(s, " {name}={:.1}", ms(v));
        }
        let _ = write!(
            s,
            " symbolize_ms={:.1} warm_ms={:.1}",
            symbolize.as_secs_f64() * 1e3,
            warm.as_secs_f64() * 1e3
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_add_up_and_render_as_one_line() {
        let c = Costs::default();
        let ring = heapprofd_shmem::Stats {
            bytes_written: 1000,
            blocked_us: 7,
            thinned: 5,
            ..Default::default()
        };
        let split = UnwindSplit {
            replays: 3,
            replay: Duration::from_micros(1),
            walks: 2,
            traced_walks: 1,
            traced: Duration::from_millis(2),
            new_stacks: 1,
            new_stack: Duration::from_millis(1),
        };
        c.add_session(&ring, Duration::from_millis(4), &split);
        c.add_session(&ring, Duration::from_millis(4), &split);
        Costs::add_time(&c.book_ns, Duration::from_millis(3));
        let line = c.render(Duration::from_millis(5), Duration::ZERO);
        for part in [
            "ring_bytes=2000",
            "blocked_us=14",
            "thinned=10",
            "replays=6",
            "walks=4",
            "traced_walks=2",
            "new_stacks=2",
            "unwind_ms=8.0",
            "traced_ms=4.0",
            "new_stack_ms=2.0",
            "book_ms=3.0",
            "symbolize_ms=5.0",
            "warm_ms=0.0",
        ] {
            assert!(line.contains(part), "{part} not in {line}");
        }
        assert!(!line.contains('\n'));
    }
}
