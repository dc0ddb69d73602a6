//! What heapprofd-rs writes besides Perfetto's heap samples, read back:
//! the extension's per-callsite statistics (estimated allocations, sizes,
//! lifetimes, temporaries), the per-dump timeline, the process tree's
//! parents and threads, memory counters, and how a cut trace is reported.

mod core_support;

use core_support::{CLOCKS, Program, alloc, at_ms, check_trace};
use heapprofd_model::profile::Profile;
use heapprofd_model::profile::estimate::inverse_probability;
use heapprofd_model::trace::{ProcessMemory, TraceWriter, read_trace};

/// Exact mode, two threads and two dumps:
/// thread 1: A (stack_a, 100 B) then frees A at once (temporary, lifetime 0);
/// thread 2: B (stack_b, 1000 B); thread 1: C (stack_a, 100 B);
/// thread 2 frees B (B was thread 2's latest: temporary, lifetime 1);
/// dump 1; thread 1 frees C after thread 1 allocated D (not temporary).
fn exact_profile(p: &Program) -> (Profile, Vec<u8>) {
    let mut prof = Profile::new(&p.interner);
    let pr = prof.add_process(100, vec!["app".into()], true);
    pr.identity.ppid = Some(1);
    pr.set_thread_name(100, "app".into());
    pr.session_start_ns = at_ms(1);
    prof.set_heap(100, 0, Some("libc.malloc"), 1);
    let mut w = TraceWriter::new(Vec::new(), CLOCKS).unwrap();
    let mem = |rss| ProcessMemory {
        pid: 100,
        vm_rss_kb: rss,
        vm_hwm_kb: rss,
        ..Default::default()
    };
    w.write_memory(at_ms(1), &[mem(1000)]).unwrap();
    prof.malloc(100, alloc(1, 0x10, 100, 100, 2), &p.stack_a());
    prof.free(100, 0, 2, 0x10);
    prof.malloc(100, alloc(3, 0x20, 1000, 101, 3), &p.stack_b());
    prof.malloc(100, alloc(4, 0x30, 100, 100, 4), &p.stack_a());
    prof.free(100, 0, 5, 0x20);
    w.dump(&mut prof, &p.interner, at_ms(5)).unwrap();
    w.write_memory(at_ms(5), &[mem(3000)]).unwrap();
    prof.malloc(100, alloc(6, 0x40, 7, 100, 6), &p.stack_err());
    prof.free(100, 0, 7, 0x30);
    prof.flush_all();
    // A thread seen in samples gets a name from the runtime.
    assert_eq!(prof.take_unnamed_threads(), [(100, 101)]);
    prof.process_mut(100)
        .unwrap()
        .set_thread_name(101, "worker".into());
    w.dump(&mut prof, &p.interner, at_ms(9)).unwrap();
    let bytes = w.finish().unwrap();
    (prof, bytes)
}

