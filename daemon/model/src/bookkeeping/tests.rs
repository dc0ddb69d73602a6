//! Unit tests of the bookkeeping state machine, driven directly (no
//! threads): sessions, stack ids, the exec hold-back, flags, the summary.

use super::*;
use crate::messages::{RingStats, SCRATCH_STACK, SessionEnd};
use crate::profile::{FrameId, HeapState};
use crate::summary::ProcessWarning;

fn frames(i: &Interner, names: &[&str]) -> Box<[FrameId]> {
    names
        .iter()
        .map(|n| i.intern_frame(None, 0, Some(n), None, None))
        .collect()
}

fn started(id: SessionId, pid: u32, cmd: &str) -> SessionEvent {
    SessionEvent::Started {
        id,
        pid,
        cmdline: vec![cmd.to_owned()],
        from_startup: true,
        started_ns: 0,
        identity: Default::default(),
        memory: None,
    }
}

fn ops(id: SessionId, ops: Vec<Op>) -> SessionEvent {
    SessionEvent::Ops {
        id,
        ops,
        stats: SessionStats::default(),
    }
}

fn ended(id: SessionId, pid: u32) -> SessionEvent {
    SessionEvent::Ended {
        id,
        pid,
        stats: SessionStats::default(),
        end: SessionEnd::default(),
    }
}

fn malloc(seq: u64, address: u64, size: u64, stack: u32) -> Op {
    Op::Malloc {
        heap: 0,
        seq,
        address,
        sample_size: size,
        size,
        tid: 1,
        timestamp_ns: seq,
        stack,
        context: 0,
        interval_shift: 0,
    }
}

fn free(seq: u64, address: u64) -> Op {
    Op::Free {
        heap: 0,
        seq,
        address,
    }
}

fn stack(id: u32, frames: &[FrameId]) -> Op {
    Op::Stack {
        id,
        frames: frames.into(),
    }
}

/// (allocated, freed) of the callsite of `names` in heap 0 of `pid`.
fn totals(b: &Bookkeeping, i: &Interner, pid: u32, names: &[&str]) -> Option<(u64, u64)> {
    let p = b.profile();
    let c = p.tree().find(&frames(i, names))?;
    let h: &HeapState = p.heap(pid, 0)?;
    h.callsite(c).map(|t| (t.allocated, t.freed))
}

#[test]
fn stack_ids_map_to_callsites_and_undefined_ids_to_the_empty_stack() {
    let i = Interner::new();
    let mut b = Bookkeeping::new(&i, 4096);
    let main_a = frames(&i, &["main", "a"]);
    assert!(b.handle(started(1, 10, "app")));
    assert!(b.handle(ops(
        1,
        vec![
            stack(1, &main_a),
            malloc(1, 0x10, 100, 1),
            malloc(2, 0x20, 50, 1),
            free(3, 0x10),
            malloc(4, 0x30, 7, 9), // never defined
        ]
    )));
    b.handle(ended(1, 10));
    assert_eq!(totals(&b, &i, 10, &["main", "a"]), Some((150, 100)));
    assert_eq!(
        totals(&b, &i, 10, &["ERROR EMPTY_STACK"]),
        Some((7, 0)),
        "an undefined stack id is kept visible as an empty stack"
    );
    let h = b.profile().heap(10, 0).unwrap();
    assert_eq!(
        (h.name.as_str(), h.sampling_interval),
        ("libc.malloc", 4096)
    );
    assert_eq!(b.live_bytes(), 57);
}

#[test]
fn a_redefined_id_points_at_its_new_stack() {
    let i = Interner::new();
    let mut b = Bookkeeping::new(&i, 1);
    let (x, y) = (frames(&i, &["x"]), frames(&i, &["y"]));
    b.handle(started(1, 10, "app"));
    b.handle(ops(
        1,
        vec![
            stack(SCRATCH_STACK, &x),
            malloc(1, 0x10, 1, SCRATCH_STACK),
            stack(SCRATCH_STACK, &y),
            malloc(2, 0x20, 2, SCRATCH_STACK),
        ],
    ));
    b.finish();
    assert_eq!(totals(&b, &i, 10, &["x"]), Some((1, 0)));
    assert_eq!(totals(&b, &i, 10, &["y"]), Some((2, 0)));
}

