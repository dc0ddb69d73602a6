//! Sequence matching in `Profile` against a naive model.
//!
//! The model processes every operation in sequence order with a plain
//! `HashMap` of live allocations. The profile gets the same operations with
//! some sequence numbers missing and the rest shuffled by at most its
//! reordering window; after a flush every per-callsite value, the live set
//! and the dump_at_max peak must be equal.

use std::collections::HashMap;

use heapprofd_model::profile::{Alloc, CallsiteId, FrameId, Interner, Profile};
use proptest::prelude::*;

#[derive(Debug, Clone, Copy)]
enum Op {
    Malloc {
        heap: u32,
        addr: u64,
        size: u64,
        site: usize,
    },
    Free {
        heap: u32,
        addr: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2u32, 0..12u64, 1..100u64, 0..5usize)
            .prop_map(|(heap, addr, size, site)| Op::Malloc { heap, addr: addr * 16, size, site }),
        2 => (0..2u32, 0..14u64).prop_map(|(heap, addr)| Op::Free { heap, addr: addr * 16 }),
    ]
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Totals {
    allocated: u64,
    freed: u64,
    alloc_count: u64,
    free_count: u64,
    live_bytes: u64,
    live_count: u64,
}

#[derive(Default)]
struct ModelHeap {
    live: HashMap<u64, (u64, usize)>,
    sites: HashMap<usize, Totals>,
    live_sum: u64,
    max_sum: u64,
    at_max: HashMap<usize, (u64, u64)>,
}

impl ModelHeap {
    fn release(&mut self, addr: u64) {
        if let Some((size, site)) = self.live.remove(&addr) {
            let t = self.sites.get_mut(&site).unwrap();
            t.freed += size;
            t.free_count += 1;
            t.live_bytes -= size;
            t.live_count -= 1;
            self.live_sum -= size;
        }
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Malloc {
                addr, size, site, ..
            } => {
                self.release(addr);
                self.live.insert(addr, (size, site));
                let t = self.sites.entry(site).or_default();
                t.allocated += size;
                t.alloc_count += 1;
                t.live_bytes += size;
                t.live_count += 1;
                self.live_sum += size;
                if self.live_sum > self.max_sum {
                    self.max_sum = self.live_sum;
                    self.at_max = self
                        .sites
                        .iter()
                        .map(|(&s, t)| (s, (t.live_bytes, t.live_count)))
                        .collect();
                }
            }
            Op::Free { addr, .. } => self.release(addr),
        }
    }
}

/// Sequence number `i + 1` for op `i`; drops the ones in `dropped`; moves
/// each op later by a random amount below `window`.
fn arrival_order(n: usize, delays: &[usize], dropped: &[bool]) -> Vec<usize> {
    let mut keyed: Vec<(usize, usize)> = (0..n)
        .filter(|&i| !dropped[i])
        .map(|i| (i + delays[i], i))
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, i)| i).collect()
}

struct Setup {
    interner: Interner,
    stacks: Vec<Vec<FrameId>>,
}

fn setup() -> Setup {
    let interner = Interner::new();
    let f = |n: &str| interner.intern_frame(None, 0, Some(n), None, None);
    let stacks = vec![
        vec![f("main"), f("a")],
        vec![f("main"), f("a"), f("b")],
        vec![f("main"), f("c")],
        vec![f("thread"), f("a")],
        vec![f("main")],
    ];
    Setup { interner, stacks }
}

fn run_profile(s: &Setup, ops: &[Op], order: &[usize], window: u64) -> Profile {
    let mut p = Profile::with_window(&s.interner, window);
    p.set_heap(42, 0, Some("libc.malloc"), 1);
    p.set_heap(42, 1, Some("other"), 1);
    for &i in order {
        let seq = i as u64 + 1;
        match ops[i] {
            Op::Malloc {
                heap,
                addr,
                size,
                site,
            } => p.malloc(
                42,
                Alloc {
                    heap,
                    seq,
                    address: addr,
                    sample_size: size,
                    size,
                    tid: 1,
                    timestamp_ns: seq,
                },
                &s.stacks[site],
            ),
            Op::Free { heap, addr } => p.free(42, heap, seq, addr),
        }
    }
    p.flush(42);
    p
}