#[test]
fn exact_mode_statistics_timeline_and_processes_round_trip() {
    let p = Program::new();
    let (_, bytes) = exact_profile(&p);
    let t = read_trace(bytes.as_slice()).unwrap();
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert!(t.truncated.is_none());
    let h = &t.heaps[0];
    assert!(h.exact);
    let by_leaf = |name: &str| {
        h.callstacks
            .iter()
            .find(|c| c.frames.last().and_then(|f| f.function.as_deref()) == Some(name))
            .unwrap()
    };
    let a = by_leaf("alloc_a").stats.clone().unwrap();
    assert_eq!(a.estimated_allocs, 2.0);
    assert_eq!(a.temporary, 1, "A is temporary, C is not");
    let lifetimes: Vec<(u8, u64)> = a.lifetimes.iter().map(|b| (b.log2, b.frees)).collect();
    // A: no allocation in between; C: one (D).
    assert_eq!(lifetimes, [(0, 1), (1, 1)]);
    let sizes: Vec<(u8, u64)> = a.sizes.iter().map(|b| (b.log2, b.samples)).collect();
    assert_eq!(sizes, [(7, 2)]);
    let b = by_leaf("alloc_b").stats.clone().unwrap();
    assert_eq!(
        (b.temporary, b.lifetimes[0].log2),
        (1, 1),
        "B lived 1 allocation (C)"
    );
    // Timeline: two dumps; the first window starts at the session start.
    assert_eq!(h.timeline.len(), 2);
    let (d1, d2) = (&h.timeline[0], &h.timeline[1]);
    assert_eq!((d1.start, d1.timestamp), (at_ms(1), at_ms(5)));
    assert_eq!((d1.totals.allocated, d1.totals.freed), (1200, 1100));
    assert_eq!((d2.totals.allocated, d2.totals.freed), (1207, 1200));
    assert_eq!(d1.changes.len(), 2);
    // Process tree and memory (converted to the dumps' clock).
    let pr = &t.processes[&100];
    assert_eq!(pr.ppid, Some(1));
    assert_eq!(pr.threads.get(&101).map(String::as_str), Some("worker"));
    assert_eq!(pr.threads.get(&100).map(String::as_str), Some("app"));
    let rss: Vec<(u64, u64)> = pr.memory.iter().map(|m| (m.timestamp, m.rss_kb)).collect();
    assert_eq!(rss, [(at_ms(1), 1000), (at_ms(5), 3000)]);
    // Perfetto's schema: nothing unknown but the extension packets.
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, &bytes).unwrap();
    let (code, json) = check_trace(f.path());
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["extensions"]["heapprofd_rs"], 2, "{json}");
}

#[test]
fn sampled_mode_estimates_allocations_and_counts_no_lifetimes() {
    let p = Program::new();
    let mut prof = Profile::new(&p.interner);
    prof.set_heap(7, 0, Some("libc.malloc"), 4096);
    // Three 100-byte samples (each standing for 4096 bytes) and one big one.
    for (i, size) in [100u64, 100, 100, 10_000].into_iter().enumerate() {
        let seq = i as u64 + 1;
        let mut a = alloc(seq, 0x100 * seq, size, 7, 1);
        a.sample_size = size.max(4096);
        prof.malloc(7, a, &p.stack_a());
    }
    prof.free(7, 0, 5, 0x100);
    let mut w = TraceWriter::new(Vec::new(), CLOCKS).unwrap();
    w.dump(&mut prof, &p.interner, at_ms(2)).unwrap();
    let t = read_trace(w.finish().unwrap().as_slice()).unwrap();
    let h = &t.heaps[0];
    assert!(!h.exact);
    let s = h.callstacks[0].stats.clone().unwrap();
    let want = 3.0 * inverse_probability(100, 4096) + 1.0;
    assert!((s.estimated_allocs - want).abs() < 1e-6, "{s:?}");
    assert!(s.lifetimes.is_empty() && s.temporary == 0);
    assert_eq!(h.callstacks[0].alloc_count, 4, "samples");
}

#[test]
fn a_cut_trace_says_where() {
    let p = Program::new();
    let (_, bytes) = exact_profile(&p);
    // Inside a packet.
    let t = read_trace(&bytes[..bytes.len() - 3]).unwrap();
    let cut = t.truncated.expect("truncated");
    assert!(cut.what.contains("inside a packet"), "{cut:?}");
    assert!(cut.offset < bytes.len() as u64 - 3);
    assert_eq!(cut.file_len, bytes.len() as u64 - 3);
    // At a packet boundary inside the first dump: the dump is unfinished.
    let mut end = 0;
    let mut boundaries = Vec::new();
    while end < bytes.len() {
        let (len, n) = varint(&bytes[end + 1..]);
        end += 1 + n + len as usize;
        boundaries.push(end);
    }
    let mid_dump = boundaries
        .iter()
        .copied()
        .find(|&b| {
            let t = read_trace(&bytes[..b]).unwrap();
            t.heaps.first().is_some_and(|h| h.dumps == 1) && t.truncated.is_some()
        })
        .expect("a boundary inside the first dump");
    let t = read_trace(&bytes[..mid_dump]).unwrap();
    assert!(
        t.truncated.unwrap().what.contains("not finished"),
        "{:?}",
        t.warnings
    );
    // At the boundary after a whole dump (and its extension): nothing lost.
    let whole = read_trace(bytes.as_slice()).unwrap();
    assert!(whole.truncated.is_none());
}