/// The exec hold-back: the new image's session (same pid, sequence
/// numbers from 1 again, the same addresses) connects while the old one
/// is still being drained; its events wait until the old session ends.
#[test]
fn exec_holds_the_new_image_back_until_the_old_session_ends() {
    let i = Interner::new();
    let mut b = Bookkeeping::new(&i, 1);
    let (sh, prog) = (frames(&i, &["sh"]), frames(&i, &["prog"]));
    b.handle(started(1, 5, "sh"));
    b.handle(ops(1, vec![stack(1, &sh), malloc(1, 0x100, 10, 1)]));
    // exec: the new image connects before the old one's records are done.
    assert!(!b.handle(started(2, 5, "prog")), "held back");
    assert!(!b.handle(ops(2, vec![stack(1, &prog), malloc(1, 0x100, 30, 1)])));
    assert!(!b.handle(ops(2, vec![free(2, 0x100)])));
    assert_eq!(b.held_back(), 1);
    assert_eq!(
        totals(&b, &i, 5, &["prog"]),
        None,
        "nothing of it applied yet"
    );
    // The old image's last records (seq 2 and 3: from its own space).
    b.handle(ops(1, vec![malloc(2, 0x200, 20, 1), free(3, 0x200)]));
    assert_eq!(totals(&b, &i, 5, &["sh"]), Some((30, 20)));
    // The old session ends: the new one is released, as a new session.
    assert!(b.handle(ended(1, 5)));
    assert_eq!(b.held_back(), 0);
    assert_eq!(b.active_sessions(), 1);
    let p = b.profile().process(5).unwrap();
    assert_eq!(p.cmdline, ["prog"]);
    assert_eq!(
        p.order_stats().late_ops,
        0,
        "its seq 1 was not taken as late"
    );
    // The shell's block at 0x100 went away with its image (exec threw its
    // memory away: not unreleased); the program's is freed.
    assert_eq!(totals(&b, &i, 5, &["sh"]), Some((30, 30)));
    assert_eq!(totals(&b, &i, 5, &["prog"]), Some((30, 30)));
    assert_eq!(
        b.live_bytes(),
        0,
        "the old image's live blocks are released"
    );
    // The events of the released session keep going straight through.
    assert!(b.handle(ops(2, vec![malloc(3, 0x300, 4, 1)])));
    assert_eq!(totals(&b, &i, 5, &["prog"]), Some((34, 30)));
}

/// Issue 10: after an exec the old image's live memory is released (it
/// counts as freed, once, in its callsites), and the process's statistics
/// add up both images' samples instead of showing the last session's.
#[test]
fn exec_releases_the_old_image_and_adds_up_the_stats() {
    let i = Interner::new();
    let mut b = Bookkeeping::new(&i, 1);
    let (sh, prog) = (frames(&i, &["sh"]), frames(&i, &["prog"]));
    let stats = |samples| SessionStats {
        heap_samples: samples,
        unwinding_errors: 1,
        ..SessionStats::default()
    };
    b.handle(started(1, 9, "sh"));
    b.handle(SessionEvent::Ops {
        id: 1,
        ops: vec![
            stack(1, &sh),
            malloc(1, 0x100, 1000, 1),
            malloc(2, 0x200, 500, 1),
            free(3, 0x200),
        ],
        stats: stats(2),
    });
    b.handle(SessionEvent::Ended {
        id: 1,
        pid: 9,
        stats: stats(2),
        end: SessionEnd::default(),
    });
    b.handle(started(2, 9, "prog"));
    b.handle(SessionEvent::Ops {
        id: 2,
        ops: vec![stack(1, &prog), malloc(1, 0x100, 64, 1)],
        stats: stats(1),
    });
    let p = b.profile().process(9).unwrap();
    let sh_totals = p
        .heaps()
        .flat_map(|h| h.callsites().iter())
        .map(|c| (c.allocated, c.freed, c.alloc_count, c.free_count))
        .collect::<Vec<_>>();
    assert!(
        sh_totals.contains(&(1500, 1500, 2, 2)),
        "the shell's 1000 live bytes were thrown away by the exec: {sh_totals:?}"
    );
    assert_eq!(b.live_bytes(), 64, "only the new image's block is live");
    assert_eq!(
        (p.stats.heap_samples, p.stats.unwinding_errors),
        (3, 2),
        "statistics of both images"
    );
    assert_eq!(b.summary()[0].samples, 3);
}

