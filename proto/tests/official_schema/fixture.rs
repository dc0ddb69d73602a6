//! A realistic trace: what the daemon writes for one process (heap
//! sequence with interning and a two-packet profile, a perf sample
//! sequence, clock snapshot, process tree, module symbols).

use heapprofd_proto::perfetto::{
    self, AddressSymbols, BuiltinClock, Callstack, ClockSnapshot, Frame, InternedData,
    InternedString, Line, Mapping, ModuleSymbols, PerfSample, PerfSampleDefaults, ProcessTree,
    ProfilePacket, TracePacket, TracePacketDefaults, clock, clock_snapshot, frame, perf_events,
    perf_sample, process_tree, profile_packet, profiling, trace_packet,
};

pub(crate) const PID: i32 = 4242;
pub(crate) const HEAP_SEQ: u32 = 1;
pub(crate) const PERF_SEQ: u32 = 2;
pub(crate) const BOOT_NS: u64 = 5_000_000_000;
pub(crate) const COARSE_NS: u64 = 4_000_000_000;
/// Raw build id bytes, deliberately not UTF-8.
pub(crate) const BUILD_ID: [u8; 20] = [
    0xde, 0xad, 0xbe, 0xef, 0xff, 0xfe, 0x00, 0x80, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
    0x09, 0x0a, 0x0b, 0x0c,
];
pub(crate) const LIBDEMO_REL_PC: u64 = 0x1234;

pub(crate) fn packet(seq: u32, ts: u64) -> TracePacket {
    let mut p = TracePacket {
        timestamp: Some(ts),
        ..Default::default()
    };
    p.set_trusted_packet_sequence_id(seq);
    p
}

pub(crate) fn mapping(iid: u64, build_id: u64, path: &[u64], start: u64) -> Mapping {
    Mapping {
        iid: Some(iid),
        build_id: Some(build_id),
        start_offset: Some(0),
        start: Some(start),
        end: Some(start + 0x10000),
        load_bias: Some(0),
        path_string_ids: path.to_vec(),
        exact_offset: Some(0x1000),
    }
}

pub(crate) fn native_frame(iid: u64, function: u64, mapping: u64, rel_pc: u64) -> Frame {
    let mut f = Frame {
        iid: Some(iid),
        function_name_id: Some(function),
        mapping_id: Some(mapping),
        rel_pc: Some(rel_pc),
        ..Default::default()
    };
    f.set_kind(frame::Kind::Native);
    f
}

/// The interned callstacks of the heap sequence: 2 = main -> malloc,
/// 3 = main -> (unsymbolized libdemo frame) -> malloc.
pub(crate) fn heap_interned_data() -> InternedData {
    InternedData {
        function_names: vec![
            InternedString::new(1, "main"),
            InternedString::new(2, "malloc"),
        ],
        build_ids: vec![InternedString::new(1, BUILD_ID.to_vec())],
        mapping_paths: vec![
            InternedString::new(1, "usr"),
            InternedString::new(2, "bin"),
            InternedString::new(3, "demo"),
            InternedString::new(4, "lib"),
            InternedString::new(5, "libdemo.so"),
        ],
        source_paths: vec![InternedString::new(1, "demo.c")],
        mappings: vec![
            mapping(1, 0, &[1, 2, 3], 0x5555_0000_0000),
            mapping(2, 1, &[1, 4, 5], 0x7fff_0000_0000),
        ],
        frames: vec![
            Frame {
                source_path_iid: Some(1),
                line_number: Some(12),
                ..native_frame(1, 1, 1, 0x100)
            },
            native_frame(2, 2, 2, 0x2000),
            Frame {
                kind_field: Some(frame::KindField::KindStr("custom".to_owned())),
                ..native_frame(3, 0, 2, LIBDEMO_REL_PC)
            },
        ],
        callstacks: vec![
            Callstack {
                iid: Some(2),
                frame_ids: vec![1, 2],
            },
            Callstack {
                iid: Some(3),
                frame_ids: vec![1, 3, 2],
            },
        ],
    }
}

pub(crate) fn heap_sample(
    callstack: u64,
    allocated: u64,
    freed: u64,
) -> profile_packet::HeapSample {
    profile_packet::HeapSample {
        callstack_id: Some(callstack),
        self_allocated: Some(allocated),
        self_freed: Some(freed),
        alloc_count: Some(allocated / 4096),
        free_count: Some(freed / 4096),
        ..Default::default()
    }
}

