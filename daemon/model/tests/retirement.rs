//! Retiring idle callsites (`Profile::retire_idle`): what may go, what
//! must stay, and that a trace written across a retirement reads back with
//! the same totals as one written without it.

mod core_support;

use core_support::{CLOCKS, Program, Seq, at_ms};
use heapprofd_model::profile::{Alloc, CallsiteId, FrameId, Profile};
use heapprofd_model::trace::{TraceWriter, read_trace};

const PID: u32 = 100;

/// An allocation of the main thread of [`PID`].
fn alloc(seq: u64, address: u64, size: u64, ms: u64) -> Alloc {
    core_support::alloc(seq, address, size, PID, ms)
}

fn profile(p: &Program) -> Profile {
    let mut prof = Profile::new(&p.interner);
    prof.add_process(PID, vec!["app".into()], true);
    prof.set_heap(PID, 0, Some("libc.malloc"), 1);
    prof
}

/// A malloc and its free on `stack`.
fn pair(prof: &mut Profile, seq: &mut Seq, stack: &[FrameId], address: u64, size: u64, ms: u64) {
    let s = seq.next(PID);
    prof.malloc(PID, alloc(s, address, size, ms), stack);
    let s = seq.next(PID);
    prof.free(PID, 0, s, address);
}

fn find(prof: &Profile, stack: &[FrameId]) -> Option<CallsiteId> {
    prof.tree().find(stack)
}

#[test]
fn an_idle_callsite_goes_after_two_passes_and_comes_back_with_new_ids() {
    let p = Program::new();
    let mut prof = profile(&p);
    let mut seq = Seq::default();
    let mut w = TraceWriter::new(Vec::new(), CLOCKS).unwrap();
    pair(&mut prof, &mut seq, &p.stack_b(), 0x10, 100, 1);
    let s = seq.next(PID);
    prof.malloc(PID, alloc(s, 0x20, 7, 1), &p.stack_a()); // stays live
    let b = find(&prof, &p.stack_b()).unwrap();
    // Not dumped yet: nothing may go.
    assert_eq!(prof.retire_idle([]), 0);
    w.dump(&mut prof, &p.interner, at_ms(2)).unwrap();
    // Dumped and idle, but only for one pass so far.
    assert_eq!(prof.retire_idle([]), 0);
    w.dump(&mut prof, &p.interner, at_ms(3)).unwrap();
    // Second pass: stack_b's leaf frames go (worker, alloc_b), the callers
    // that stack_a shares stay.
    assert_eq!(prof.retire_idle([]), 2);
    assert_eq!(find(&prof, &p.stack_b()), None);
    assert!(find(&prof, &p.stack_a()).is_some());
    let heap = prof.heap(PID, 0).unwrap();
    assert_eq!(heap.retired.callsites, 1);
    assert_eq!((heap.retired.allocated, heap.retired.freed), (100, 100));
    // It comes back: new ids, totals from zero, the slot reused.
    pair(&mut prof, &mut seq, &p.stack_b(), 0x30, 50, 4);
    let b2 = find(&prof, &p.stack_b()).unwrap();
    assert!(b2.get() > b.get(), "{b2} reuses an id up to {b}");
    let t = prof.heap(PID, 0).unwrap().callsite(b2).unwrap();
    assert_eq!((t.allocated, t.alloc_count), (50, 1));
    assert_eq!(prof.heap(PID, 0).unwrap().callsites().len(), 2);
    w.dump(&mut prof, &p.interner, at_ms(5)).unwrap();
    // Both lives of stack_b count: the retired one in `retired`.
    let heap = prof.heap(PID, 0).unwrap();
    let live: u64 = heap.callsites().iter().map(|c| c.allocated).sum();
    assert_eq!(live + heap.retired.allocated, 157);
    // The reader merges the two ids of stack_b.
    let t = read_trace(w.finish().unwrap().as_slice()).unwrap();
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    let h = &t.heaps[0];
    let leaf = |name: &str| {
        let v: Vec<_> = h
            .callstacks
            .iter()
            .filter(|c| c.frames.last().and_then(|f| f.function.as_deref()) == Some(name))
            .collect();
        assert_eq!(v.len(), 1, "{name}: {v:?}");
        (v[0].self_allocated, v[0].self_freed, v[0].alloc_count)
    };
    assert_eq!(leaf("alloc_b"), (150, 150, 2));
    assert_eq!(leaf("alloc_a"), (7, 0, 1));
}