#[test]
fn two_execs_in_a_row_are_released_in_connection_order() {
    let i = Interner::new();
    let mut b = Bookkeeping::new(&i, 1);
    let names = ["one", "two", "three"];
    for (n, name) in names.iter().enumerate() {
        let id = n as SessionId + 1;
        b.handle(started(id, 7, name));
        let f = frames(&i, &[name]);
        b.handle(ops(id, vec![stack(1, &f), malloc(1, 0x10, id, 1)]));
    }
    assert_eq!(b.held_back(), 2);
    b.handle(ended(1, 7));
    assert_eq!(b.profile().process(7).unwrap().cmdline, ["two"]);
    assert_eq!(b.held_back(), 1);
    b.handle(ended(2, 7));
    assert_eq!(b.profile().process(7).unwrap().cmdline, ["three"]);
    b.handle(ended(3, 7));
    // Each exec released the image before; the last one's block is live.
    for (n, name) in names.iter().enumerate() {
        let v = n as u64 + 1;
        let freed = if n < 2 { v } else { 0 };
        assert_eq!(totals(&b, &i, 7, &[name]), Some((v, freed)), "{name}");
    }
}

#[test]
fn finish_applies_sessions_whose_predecessor_never_ended() {
    let i = Interner::new();
    let mut b = Bookkeeping::new(&i, 1);
    let f = frames(&i, &["late"]);
    b.handle(started(1, 3, "old"));
    b.handle(started(2, 3, "new"));
    b.handle(ops(2, vec![stack(1, &f), malloc(2, 0x10, 8, 1)]));
    assert_eq!(totals(&b, &i, 3, &["late"]), None);
    b.finish();
    assert_eq!(b.held_back(), 0);
    // Released and flushed: its seq 1 never came, seq 2 is committed.
    assert_eq!(totals(&b, &i, 3, &["late"]), Some((8, 0)));
}

#[test]
fn events_of_unknown_sessions_are_ignored() {
    let i = Interner::new();
    let mut b = Bookkeeping::new(&i, 1);
    b.handle(ops(9, vec![malloc(1, 0x10, 8, 0)]));
    assert_eq!(b.profile().processes().count(), 0);
    assert_eq!(b.live_bytes(), 0);
}

#[test]
fn a_failed_load_after_a_rejection_leaves_the_process_rejected() {
    let i = Interner::new();
    let mut b = Bookkeeping::new(&i, 1);
    b.reject_concurrent(7, vec!["app".into()]);
    b.not_attached(7, vec!["app".into()], "it exited".into());
    b.not_attached(8, vec!["other".into()], "it exited".into());
    let p = b.profile().process(7).unwrap();
    assert!(p.flags.rejected_concurrent && !p.flags.disconnected);
    assert_eq!(p.not_attached, None);
    let s = b.summary();
    let seven = s.iter().find(|p| p.pid == 7).unwrap();
    assert_eq!(seven.not_attached, None);
    assert_eq!(seven.warnings, [ProcessWarning::RejectedConcurrent]);
    let eight = s.iter().find(|p| p.pid == 8).unwrap();
    assert_eq!(eight.not_attached.as_deref(), Some("it exited"));
}