pub(crate) fn realistic_trace() -> Vec<TracePacket> {
    let mut packets = Vec::new();

    // The heap sequence starts with cleared incremental state, its defaults
    // and the fixed internings (iid 0 = empty) heapprofd emits.
    let mut first = packet(HEAP_SEQ, BOOT_NS);
    first.first_packet_on_sequence = Some(true);
    first.sequence_flags = Some(perfetto::SEQ_INCREMENTAL_STATE_CLEARED);
    first.trace_packet_defaults = Some(TracePacketDefaults {
        timestamp_clock_id: Some(clock::BOOTTIME),
        perf_sample_defaults: None,
    });
    first.interned_data = Some(InternedData {
        build_ids: vec![InternedString::new(0, "")],
        mapping_paths: vec![InternedString::new(0, "")],
        function_names: vec![InternedString::new(0, "")],
        ..Default::default()
    });
    packets.push(first);

    let mut snapshot = packet(HEAP_SEQ, BOOT_NS);
    snapshot.data = Some(trace_packet::Data::ClockSnapshot(ClockSnapshot {
        clocks: vec![
            clock_snapshot::Clock {
                clock_id: Some(clock::BOOTTIME),
                timestamp: Some(BOOT_NS),
                ..Default::default()
            },
            clock_snapshot::Clock {
                clock_id: Some(clock::MONOTONIC_COARSE),
                timestamp: Some(COARSE_NS),
                ..Default::default()
            },
            clock_snapshot::Clock {
                clock_id: Some(clock::REALTIME),
                timestamp: Some(1_700_000_000_000_000_000),
                is_incremental: Some(false),
                unit_multiplier_ns: Some(1),
            },
        ],
        primary_trace_clock: Some(BuiltinClock::Boottime as i32),
    }));
    packets.push(snapshot);

    let mut tree = packet(HEAP_SEQ, BOOT_NS + 1);
    tree.data = Some(trace_packet::Data::ProcessTree(ProcessTree {
        processes: vec![process_tree::Process {
            pid: Some(PID),
            ppid: Some(1),
            cmdline: vec!["/usr/bin/demo".to_owned(), "--alloc".to_owned()],
            uid: Some(1000),
            nspid: vec![7],
            process_start_from_boot: Some(12345),
            is_kthread: Some(false),
            cmdline_is_comm: Some(false),
        }],
        threads: vec![process_tree::Thread {
            tid: Some(PID + 1),
            name: Some("worker".to_owned()),
            tgid: Some(PID),
            nstid: vec![8],
        }],
        collection_end_timestamp: Some(BOOT_NS + 2),
    }));
    packets.push(tree);

    // A dump split like heapprofd does: samples (continued), then the
    // interned callstacks, then an empty terminating ProfilePacket.
    let mut dump = packet(HEAP_SEQ, BOOT_NS + 1_000_000);
    dump.data = Some(trace_packet::Data::ProfilePacket(ProfilePacket {
        index: Some(0),
        continued: Some(true),
        process_dumps: vec![profile_packet::ProcessHeapSamples {
            pid: Some(PID as u64),
            heap_name: Some("libc.malloc".to_owned()),
            samples: vec![heap_sample(2, 8192, 4096), heap_sample(3, 40960, 0)],
            from_startup: Some(true),
            rejected_concurrent: Some(false),
            disconnected: Some(false),
            buffer_overran: Some(false),
            buffer_corrupted: Some(false),
            hit_guardrail: Some(false),
            timestamp: Some(COARSE_NS + 1_000_000),
            start_timestamp: Some(COARSE_NS),
            sampling_interval_bytes: Some(4096),
            orig_sampling_interval_bytes: Some(4096),
            client_error: Some(profile_packet::process_heap_samples::ClientError::None as i32),
            stats: Some(profile_packet::ProcessStats {
                unwinding_errors: Some(1),
                heap_samples: Some(12),
                map_reparses: Some(2),
                total_unwinding_time_us: Some(345),
                client_spinlock_blocked_us: Some(6),
                unwinding_time_us: Some(profile_packet::Histogram {
                    buckets: vec![
                        profile_packet::histogram::Bucket {
                            upper_limit: Some(1),
                            max_bucket: None,
                            count: Some(10),
                        },
                        profile_packet::histogram::Bucket {
                            upper_limit: None,
                            max_bucket: Some(true),
                            count: Some(2),
                        },
                    ],
                }),
            }),
        }],
        ..Default::default()
    }));
    packets.push(dump);

    let mut interned = packet(HEAP_SEQ, BOOT_NS + 1_000_001);
    interned.interned_data = Some(heap_interned_data());
    packets.push(interned);

    let mut end = packet(HEAP_SEQ, BOOT_NS + 1_000_002);
    end.data = Some(trace_packet::Data::ProfilePacket(ProfilePacket {
        index: Some(1),
        ..Default::default()
    }));
    packets.push(end);

    // A CPU sample on its own sequence, traced_perf style.
    let mut perf_defaults = packet(PERF_SEQ, BOOT_NS + 2_000_000);
    perf_defaults.sequence_flags = Some(perfetto::SEQ_INCREMENTAL_STATE_CLEARED);
    perf_defaults.timestamp_clock_id = Some(clock::BOOTTIME);
    perf_defaults.trace_packet_defaults = Some(TracePacketDefaults {
        timestamp_clock_id: Some(clock::BOOTTIME),
        perf_sample_defaults: Some(PerfSampleDefaults {
            timebase: Some(perf_events::Timebase {
                interval: Some(perf_events::timebase::Interval::Frequency(100)),
                event: Some(perf_events::timebase::Event::Counter(
                    perf_events::Counter::SwCpuClock as i32,
                )),
                name: Some("cpu-clock".to_owned()),
                timestamp_clock: Some(perf_events::PerfClock::Boottime as i32),
            }),
            process_shard_count: None,
            chosen_process_shard: None,
        }),
    });
    perf_defaults.interned_data = Some(InternedData {
        function_names: vec![InternedString::new(1, "spin")],
        mapping_paths: vec![InternedString::new(1, "demo")],
        mappings: vec![mapping(1, 0, &[1], 0x1000)],
        frames: vec![native_frame(1, 1, 1, 0x42)],
        callstacks: vec![Callstack {
            iid: Some(1),
            frame_ids: vec![1],
        }],
        ..Default::default()
    });
    packets.push(perf_defaults);

    let mut sample = packet(PERF_SEQ, BOOT_NS + 2_000_001);
    sample.sequence_flags = Some(perfetto::SEQ_NEEDS_INCREMENTAL_STATE);
    let mut perf = PerfSample {
        cpu: Some(3),
        pid: Some(PID as u32),
        tid: Some(PID as u32 + 1),
        callstack_iid: Some(1),
        cpu_mode: Some(profiling::CpuMode::ModeUser as i32),
        timebase_count: Some(10_000_000),
        follower_counts: vec![1, 2],
        ..Default::default()
    };
    perf.set_unwind_error(profiling::StackUnwindError::UnwindErrorNone);
    perf.set_sample_skipped_reason(perf_sample::SampleSkipReason::ProfilerSkipNotInScope);
    sample.data = Some(trace_packet::Data::PerfSample(perf));
    packets.push(sample);

    // Offline symbols for the unsymbolized libdemo frame (two inlined lines).
    let mut symbols = packet(HEAP_SEQ, BOOT_NS + 3_000_000);
    symbols.data = Some(trace_packet::Data::ModuleSymbols(ModuleSymbols {
        path: Some("/usr/lib/libdemo.so".to_owned()),
        build_id: Some(BUILD_ID.to_vec()),
        address_symbols: vec![AddressSymbols {
            address: Some(LIBDEMO_REL_PC),
            lines: vec![
                Line {
                    function_name: Some("inlined_helper".to_owned()),
                    source_file_name: Some("demo.c".to_owned()),
                    line_number: Some(7),
                },
                Line {
                    function_name: Some("demo_alloc".to_owned()),
                    source_file_name: Some("demo.c".to_owned()),
                    line_number: Some(30),
                },
            ],
        }],
    }));
    packets.push(symbols);

    packets
}

pub(crate) fn streamed(packets: &[TracePacket]) -> Vec<u8> {
    let mut buf = Vec::new();
    for p in packets {
        perfetto::write_trace_packet(&mut buf, p).expect("write to Vec");
    }
    buf
}
