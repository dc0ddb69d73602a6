//! Trace writer and reader: synthetic profiles written as Perfetto traces,
//! checked with the OFFICIAL schema (`proto/tests/check_trace.py --strict`,
//! which needs `pip install perfetto`), with structural checks of our own
//! (interned before use and once only, indices, group ends, cumulative
//! values never decreasing), and read back with `trace::read_trace`.

mod core_support;

use std::collections::{HashMap, HashSet};
use std::io::Write;

use core_support::{
    CLOCKS, Program, Seq, at_ms, big_profile, check_trace, sample_profile, write_trace,
};
use heapprofd_model::profile::{Alloc, ClientError, Profile};
use heapprofd_model::trace::{CallstackValues, HeapProfile, TraceData, WriterConfig, read_trace};
use heapprofd_proto::perfetto::{Message, Trace, TracePacket, trace_packet};
use serde_json::Value;

fn official(bytes: &[u8]) -> Value {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    let (code, json) = check_trace(f.path());
    assert_eq!(json["unknown_fields"], Value::Array(vec![]), "{json:#}");
    assert_eq!(json["warnings"], Value::Array(vec![]), "{json:#}");
    assert_eq!(code, 0, "{json:#}");
    assert_eq!(json["ok"], true);
    json
}

/// Our own structural rules, on the decoded packets. Returns, per dump
/// group, the samples as (pid, heap, callstack) -> (allocated, freed,
/// alloc_count, free_count).
fn structure(bytes: &[u8]) -> Vec<HashMap<(u64, String, u64), [u64; 4]>> {
    let trace = Trace::decode(bytes).expect("decodes");
    let p0 = &trace.packet[0];
    assert_eq!(p0.sequence_flags, Some(1), "first packet clears state");
    assert!(matches!(
        p0.data,
        Some(trace_packet::Data::ClockSnapshot(_))
    ));
    let mut defined: HashMap<&str, HashSet<u64>> = HashMap::new();
    fn def_in(d: &mut HashMap<&str, HashSet<u64>>, table: &'static str, iid: u64) {
        let new = d.entry(table).or_default().insert(iid);
        assert!(new || iid == 0, "{table} {iid} interned twice");
    }
    let has = |d: &HashMap<&str, HashSet<u64>>, table: &str, iid: &u64| {
        d.get(table).is_some_and(|t| t.contains(iid))
    };
    let mut next_index = 0;
    let mut groups = Vec::new();
    let mut group = HashMap::new();
    let mut last: HashMap<(u64, String, u64), [u64; 4]> = HashMap::new();
    for (i, p) in trace.packet.iter().enumerate() {
        assert_eq!(p.trusted_packet_sequence_id(), Some(1), "packet {i}");
        if let Some(d) = &p.interned_data {
            for s in &d.function_names {
                def_in(&mut defined, "function_names", s.iid());
            }
            for s in &d.mapping_paths {
                def_in(&mut defined, "mapping_paths", s.iid());
            }
            for s in &d.build_ids {
                def_in(&mut defined, "build_ids", s.iid());
            }
            for s in &d.source_paths {
                def_in(&mut defined, "source_paths", s.iid());
            }
            // Within a packet, dependencies may be in the same packet.
            for m in &d.mappings {
                def_in(&mut defined, "mappings", m.iid());
            }
            for f in &d.frames {
                def_in(&mut defined, "frames", f.iid());
            }
            for c in &d.callstacks {
                def_in(&mut defined, "callstacks", c.iid());
            }
            for m in &d.mappings {
                for s in &m.path_string_ids {
                    assert!(has(&defined, "mapping_paths", s));
                }
                if m.build_id() != 0 {
                    assert!(has(&defined, "build_ids", &m.build_id()));
                }
            }
            for f in &d.frames {
                assert!(
                    has(&defined, "mappings", &f.mapping_id()),
                    "frame {}",
                    f.iid()
                );
                if f.function_name_id() != 0 {
                    assert!(has(&defined, "function_names", &f.function_name_id()));
                }
            }
            for c in &d.callstacks {
                assert!(!c.frame_ids.is_empty());
                for fid in &c.frame_ids {
                    assert!(has(&defined, "frames", fid), "callstack {}", c.iid());
                }
            }
        }
        if let Some(trace_packet::Data::ProfilePacket(pp)) = &p.data {
            assert_eq!(pp.index(), next_index, "packet {i}");
            next_index += 1;
            for d in &pp.process_dumps {
                for s in &d.samples {
                    assert!(
                        has(&defined, "callstacks", &s.callstack_id()),
                        "callstack {} used before it is interned",
                        s.callstack_id()
                    );
                    let key = (d.pid(), d.heap_name().to_owned(), s.callstack_id());
                    let v = [
                        s.self_allocated(),
                        s.self_freed(),
                        s.alloc_count(),
                        s.free_count(),
                    ];
                    if let Some(prev) = last.get(&key) {
                        for k in 0..4 {
                            assert!(v[k] >= prev[k], "{key:?} decreased: {prev:?} -> {v:?}");
                        }
                    }
                    last.insert(key.clone(), v);
                    assert!(group.insert(key, v).is_none(), "callstack twice in a dump");
                }
            }
            if !pp.continued() {
                assert!(
                    pp.process_dumps.is_empty(),
                    "a group ends with an empty packet"
                );
                groups.push(std::mem::take(&mut group));
            }
        }
    }
    assert!(group.is_empty(), "unterminated group");
    groups
}