#[test]
fn stats_set_flags_and_the_summary_warns() {
    let i = Interner::new();
    let mut b = Bookkeeping::new(&i, 1);
    let f = frames(&i, &["f"]);
    b.handle(started(1, 4, "app"));
    let stats = SessionStats {
        heap_samples: 10,
        unwinding_errors: 2,
        ring: RingStats {
            writes_overflow: 3,
            blocked_us: 77,
            ..RingStats::default()
        },
        client_error: ClientError::HitTimeout,
        corrupt_records: 1,
        ..SessionStats::default()
    };
    b.handle(SessionEvent::Ops {
        id: 1,
        ops: vec![stack(1, &f), malloc(1, 0x10, 8, 1)],
        stats: stats.clone(),
    });
    b.handle(SessionEvent::Ended {
        id: 1,
        pid: 4,
        stats,
        end: SessionEnd {
            disconnected: true,
            stopped_by_daemon: false,
        },
    });
    let p = b.profile().process(4).unwrap();
    assert!(p.flags.buffer_overran && p.flags.buffer_corrupted && p.flags.disconnected);
    assert_eq!(p.flags.client_error, ClientError::HitTimeout);
    assert_eq!(p.stats.client_spinlock_blocked_us, 77);
    assert_eq!(b.dropped_records(), 3);
    let s = b.summary();
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].pid, s[0].samples, s[0].allocated), (4, 10, 8));
    assert_eq!(
        s[0].warnings,
        [
            ProcessWarning::SamplesDropped(3),
            ProcessWarning::BlockTimeout,
            ProcessWarning::BufferCorrupt,
            ProcessWarning::UnwindErrors {
                errors: 2,
                samples: 10
            },
        ]
    );
}

#[test]
fn a_malloc_in_a_context_is_charged_under_the_contexts_root_frame() {
    use crate::profile::context::{intern_context_frame, unknown_labels};
    let i = Interner::new();
    let mut b = Bookkeeping::new(&i, 1);
    let main_a = frames(&i, &["main", "a"]);
    let a = vec![("endpoint".to_owned(), "/a".to_owned())];
    let ctx = intern_context_frame(&i, &a);
    let in_context = |seq, address, size, context| {
        let mut op = malloc(seq, address, size, 1);
        if let Op::Malloc { context: c, .. } = &mut op {
            *c = context;
        }
        op
    };
    b.handle(started(1, 10, "app"));
    b.handle(ops(
        1,
        vec![
            stack(1, &main_a),
            Op::Context {
                id: 4097,
                frame: ctx,
                overflowed: 3,
            },
            in_context(1, 0x10, 100, 4097),
            in_context(2, 0x20, 20, 4097),
            malloc(3, 0x30, 5, 1),
            in_context(4, 0x40, 1, 99), // never defined
        ],
    ));
    b.finish();
    let name = |f: FrameId| i.read().function_name(f).unwrap_or_default();
    let p = b.profile();
    let under = |root: FrameId| {
        let mut s = vec![root];
        s.extend_from_slice(&main_a);
        let c = p.tree().find(&s)?;
        p.heap(10, 0)?.callsite(c).map(|t| t.allocated)
    };
    assert_eq!(under(ctx), Some(120), "{}", name(ctx));
    assert_eq!(totals(&b, &i, 10, &["main", "a"]), Some((5, 0)));
    let unknown = intern_context_frame(&i, &unknown_labels());
    assert_eq!(under(unknown), Some(1));
    let cs = p.process(10).unwrap().contexts;
    assert_eq!((cs.defined, cs.overflowed, cs.unknown_samples), (1, 3, 1));
    assert!(
        b.summary()
            .iter()
            .any(|s| s.warnings.contains(&ProcessWarning::ContextOverflow(3)))
    );
}

#[test]
fn a_raised_interval_warns_with_the_samples_thinned_away() {
    let i = Interner::new();
    let mut b = Bookkeeping::new(&i, 4096);
    let f = frames(&i, &["f"]);
    b.handle(started(1, 4, "app"));
    // One sample of 100 bytes drawn at 4 KiB << 10.
    let mut raised = malloc(1, 0x10, 100, 1);
    if let Op::Malloc {
        sample_size,
        interval_shift,
        ..
    } = &mut raised
    {
        (*sample_size, *interval_shift) = (4096 << 10, 10);
    }
    let stats = SessionStats {
        heap_samples: 2,
        ring: RingStats {
            thinned: 9,
            ..RingStats::default()
        },
        ..SessionStats::default()
    };
    b.handle(SessionEvent::Ops {
        id: 1,
        ops: vec![stack(1, &f), raised, malloc(2, 0x20, 8192, 1)],
        stats,
    });
    let s = b.summary();
    assert_eq!(
        s[0].warnings,
        [ProcessWarning::IntervalRaised {
            samples: 1,
            from: 4096,
            to: 4096 << 10,
            thinned: 9
        }]
    );
}