fn varint(b: &[u8]) -> (u64, usize) {
    let mut v = 0;
    for (i, &x) in b.iter().enumerate() {
        v |= u64::from(x & 0x7f) << (7 * i);
        if x & 0x80 == 0 {
            return (v, i + 1);
        }
    }
    (v, b.len())
}

/// Dumps asked for within one tick of the coarse clock: each gets its own
/// timestamp (trace_processor, the Perfetto UI, keeps one dump per
/// timestamp). Parents that are not profiled are named in the process
/// tree; a parent's own parent only when the trace has it.
#[test]
fn dumps_of_one_tick_stay_apart_and_unprofiled_parents_are_named() {
    use heapprofd_model::profile::ParentProcess;
    let p = Program::new();
    let mut prof = Profile::new(&p.interner);
    let parent = |pid, ppid, cmd: &str| ParentProcess {
        pid,
        ppid,
        cmdline: vec![cmd.into()],
    };
    // sh (100, child of `record` 50, whose parent 1 is not in the trace)
    // runs 200 directly and 300 from a subshell (60, not profiled).
    for (pid, pp) in [
        (100, parent(50, Some(1), "record")),
        (200, parent(100, Some(50), "sh")),
        (300, parent(60, Some(100), "sh")),
    ] {
        let pr = prof.add_process(pid, vec![format!("p{pid}")], true);
        pr.identity.ppid = Some(pp.pid);
        pr.identity.parent = Some(pp);
        pr.set_thread_name(pid, format!("p{pid}"));
        prof.set_heap(pid, 0, Some("libc.malloc"), 1);
    }
    let mut w = TraceWriter::new(Vec::new(), CLOCKS).unwrap();
    prof.malloc(100, alloc(1, 0x10, 100, 100, 2), &p.stack_a());
    w.dump(&mut prof, &p.interner, at_ms(5)).unwrap();
    prof.malloc(100, alloc(2, 0x20, 100, 100, 3), &p.stack_a());
    w.dump(&mut prof, &p.interner, at_ms(5)).unwrap();
    w.dump(&mut prof, &p.interner, at_ms(5)).unwrap();
    let bytes = w.finish().unwrap();
    let t = read_trace(bytes.as_slice()).unwrap();
    for h in &t.heaps {
        let ts: Vec<u64> = h.timeline.iter().map(|d| d.timestamp).collect();
        assert_eq!(ts, [at_ms(5), at_ms(5) + 1, at_ms(5) + 2], "pid {}", h.pid);
        assert_eq!(h.dumps, 3);
    }
    let sh = t.heaps.iter().find(|h| h.pid == 100).unwrap();
    assert_eq!(sh.timeline[1].totals.allocated, 200);
    let procs = &t.processes;
    assert_eq!(procs[&50].cmdline, ["record"]);
    assert_eq!(procs[&50].ppid, None, "pid 1 is not in the trace");
    assert_eq!(procs[&60].cmdline, ["sh"]);
    assert_eq!(procs[&60].ppid, Some(100));
    assert_eq!(procs[&100].cmdline, ["p100"], "profiled: its own entry");
    assert_eq!(
        (procs[&100].ppid, procs[&200].ppid, procs[&300].ppid),
        (Some(50), Some(100), Some(60))
    );
    assert_eq!(procs[&300].threads[&300], "p300");
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, &bytes).unwrap();
    let (code, json) = check_trace(f.path());
    assert_eq!(code, 0, "{json}");
}