fn heap<'a>(t: &'a TraceData, pid: u32, name: &str) -> &'a HeapProfile {
    t.heaps
        .iter()
        .find(|h| h.pid == pid && h.heap_name == name)
        .unwrap_or_else(|| panic!("no heap {pid}/{name} in {t:#?}"))
}

fn by_leaf<'a>(h: &'a HeapProfile, leaf: &str) -> &'a CallstackValues {
    h.callstacks
        .iter()
        .find(|c| c.frames.last().and_then(|f| f.function.as_deref()) == Some(leaf))
        .unwrap_or_else(|| panic!("no stack ending in {leaf}"))
}

#[test]
fn sample_trace_passes_the_official_schema() {
    let p = Program::new();
    let mut prof = sample_profile(&p);
    let bytes = write_trace(WriterConfig::default(), |w| {
        w.dump(&mut prof, &p.interner, at_ms(10)).map(|_| ())
    });
    structure(&bytes);
    let json = official(&bytes);
    let s = &json["summary"];
    assert_eq!(s["sequences"]["1"]["incremental_state_cleared"], 1);
    // 3 heap groups: each a samples packet and the empty end packet.
    assert_eq!(s["sequences"]["1"]["profile_packets"], 6);
    let clocks = &s["clock_snapshots"][0]["clocks"];
    assert_eq!(clocks["4"], CLOCKS.monotonic_coarse_ns);
    assert_eq!(clocks["6"], CLOCKS.boottime_ns);
    assert_eq!(clocks["1"], CLOCKS.realtime_ns);
    let procs = s["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    assert_eq!(procs[0]["cmdline"], serde_json::json!(["app", "--flag"]));
    let dumps = s["heap_dumps"].as_array().unwrap();
    assert_eq!(dumps.len(), 3);
    let d = |pid: u64, name: &str| {
        dumps
            .iter()
            .find(|d| d["pid"] == pid && d["heap_name"] == name)
            .unwrap()
    };
    let a = d(100, "libc.malloc");
    assert_eq!(a["self_allocated"], 300 + 2000 + 7);
    assert_eq!(a["self_freed"], 100 + 2000);
    assert_eq!(a["alloc_count"], 6);
    assert_eq!(a["free_count"], 3);
    assert_eq!(a["from_startup"], true);
    assert_eq!(a["sampling_interval_bytes"], 1);
    assert_eq!(a["orig_sampling_interval_bytes"], 1);
    assert_eq!(a["timestamp"], at_ms(10));
    assert_eq!(a["start_timestamp"], at_ms(1));
    assert_eq!(a["buffer_overran"], false);
    assert_eq!(a["packet_timestamp"], CLOCKS.boottime_ns + 10_000_000);
    let c = d(100, "custom");
    assert_eq!(
        (c["self_allocated"].as_u64(), c["free_count"].as_u64()),
        (Some(64), Some(0))
    );
    let o = d(200, "libc.malloc");
    assert_eq!(o["self_allocated"], 50);
    assert_eq!(o["self_freed"], 40);
    assert_eq!(o["buffer_overran"], true);
    assert_eq!(o["from_startup"], false);
    assert_eq!(o["stats"]["heap_samples"], 2);
    assert_eq!(o["stats"]["unwinding_errors"], 1);
    assert_eq!(o["stats"]["map_reparses"], 2);
    assert_eq!(o["stats"]["total_unwinding_time_us"], 253);
    let hist = o["stats"]["unwinding_time_us"].as_array().unwrap();
    assert_eq!(hist.len(), 20);
    assert_eq!(hist[19]["max_bucket"], true);
    assert_eq!(hist[8]["count"], 1); // 128 < 250 <= 256
    // Frames resolve through the official schema, outermost first.
    let samples = s["heap_samples"].as_array().unwrap();
    let err = samples
        .iter()
        .find(|x| x["pid"] == 100 && x["self_allocated"] == 7)
        .unwrap();
    let names: Vec<&str> = err["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["function"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["main", "ERROR MEMORY_INVALID"]);
    let b = samples
        .iter()
        .find(|x| x["pid"] == 100 && x["self_allocated"] == 2000)
        .unwrap();
    let f0 = &b["frames"][0];
    assert_eq!(f0["function"], "__libc_start_main");
    assert_eq!(f0["mapping"], "/lib/x86_64-linux-gnu/libc.so.6");
    let f3 = &b["frames"][3];
    assert_eq!(f3["function"], "alloc_b");
    assert_eq!(f3["mapping"], "/usr/bin/app");
    assert_eq!(f3["build_id"], "deadbeef");
    assert_eq!(f3["rel_pc"], 0x1400);
}

#[test]
fn reader_round_trip_equals_the_profile() {
    let p = Program::new();
    let mut prof = sample_profile(&p);
    let bytes = write_trace(WriterConfig::default(), |w| {
        w.dump(&mut prof, &p.interner, at_ms(10)).map(|_| ())
    });
    let t = read_trace(bytes.as_slice()).unwrap();
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert_eq!(t.processes[&100].cmdline, ["app", "--flag"]);
    assert_eq!(t.heaps.len(), 3);
    for h in &t.heaps {
        let ph = prof
            .process(h.pid)
            .unwrap()
            .heaps()
            .find(|x| x.name == h.heap_name)
            .unwrap();
        assert_eq!(h.callstacks.len(), ph.callsites().len());
        for c in ph.callsites() {
            let mut ids = Vec::new();
            prof.tree().stack(c.callsite, &mut ids);
            let names: Vec<String> = ids
                .iter()
                .map(|&f| p.interner.read().function_name(f).unwrap())
                .collect();
            let got = h
                .callstacks
                .iter()
                .find(|v| {
                    v.frames
                        .iter()
                        .map(|f| f.function.clone().unwrap())
                        .collect::<Vec<_>>()
                        == names
                })
                .unwrap();
            assert_eq!(
                (
                    got.self_allocated,
                    got.self_freed,
                    got.alloc_count,
                    got.free_count
                ),
                (c.allocated, c.freed, c.alloc_count, c.free_count)
            );
        }
    }
    let h = heap(&t, 100, "libc.malloc");
    assert_eq!(h.timestamp, Some(at_ms(10)));
    assert!(h.flags == Default::default());
    let a = by_leaf(h, "alloc_a");
    assert_eq!(a.frames[1].source_file.as_deref(), Some("app.c"));
    assert_eq!(a.frames[1].line, Some(10));
    assert_eq!(a.frames[2].build_id, [0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(a.unreleased(), 200);
    assert!(heap(&t, 200, "libc.malloc").flags.buffer_overran);
    assert_eq!(
        heap(&t, 200, "libc.malloc")
            .stats
            .as_ref()
            .unwrap()
            .heap_samples,
        2
    );
}

#[test]
fn continuous_dumps_are_cumulative_and_leave_idle_callsites_out() {
    let p = Program::new();
    let mut prof = sample_profile(&p);
    let mut seq = Seq::default();
    // sample_profile used sequence numbers 1..=10 of pid 100.
    for _ in 0..10 {
        seq.next(100);
    }
    let bytes = write_trace(WriterConfig::default(), |w| {
        w.dump(&mut prof, &p.interner, at_ms(10))?;
        // More work: stack_b allocates again and frees; a process appears.
        let s = seq.next(100);
        prof.malloc(
            100,
            Alloc {
                heap: 0,
                seq: s,
                address: 0x9000,
                sample_size: 1000,
                size: 1000,
                tid: 1,
                timestamp_ns: at_ms(11),
            },
            &p.stack_b(),
        );
        let s = seq.next(100);
        prof.free(100, 0, s, 0x9000);
        prof.add_process(300, vec!["late".into()], true);
        prof.set_heap(300, 0, None, 4096);
        prof.malloc(
            300,
            Alloc {
                heap: 0,
                seq: 1,
                address: 0x10,
                sample_size: 4096,
                size: 4096,
                tid: 1,
                timestamp_ns: at_ms(12),
            },
            &p.stack_a(),
        );
        prof.process_mut(100).unwrap().flags.disconnected = true;
        prof.process_mut(100).unwrap().flags.client_error = ClientError::HitTimeout;
        w.dump(&mut prof, &p.interner, at_ms(20))?;
        w.dump(&mut prof, &p.interner, at_ms(30))?;
        Ok(())
    });
    let groups = structure(&bytes);
    // 3 dumps: 3, 4 and 4 heap groups.
    assert_eq!(groups.len(), 11);
    let json = official(&bytes);
    let s = &json["summary"];
    assert_eq!(s["processes"].as_array().unwrap().len(), 3);
    let dumps = s["heap_dumps"].as_array().unwrap();
    let last_main = dumps
        .iter()
        .rfind(|d| d["pid"] == 100 && d["heap_name"] == "libc.malloc")
        .unwrap();
    assert_eq!(last_main["disconnected"], true);
    assert_eq!(last_main["client_error"], "CLIENT_ERROR_HIT_TIMEOUT");
    assert_eq!(last_main["start_timestamp"], at_ms(20));
    assert_eq!(last_main["timestamp"], at_ms(30));
    // Dump 3: stack_b of pid 100 is dead and unchanged since dump 2, so it
    // is left out; stack_a and stack_err are live and stay.
    assert_eq!(last_main["num_samples"], 2);
    let t = read_trace(bytes.as_slice()).unwrap();
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    let h = heap(&t, 100, "libc.malloc");
    assert_eq!(h.dumps, 3);
    assert_eq!(h.start_timestamp, Some(at_ms(1)));
    let b = by_leaf(h, "alloc_b");
    assert_eq!(
        (b.self_allocated, b.self_freed, b.alloc_count),
        (3000, 3000, 3)
    );
    assert!(h.flags.disconnected);
    assert_eq!(h.flags.client_error, ClientError::HitTimeout);
    let late = heap(&t, 300, "libc.malloc");
    assert_eq!(late.sampling_interval_bytes, 4096);
    assert_eq!(by_leaf(late, "alloc_a").self_allocated, 4096);
}

#[test]
fn a_huge_dump_is_split_into_continued_packets() {
    let p = Program::new();
    let n = 40_000;
    let mut prof = big_profile(&p, n);
    let bytes = write_trace(WriterConfig::default(), |w| {
        w.dump(&mut prof, &p.interner, at_ms(5)).map(|_| ())
    });
    let groups = structure(&bytes);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].len() as u64, n);
    let trace = Trace::decode(bytes.as_slice()).unwrap();
    let pps: Vec<_> = trace
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(trace_packet::Data::ProfilePacket(pp)) => Some(pp),
            _ => None,
        })
        .collect();
    assert!(pps.len() >= 3, "split into several packets: {}", pps.len());
    for pp in &pps[..pps.len() - 1] {
        assert!(pp.continued());
        assert!(pp.encoded_len() < 420_000);
        assert_eq!(pp.process_dumps[0].heap_name(), "libc.malloc");
    }
    for p in &trace.packet {
        assert!(
            p.encoded_len() < 420_000,
            "packet of {} bytes",
            p.encoded_len()
        );
    }
    let json = official(&bytes);
    let dumps = json["summary"]["heap_dumps"].as_array().unwrap();
    let total: u64 = dumps
        .iter()
        .map(|d| d["alloc_count"].as_u64().unwrap())
        .sum();
    assert_eq!(total, n);
    let t = read_trace(bytes.as_slice()).unwrap();
    let h = heap(&t, 7, "libc.malloc");
    assert_eq!(h.dumps, 1, "continued packets are one dump");
    assert_eq!(h.callstacks.len() as u64, n);
    assert_eq!(
        h.callstacks.iter().map(|c| c.self_allocated).sum::<u64>(),
        n * 4096
    );
}