#[test]
fn live_changed_held_and_waiting_callsites_stay() {
    let p = Program::new();
    let mut prof = profile(&p);
    let mut seq = Seq::default();
    let mut w = TraceWriter::new(Vec::new(), CLOCKS).unwrap();
    // stack_a: live. stack_b: idle but held. stack_err: changes every pass.
    let s = seq.next(PID);
    prof.malloc(PID, alloc(s, 0x10, 8, 1), &p.stack_a());
    pair(&mut prof, &mut seq, &p.stack_b(), 0x20, 16, 1);
    let b = find(&prof, &p.stack_b()).unwrap();
    for ms in 2..6 {
        pair(&mut prof, &mut seq, &p.stack_err(), 0x30, 4, ms);
        w.dump(&mut prof, &p.interner, at_ms(ms)).unwrap();
        assert_eq!(prof.retire_idle([b]), 0, "pass at {ms} ms");
    }
    // A malloc waiting for an earlier sequence number holds its callsite
    // (its slot will change when it commits): skip one number.
    let skipped = seq.next(PID);
    let s = seq.next(PID);
    let waiting = vec![p.main, p.worker];
    prof.malloc(PID, alloc(s, 0x40, 32, 6), &waiting);
    for ms in 6..8 {
        w.dump(&mut prof, &p.interner, at_ms(ms)).unwrap();
        prof.retire_idle([b]);
    }
    assert!(find(&prof, &waiting).is_some());
    // Once it commits, the waiting malloc is counted in the same callsite.
    prof.free(PID, 0, skipped, 0x999);
    let c = find(&prof, &waiting).unwrap();
    let t = prof.heap(PID, 0).unwrap().callsite(c).unwrap();
    assert_eq!((t.allocated, t.live_count), (32, 1));
    assert!(find(&prof, &p.stack_a()).is_some());
    assert!(find(&prof, &p.stack_b()).is_some());
    // Unheld, stack_b goes (after its idle pass, already done).
    w.dump(&mut prof, &p.interner, at_ms(9)).unwrap();
    assert!(prof.retire_idle([]) > 0);
    assert_eq!(find(&prof, &p.stack_b()), None);
}

#[test]
fn a_profile_of_two_processes_retires_nothing() {
    // Trace processor carries a process's old totals over to a new id per
    // id, not per process: two processes using a stack's new id would
    // overwrite each other's correction. So with a second process nothing
    // is retired, even a callsite idle in both.
    let p = Program::new();
    let mut prof = profile(&p);
    prof.add_process(200, vec!["other".into()], true);
    prof.set_heap(200, 0, Some("libc.malloc"), 1);
    let mut seq = Seq::default();
    let mut w = TraceWriter::new(Vec::new(), CLOCKS).unwrap();
    pair(&mut prof, &mut seq, &p.stack_b(), 0x10, 100, 1);
    let (s1, s2) = (seq.next(200), seq.next(200));
    let mut a = alloc(s1, 0x10, 5, 1);
    a.tid = 200;
    prof.malloc(200, a, &p.stack_b());
    prof.free(200, 0, s2, 0x10);
    for ms in 2..6 {
        w.dump(&mut prof, &p.interner, at_ms(ms)).unwrap();
        assert_eq!(prof.retire_idle([]), 0);
    }
    let b = find(&prof, &p.stack_b()).unwrap();
    assert_eq!(
        prof.heap(PID, 0).unwrap().callsite(b).unwrap().allocated,
        100
    );
    assert_eq!(prof.heap(200, 0).unwrap().callsite(b).unwrap().allocated, 5);
}