/// A trace whose dumps share a timestamp (an older heapprofd-rs, or any
/// writer): counted once, as trace_processor shows them, with the later
/// values.
#[test]
fn dumps_sharing_a_timestamp_count_once() {
    use heapprofd_proto::perfetto::{Message, ProfilePacket, Trace, TracePacket};
    use heapprofd_proto::perfetto::{profile_packet, trace_packet};
    let mut packets = Vec::new();
    let mut first = TracePacket {
        sequence_flags: Some(1),
        ..Default::default()
    };
    first.set_trusted_packet_sequence_id(1);
    packets.push(first);
    let mut index = 0;
    let mut group = |ts: u64, allocated: u64| {
        for (dumps, continued) in [(1, false), (0, false)] {
            let d = profile_packet::ProcessHeapSamples {
                pid: Some(7),
                heap_name: Some("libc.malloc".into()),
                timestamp: Some(ts),
                start_timestamp: Some(1),
                samples: vec![profile_packet::HeapSample {
                    callstack_id: Some(1),
                    self_allocated: Some(allocated),
                    alloc_count: Some(allocated),
                    ..Default::default()
                }],
                ..Default::default()
            };
            let mut p = TracePacket {
                data: Some(trace_packet::Data::ProfilePacket(ProfilePacket {
                    process_dumps: if dumps == 1 { vec![d] } else { Vec::new() },
                    continued: Some(continued),
                    index: Some(index),
                    ..Default::default()
                })),
                ..Default::default()
            };
            p.set_trusted_packet_sequence_id(1);
            packets.push(p);
            index += 1;
        }
    };
    group(100, 1);
    group(100, 2);
    group(200, 3);
    let bytes = Trace { packet: packets }.encode_to_vec();
    let t = read_trace(bytes.as_slice()).unwrap();
    let h = &t.heaps[0];
    assert_eq!(h.dumps, 2);
    let points: Vec<(u64, u64, usize)> = h
        .timeline
        .iter()
        .map(|d| (d.timestamp, d.totals.allocated, d.changes.len()))
        .collect();
    assert_eq!(points, [(100, 2, 1), (200, 3, 1)]);
    assert_eq!(h.timeline[0].changes[0].1.allocated, 2);
}

/// Offline symbols appended to a trace written without names (what
/// `heapprofd-rs symbolize` does): the reader names the frames through
/// them, an inline chain as the writer writes one (outermost first, the
/// innermost function last), and leaves other frames bare.
#[test]
fn module_symbols_name_the_bare_frames() {
    use heapprofd_model::trace::WriterConfig;
    use heapprofd_proto::perfetto::{
        AddressSymbols, Line, Message, ModuleSymbols, TracePacket, trace_packet,
    };
    let p = Program::new();
    let mut prof = core_support::sample_profile(&p);
    let cfg = WriterConfig {
        symbolize: false,
        ..Default::default()
    };
    let mut bytes = core_support::write_trace(cfg, |w| {
        w.dump(&mut prof, &p.interner, at_ms(10)).map(|_| ())
    });
    let bare = read_trace(bytes.as_slice()).unwrap();
    let leaf = bare.heaps[0].callstacks[0].frames.last().unwrap().clone();
    assert_eq!(leaf.function, None);
    let depth = bare.heaps[0].callstacks[0].frames.len();
    let line = |f: &str, n| Line {
        function_name: Some(f.into()),
        source_file_name: Some("lib.c".into()),
        line_number: Some(n),
    };
    let packet = TracePacket {
        data: Some(trace_packet::Data::ModuleSymbols(ModuleSymbols {
            path: leaf.mapping.clone(),
            build_id: Some(leaf.build_id.clone()),
            address_symbols: vec![AddressSymbols {
                address: Some(leaf.rel_pc),
                lines: vec![line("inner_fn", 5), line("outer_fn", 50)],
            }],
        })),
        ..Default::default()
    };
    // One more `Trace.packet` (field 1, length-delimited).
    let body = packet.encode_to_vec();
    bytes.push(0x0a);
    heapprofd_proto::perfetto::prost::encoding::encode_varint(body.len() as u64, &mut bytes);
    bytes.extend_from_slice(&body);

    let t = read_trace(bytes.as_slice()).unwrap();
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    let frames = &t.heaps[0].callstacks[0].frames;
    assert_eq!(frames.len(), depth + 1, "{frames:?}");
    let names: Vec<String> = frames[depth - 1..]
        .iter()
        .map(|f| f.display_name())
        .collect();
    assert_eq!(names, ["outer_fn", "inner_fn"]);
    let inner = &frames[depth];
    assert_eq!(
        (inner.source_file.as_deref(), inner.line, inner.rel_pc),
        (Some("lib.c"), Some(5), leaf.rel_pc)
    );
    assert_eq!(inner.mapping, leaf.mapping);
    // Frames of other addresses stay bare; the values do not change.
    assert!(frames[..depth - 1].iter().all(|f| f.function.is_none()));
    assert_eq!(t.heaps.len(), bare.heaps.len());
    for (a, b) in t.heaps.iter().zip(&bare.heaps) {
        let total = |h: &heapprofd_model::trace::HeapProfile| {
            h.callstacks.iter().map(|c| c.self_allocated).sum::<u64>()
        };
        assert_eq!(total(a), total(b));
    }
}