#[test]
fn small_packet_threshold_splits_interned_data_too() {
    let p = Program::new();
    let mut prof = big_profile(&p, 300);
    let cfg = WriterConfig {
        packet_size_threshold: 500,
        ..Default::default()
    };
    let bytes = write_trace(cfg, |w| {
        w.dump(&mut prof, &p.interner, at_ms(5))?;
        w.dump(&mut prof, &p.interner, at_ms(6)).map(|_| ())
    });
    let groups = structure(&bytes);
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[1].len(), 300);
    official(&bytes);
    let t = read_trace(bytes.as_slice()).unwrap();
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert_eq!(heap(&t, 7, "libc.malloc").callstacks.len(), 300);
}

#[test]
fn dump_at_max_writes_the_peak() {
    let p = Program::new();
    let mut prof = Profile::new(&p.interner);
    prof.add_process(5, vec!["peaky".into()], true);
    prof.set_heap(5, 0, None, 1);
    prof.malloc(
        5,
        Alloc {
            heap: 0,
            seq: 1,
            address: 0x10,
            sample_size: 100,
            size: 100,
            tid: 1,
            timestamp_ns: at_ms(1),
        },
        &p.stack_a(),
    );
    prof.malloc(
        5,
        Alloc {
            heap: 0,
            seq: 2,
            address: 0x20,
            sample_size: 200,
            size: 200,
            tid: 1,
            timestamp_ns: at_ms(2),
        },
        &p.stack_b(),
    ); // peak 300
    prof.free(5, 0, 3, 0x10);
    prof.free(5, 0, 4, 0x20);
    prof.malloc(
        5,
        Alloc {
            heap: 0,
            seq: 5,
            address: 0x30,
            sample_size: 50,
            size: 50,
            tid: 1,
            timestamp_ns: at_ms(3),
        },
        &p.stack_err(),
    );
    prof.malloc(
        5,
        Alloc {
            heap: 0,
            seq: 6,
            address: 0x40,
            sample_size: 60,
            size: 60,
            tid: 1,
            timestamp_ns: at_ms(4),
        },
        &p.stack_err(),
    );
    let cfg = WriterConfig {
        dump_at_max: true,
        ..Default::default()
    };
    let bytes = write_trace(cfg, |w| {
        w.dump(&mut prof, &p.interner, at_ms(9)).map(|_| ())
    });
    let json = official(&bytes);
    let d = &json["summary"]["heap_dumps"][0];
    assert_eq!(d["self_max"], 300);
    assert_eq!(d["self_max_count"], 2);
    assert_eq!(d["timestamp"], at_ms(2), "the time of the peak");
    assert_eq!(d["orig_sampling_interval_bytes"], 1);
    assert_eq!(d["num_samples"], 2, "stack_err was not live at the peak");
    let t = read_trace(bytes.as_slice()).unwrap();
    let h = heap(&t, 5, "libc.malloc");
    assert!(h.dump_at_max);
    assert_eq!(by_leaf(h, "alloc_b").self_max, 200);
    assert_eq!(by_leaf(h, "alloc_a").self_max_count, 1);
}