fn check_against_model(s: &Setup, p: &Profile, ops: &[Op], dropped: &[bool]) {
    for heap in 0..2u32 {
        let mut m = ModelHeap::default();
        for (i, &op) in ops.iter().enumerate() {
            let h = match op {
                Op::Malloc { heap, .. } | Op::Free { heap, .. } => heap,
            };
            if h == heap && !dropped[i] {
                m.apply(op);
            }
        }
        let h = p.heap(42, heap).unwrap();
        assert_eq!(h.live_bytes(), m.live_sum, "heap {heap} live bytes");
        assert_eq!(h.live_count(), m.live.len(), "heap {heap} live count");
        assert_eq!(h.max_live_bytes(), m.max_sum, "heap {heap} peak");
        for (site, stack) in s.stacks.iter().enumerate() {
            let want = m.sites.get(&site).cloned().unwrap_or_default();
            let id: Option<CallsiteId> = p.tree().find(stack);
            let got = id.and_then(|id| h.callsite(id)).map(|t| Totals {
                allocated: t.allocated,
                freed: t.freed,
                alloc_count: t.alloc_count,
                free_count: t.free_count,
                live_bytes: t.live_bytes,
                live_count: t.live_count,
            });
            assert_eq!(got.unwrap_or_default(), want, "heap {heap} site {site}");
            let want_max = m.at_max.get(&site).copied().unwrap_or((0, 0));
            let got_max = id
                .and_then(|id| h.callsite(id))
                .map_or((0, 0), |t| h.max_of(t));
            assert_eq!(got_max, want_max, "heap {heap} site {site} at peak");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Reordered within the window, with gaps: same result as in order.
    #[test]
    fn reordered_within_window_equals_in_order(
        ops in prop::collection::vec(op(), 1..160),
        window in 1..24usize,
        seed in prop::collection::vec((0..1000usize, 0..100u8), 160),
        drop_percent in 0..30u8,
    ) {
        let s = setup();
        let n = ops.len();
        let delays: Vec<usize> = seed.iter().take(n).map(|&(d, _)| d % window).collect();
        let dropped: Vec<bool> = seed.iter().take(n).map(|&(_, r)| r < drop_percent).collect();
        let order = arrival_order(n, &delays, &dropped);
        let p = run_profile(&s, &ops, &order, window as u64);
        check_against_model(&s, &p, &ops, &dropped);
        let st = p.process(42).unwrap().order_stats();
        prop_assert_eq!(st.late_ops, 0);
        prop_assert_eq!(p.process(42).unwrap().pending_ops(), 0);
    }

    /// Reordered beyond the window: values stay consistent (nothing freed
    /// twice, nothing negative), only the matching may differ.
    #[test]
    fn reordered_beyond_window_stays_consistent(
        ops in prop::collection::vec(op(), 1..160),
        seed in prop::collection::vec(0..1000usize, 160),
    ) {
        let s = setup();
        let n = ops.len();
        let delays: Vec<usize> = seed.iter().take(n).map(|&d| d % 64).collect();
        let order = arrival_order(n, &delays, &vec![false; n]);
        let p = run_profile(&s, &ops, &order, 4);
        for heap in 0..2 {
            let h = p.heap(42, heap).unwrap();
            let mut live = 0;
            let mut live_count = 0;
            for t in h.callsites() {
                prop_assert!(t.freed <= t.allocated);
                prop_assert!(t.free_count <= t.alloc_count);
                prop_assert_eq!(t.allocated - t.freed, t.live_bytes);
                prop_assert_eq!(t.alloc_count - t.free_count, t.live_count);
                live += t.live_bytes;
                live_count += t.live_count;
            }
            prop_assert_eq!(live, h.live_bytes());
            prop_assert_eq!(live_count, h.live_count() as u64);
        }
    }
}

/// Frees of addresses never sampled leave no trace and cost no memory.
#[test]
fn unknown_frees_need_no_tombstones() {
    let s = setup();
    let mut p = Profile::with_window(&s.interner, 16);
    p.set_heap(1, 0, None, 4096);
    for seq in 1..=100_000u64 {
        p.free(1, 0, seq, seq * 8);
    }
    let proc_ = p.process(1).unwrap();
    assert_eq!(proc_.order_stats().unknown_frees, 100_000);
    assert_eq!(proc_.pending_ops(), 0);
    assert_eq!(p.live_bytes(), 0);
    assert!(p.heap(1, 0).unwrap().callsites().is_empty());
}