/// A dump asked for before a process's profiling started (the runtime can
/// learn of such a session while the dump waits for hand-overs) leaves the
/// process for the next dump: its first window never starts before the
/// session did.
#[test]
fn a_dump_asked_before_a_session_started_leaves_it_for_the_next() {
    let p = Program::new();
    let mut prof = Profile::new(&p.interner);
    let pr = prof.add_process(100, vec!["app".into()], true);
    pr.session_start_ns = at_ms(4);
    prof.set_heap(100, 0, Some("libc.malloc"), 1);
    prof.malloc(100, alloc(1, 0x10, 100, 100, 5), &p.stack_a());
    let mut w = TraceWriter::new(Vec::new(), CLOCKS).unwrap();
    let early = w.dump(&mut prof, &p.interner, at_ms(3)).unwrap();
    assert_eq!((early.heap_dumps, early.samples), (0, 0));
    let later = w.dump(&mut prof, &p.interner, at_ms(6)).unwrap();
    assert_eq!(later.heap_dumps, 1);
    let bytes = w.finish().unwrap();
    let t = read_trace(bytes.as_slice()).unwrap();
    let windows: Vec<(u64, u64)> = t.heaps[0]
        .timeline
        .iter()
        .map(|d| (d.start, d.timestamp))
        .collect();
    assert_eq!(windows, [(at_ms(4), at_ms(6))]);
}

/// Threads are written once (again only when renamed), and a thread the
/// profile forgot (it ended) is not written again: a program that keeps
/// starting threads does not have all of them rewritten at every dump.
#[test]
fn threads_are_written_once_and_forgotten_ones_stay_in_the_trace() {
    use heapprofd_proto::perfetto::{Trace, trace_packet};
    use prost::Message;
    let p = Program::new();
    let mut prof = Profile::new(&p.interner);
    let pr = prof.add_process(100, vec!["app".into()], true);
    pr.set_thread_name(100, "app".into());
    pr.set_thread_name(101, "w1".into());
    let mut w = TraceWriter::new(Vec::new(), CLOCKS).unwrap();
    w.dump(&mut prof, &p.interner, at_ms(1)).unwrap();
    let pr = prof.process_mut(100).unwrap();
    pr.set_thread_name(102, "w2".into());
    pr.forget_threads(|tid| tid != 101);
    w.dump(&mut prof, &p.interner, at_ms(2)).unwrap();
    // Nothing changed: no process tree at all.
    w.dump(&mut prof, &p.interner, at_ms(3)).unwrap();
    prof.process_mut(100)
        .unwrap()
        .set_thread_name(100, "renamed".into());
    w.dump(&mut prof, &p.interner, at_ms(4)).unwrap();
    let bytes = w.finish().unwrap();
    let written: Vec<Vec<(i32, String)>> = Trace::decode(bytes.as_slice())
        .unwrap()
        .packet
        .into_iter()
        .filter_map(|pk| match pk.data {
            Some(trace_packet::Data::ProcessTree(t)) => Some(
                t.threads
                    .into_iter()
                    .map(|th| (th.tid(), th.name().to_owned()))
                    .collect(),
            ),
            _ => None,
        })
        .collect();
    assert_eq!(
        written,
        [
            vec![(100, "app".to_owned()), (101, "w1".to_owned())],
            vec![(102, "w2".to_owned())],
            vec![(100, "renamed".to_owned())],
        ]
    );
    let t = read_trace(bytes.as_slice()).unwrap();
    let names = &t.processes[&100].threads;
    assert_eq!(names.get(&101).map(String::as_str), Some("w1"));
    assert_eq!(names.get(&102).map(String::as_str), Some("w2"));
    assert_eq!(names.get(&100).map(String::as_str), Some("renamed"));
}