#[test]
fn the_reader_takes_heapprofd_layouts() {
    use heapprofd_proto::perfetto::{
        Callstack, Frame, InternedData, InternedString, Mapping, ProfilePacket, profile_packet,
    };
    let mut packets = Vec::new();
    let mut pkt = |data: Option<trace_packet::Data>, interned: Option<InternedData>, flags| {
        let mut p = TracePacket {
            data,
            interned_data: interned,
            sequence_flags: flags,
            ..Default::default()
        };
        p.set_trusted_packet_sequence_id(9);
        packets.push(p);
    };
    pkt(None, None, Some(1));
    let sample = |cs, a| profile_packet::HeapSample {
        callstack_id: Some(cs),
        self_allocated: Some(a),
        self_freed: Some(0),
        alloc_count: Some(1),
        free_count: Some(0),
        ..Default::default()
    };
    let dump = |samples| profile_packet::ProcessHeapSamples {
        pid: Some(42),
        samples,
        ..Default::default()
    };
    // Group 1: samples first, interned data after (heapprofd's order), a
    // heap without a name.
    pkt(
        Some(trace_packet::Data::ProfilePacket(ProfilePacket {
            process_dumps: vec![dump(vec![sample(2, 10)])],
            continued: Some(true),
            index: Some(0),
            ..Default::default()
        })),
        None,
        None,
    );
    pkt(
        None,
        Some(InternedData {
            function_names: vec![InternedString::new(1, "leaf")],
            mapping_paths: vec![
                InternedString::new(1, "system"),
                InternedString::new(2, "lib.so"),
            ],
            mappings: vec![Mapping {
                iid: Some(1),
                path_string_ids: vec![1, 2],
                ..Default::default()
            }],
            frames: vec![Frame {
                iid: Some(1),
                function_name_id: Some(1),
                mapping_id: Some(1),
                rel_pc: Some(0x10),
                ..Default::default()
            }],
            callstacks: vec![Callstack {
                iid: Some(2),
                frame_ids: vec![1],
            }],
            ..Default::default()
        }),
        None,
    );
    pkt(
        Some(trace_packet::Data::ProfilePacket(ProfilePacket {
            index: Some(1),
            ..Default::default()
        })),
        None,
        None,
    );
    // Group 2 (Android Q): tables inside the ProfilePacket.
    pkt(
        Some(trace_packet::Data::ProfilePacket(ProfilePacket {
            strings: vec![
                InternedString::new(7, "qfunc"),
                InternedString::new(8, "q.so"),
            ],
            mappings: vec![Mapping {
                iid: Some(3),
                path_string_ids: vec![8],
                ..Default::default()
            }],
            frames: vec![Frame {
                iid: Some(4),
                function_name_id: Some(7),
                mapping_id: Some(3),
                ..Default::default()
            }],
            callstacks: vec![Callstack {
                iid: Some(5),
                frame_ids: vec![1, 4],
            }],
            process_dumps: vec![dump(vec![sample(5, 30), sample(2, 20)])],
            index: Some(2),
            ..Default::default()
        })),
        None,
        None,
    );
    let bytes = Trace { packet: packets }.encode_to_vec();
    let t = read_trace(bytes.as_slice()).unwrap();
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    let h = heap(&t, 42, "unknown");
    assert_eq!(h.dumps, 2);
    let leaf = by_leaf(h, "leaf");
    assert_eq!(leaf.self_allocated, 20, "latest value");
    assert_eq!(leaf.frames[0].mapping.as_deref(), Some("/system/lib.so"));
    assert_eq!(leaf.frames[0].rel_pc, 0x10);
    let q = by_leaf(h, "qfunc");
    assert_eq!(q.self_allocated, 30);
    assert_eq!(q.frames.len(), 2);
    assert_eq!(q.frames[1].mapping.as_deref(), Some("/q.so"));
}

#[test]
fn without_symbolize_frames_are_bare_but_error_frames_keep_their_names() {
    let p = Program::new();
    // An inline chain for `main`: written in its place only with symbols.
    let inlined = p
        .interner
        .intern_frame(None, 0x1100, Some("inlined_helper"), None, None);
    p.interner
        .set_expansion(p.main, vec![inlined, p.main].into());
    let mut prof = sample_profile(&p);
    let cfg = WriterConfig {
        symbolize: false,
        ..Default::default()
    };
    let bytes = write_trace(cfg, |w| {
        w.dump(&mut prof, &p.interner, at_ms(10)).map(|_| ())
    });
    official(&bytes);
    let t = read_trace(bytes.as_slice()).unwrap();
    let h = heap(&t, 100, "libc.malloc");
    let frames: Vec<_> = h.callstacks.iter().flat_map(|c| &c.frames).collect();
    assert!(!frames.is_empty());
    for f in &frames {
        let error = f
            .function
            .as_deref()
            .is_some_and(|n| n.starts_with("ERROR "));
        assert!(
            error || (f.function.is_none() && f.source_file.is_none() && f.line.is_none()),
            "a named frame without symbols: {f:?}"
        );
    }
    // Bare frames keep what symbolizing later needs.
    assert!(
        frames
            .iter()
            .any(|f| f.build_id == [0xde, 0xad, 0xbe, 0xef] && f.rel_pc == 0x1300)
    );
    assert!(
        frames
            .iter()
            .any(|f| f.function.as_deref() == Some("ERROR MEMORY_INVALID"))
    );
    // The same profile with symbols (the default): names, and the chain.
    let bytes = write_trace(WriterConfig::default(), |w| {
        w.dump(&mut prof, &p.interner, at_ms(20)).map(|_| ())
    });
    let t = read_trace(bytes.as_slice()).unwrap();
    let names: Vec<_> = heap(&t, 100, "libc.malloc")
        .callstacks
        .iter()
        .flat_map(|c| &c.frames)
        .filter_map(|f| f.function.clone())
        .collect();
    assert!(names.iter().any(|n| n == "alloc_a") && names.iter().any(|n| n == "inlined_helper"));
}
