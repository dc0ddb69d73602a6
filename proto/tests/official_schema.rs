//! Round-trips traces written with our prost types through the OFFICIAL
//! Perfetto schema (the `perfetto` Python package, `pip install perfetto`).
//!
//! `tests/check_trace.py` parses a trace with the official `Trace` message,
//! reports every field the official schema does not know, at any depth, and
//! prints a JSON summary that these tests assert on. It also compares our
//! `FILE_DESCRIPTOR_SET` with the official descriptors field by field.
//!
//! Missing `python3` or `perfetto` fails the tests (no silent skip).

#![cfg(feature = "perfetto")]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use heapprofd_proto::perfetto::{
    self, AddressSymbols, BuiltinClock, Callstack, ClockSnapshot, Frame, InternedData,
    InternedString, Line, Mapping, ModuleSymbols, PerfSample, PerfSampleDefaults, ProcessTree,
    ProfilePacket, TracePacket, TracePacketDefaults, clock, clock_snapshot, frame, perf_events,
    perf_sample, process_tree, profile_packet, profiling, trace_packet,
};
use prost::encoding::{WireType, encode_key, encode_varint};
use serde_json::Value;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/check_trace.py");

/// What a run of check_trace.py produced.
struct Run {
    code: i32,
    json: Value,
    stderr: String,
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// Runs check_trace.py with `args`; panics with install instructions if
/// python3 or the perfetto package is missing.
fn run_script_env(args: &[&str], pythonpath: Option<&Path>) -> Run {
    let mut cmd = Command::new(python());
    cmd.arg(SCRIPT).args(args);
    if let Some(dir) = pythonpath {
        cmd.env("PYTHONPATH", dir);
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run `{}` ({e}): these tests need python3 with the official \
             Perfetto protos: pip install perfetto",
            python()
        )
    });
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code().unwrap_or(-1);
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    Run { code, json, stderr }
}

fn run_script(args: &[&str]) -> Run {
    let run = run_script_env(args, None);
    assert_ne!(
        run.code, 3,
        "check_trace.py could not load the official Perfetto protos; \
         pip install perfetto\n{}",
        run.stderr
    );
    assert!(
        run.json.is_object(),
        "check_trace.py printed no JSON (exit {}):\n{}",
        run.code,
        run.stderr
    );
    run
}

fn write_temp(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(bytes).expect("write temp file");
    f.flush().expect("flush temp file");
    f
}

fn path_arg(f: &tempfile::NamedTempFile) -> String {
    f.path().to_str().expect("utf-8 temp path").to_owned()
}

// ---------------------------------------------------------------------------
// A realistic trace.
// ---------------------------------------------------------------------------

const PID: i32 = 4242;
const HEAP_SEQ: u32 = 1;
const PERF_SEQ: u32 = 2;
const BOOT_NS: u64 = 5_000_000_000;
const COARSE_NS: u64 = 4_000_000_000;
/// Raw build id bytes, deliberately not UTF-8.
const BUILD_ID: [u8; 20] = [
    0xde, 0xad, 0xbe, 0xef, 0xff, 0xfe, 0x00, 0x80, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
    0x09, 0x0a, 0x0b, 0x0c,
];
const LIBDEMO_REL_PC: u64 = 0x1234;

fn packet(seq: u32, ts: u64) -> TracePacket {
    let mut p = TracePacket {
        timestamp: Some(ts),
        ..Default::default()
    };
    p.set_trusted_packet_sequence_id(seq);
    p
}

fn mapping(iid: u64, build_id: u64, path: &[u64], start: u64) -> Mapping {
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

fn native_frame(iid: u64, function: u64, mapping: u64, rel_pc: u64) -> Frame {
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
fn heap_interned_data() -> InternedData {
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

fn heap_sample(callstack: u64, allocated: u64, freed: u64) -> profile_packet::HeapSample {
    profile_packet::HeapSample {
        callstack_id: Some(callstack),
        self_allocated: Some(allocated),
        self_freed: Some(freed),
        alloc_count: Some(allocated / 4096),
        free_count: Some(freed / 4096),
        ..Default::default()
    }
}

fn realistic_trace() -> Vec<TracePacket> {
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

fn streamed(packets: &[TracePacket]) -> Vec<u8> {
    let mut buf = Vec::new();
    for p in packets {
        perfetto::write_trace_packet(&mut buf, p).expect("write to Vec");
    }
    buf
}

// ---------------------------------------------------------------------------
// Raw encoding helpers for the negative tests.
// ---------------------------------------------------------------------------

fn len_field(tag: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_key(tag, WireType::LengthDelimited, &mut out);
    encode_varint(payload.len() as u64, &mut out);
    out.extend_from_slice(payload);
    out
}

fn varint_field(tag: u32, value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_key(tag, WireType::Varint, &mut out);
    encode_varint(value, &mut out);
    out
}

fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().expect("string").to_owned())
        .collect()
}

// ---------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------

#[test]
fn schema_matches_the_official_one() {
    let fds = write_temp(perfetto::FILE_DESCRIPTOR_SET);
    let run = run_script(&["--schema", &path_arg(&fds)]);
    let j = &run.json;
    assert_eq!(j["mismatches"], Value::Array(vec![]), "{j:#}");
    assert_eq!(j["ok"], true, "{j:#}\n{}", run.stderr);
    assert_eq!(run.code, 0);
    assert_eq!(
        str_list(&j["allowed_deviations"]),
        ["perfetto.protos.ModuleSymbols.build_id: TYPE_BYTES here, TYPE_STRING upstream"]
    );
    // Every message of every file was compared.
    assert!(j["fields_checked"].as_u64().unwrap() >= 130, "{j:#}");
    assert!(j["messages_checked"].as_u64().unwrap() >= 25, "{j:#}");
    assert_eq!(j["files"].as_array().unwrap().len(), 10, "{j:#}");
}

/// Hand-rolled descriptor messages (google/protobuf/descriptor.proto field
/// numbers) to build a deliberately wrong schema.
mod descriptor {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FileDescriptorSet {
        #[prost(message, repeated, tag = "1")]
        pub file: Vec<FileDescriptorProto>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FileDescriptorProto {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub package: Option<String>,
        #[prost(message, repeated, tag = "4")]
        pub message_type: Vec<DescriptorProto>,
        #[prost(string, optional, tag = "12")]
        pub syntax: Option<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DescriptorProto {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(message, repeated, tag = "2")]
        pub field: Vec<FieldDescriptorProto>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FieldDescriptorProto {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(int32, optional, tag = "3")]
        pub number: Option<i32>,
        #[prost(int32, optional, tag = "4")]
        pub label: Option<i32>,
        #[prost(int32, optional, tag = "5")]
        pub r#type: Option<i32>,
    }
    pub const LABEL_OPTIONAL: i32 = 1;
    pub const LABEL_REPEATED: i32 = 3;
    pub const TYPE_INT64: i32 = 3;
    pub const TYPE_UINT64: i32 = 4;
}

#[test]
fn schema_check_reports_mismatches() {
    use descriptor::*;
    use prost::Message;
    let field = |name: &str, number: i32, label: i32, ty: i32| FieldDescriptorProto {
        name: Some(name.to_owned()),
        number: Some(number),
        label: Some(label),
        r#type: Some(ty),
    };
    let bad = FileDescriptorSet {
        file: vec![FileDescriptorProto {
            name: Some("bad.proto".to_owned()),
            package: Some("perfetto.protos".to_owned()),
            syntax: Some("proto2".to_owned()),
            message_type: vec![
                DescriptorProto {
                    name: Some("Mapping".to_owned()),
                    field: vec![
                        field("iid", 1, LABEL_OPTIONAL, TYPE_UINT64),  // correct
                        field("start", 4, LABEL_OPTIONAL, TYPE_INT64), // wrong type
                        field("end", 6, LABEL_OPTIONAL, TYPE_UINT64),  // wrong number
                        field("path_string_ids", 7, LABEL_OPTIONAL, TYPE_UINT64), // not repeated
                        field("made_up", 99, LABEL_REPEATED, TYPE_UINT64), // no such field
                    ],
                },
                DescriptorProto {
                    name: Some("NoSuchMessage".to_owned()),
                    field: vec![],
                },
            ],
        }],
    };
    let fds = write_temp(&bad.encode_to_vec());
    let run = run_script(&["--schema", &path_arg(&fds)]);
    let j = &run.json;
    assert_eq!(run.code, 1, "{j:#}");
    assert_eq!(j["ok"], false);
    let mismatches = str_list(&j["mismatches"]);
    for expected in [
        "perfetto.protos.Mapping.start: type TYPE_INT64, official TYPE_UINT64",
        "perfetto.protos.Mapping.end = 6: named load_bias upstream",
        "perfetto.protos.Mapping.path_string_ids: optional, official repeated",
        "perfetto.protos.Mapping.made_up = 99: no field with this number upstream",
        "message perfetto.protos.NoSuchMessage: not in the official schema",
    ] {
        assert!(
            mismatches.iter().any(|m| m == expected),
            "missing {expected:?} in {mismatches:#?}"
        );
    }
    assert_eq!(mismatches.len(), 5, "{mismatches:#?}");
}

#[test]
fn realistic_trace_parses_with_the_official_schema() {
    let packets = realistic_trace();
    let bytes = streamed(&packets);
    let file = write_temp(&bytes);
    let run = run_script(&["--strict", &path_arg(&file)]);
    let j = &run.json;
    assert_eq!(j["unknown_fields"], Value::Array(vec![]), "{j:#}");
    assert_eq!(j["warnings"], Value::Array(vec![]), "{j:#}");
    assert_eq!(j["error"], Value::Null, "{j:#}");
    assert_eq!(j["ok"], true, "{j:#}\n{}", run.stderr);
    assert_eq!(run.code, 0);
    assert_eq!(j["packet_count"], packets.len() as u64);
    assert_eq!(j["bytes"], bytes.len() as u64);

    let s = &j["summary"];
    // Top-level fields seen, by packet count.
    let pf = &s["packet_fields"];
    assert_eq!(pf["trusted_packet_sequence_id"], packets.len() as u64);
    assert_eq!(pf["profile_packet"], 2);
    assert_eq!(pf["clock_snapshot"], 1);
    assert_eq!(pf["process_tree"], 1);
    assert_eq!(pf["perf_sample"], 1);
    assert_eq!(pf["module_symbols"], 1);
    assert_eq!(pf["interned_data"], 3);
    assert_eq!(pf["trace_packet_defaults"], 2);
    assert_eq!(pf["first_packet_on_sequence"], 1);
    assert_eq!(pf["sequence_flags"], 3);
    assert_eq!(pf["timestamp_clock_id"], 1);

    assert_eq!(s["sequences"]["1"]["incremental_state_cleared"], 1);
    assert_eq!(s["sequences"]["1"]["profile_packets"], 2);
    assert_eq!(s["sequences"]["2"]["packets"], 2);
    assert_eq!(s["timestamp_clock_ids"], serde_json::json!([6]));

    let snap = &s["clock_snapshots"][0];
    assert_eq!(snap["clocks"]["6"], BOOT_NS);
    assert_eq!(snap["clocks"]["4"], COARSE_NS);
    assert_eq!(snap["clocks"]["1"], 1_700_000_000_000_000_000u64);
    assert_eq!(snap["primary_trace_clock"], 6);

    assert_eq!(
        s["processes"],
        serde_json::json!([{"pid": PID, "ppid": 1, "cmdline": ["/usr/bin/demo", "--alloc"], "uid": 1000}])
    );
    assert_eq!(
        s["threads"],
        serde_json::json!([{"tid": PID + 1, "tgid": PID, "name": "worker"}])
    );
    assert_eq!(
        s["interned"],
        serde_json::json!({
            "function_names": 4, "frames": 4, "callstacks": 3, "build_ids": 2,
            "mapping_paths": 7, "source_paths": 1, "mappings": 3
        })
    );

    let pps = s["profile_packets"].as_array().unwrap();
    assert_eq!(pps.len(), 2);
    assert_eq!(
        (pps[0]["index"].clone(), pps[0]["continued"].clone()),
        (0.into(), true.into())
    );
    assert_eq!(
        (pps[1]["index"].clone(), pps[1]["continued"].clone()),
        (1.into(), false.into())
    );

    let dumps = s["heap_dumps"].as_array().unwrap();
    assert_eq!(dumps.len(), 1);
    let d = &dumps[0];
    assert_eq!(d["pid"], PID);
    assert_eq!(d["heap_name"], "libc.malloc");
    assert_eq!(d["timestamp"], COARSE_NS + 1_000_000);
    assert_eq!(d["start_timestamp"], COARSE_NS);
    assert_eq!(d["packet_timestamp"], BOOT_NS + 1_000_000);
    assert_eq!(d["sampling_interval_bytes"], 4096);
    assert_eq!(d["orig_sampling_interval_bytes"], 4096);
    assert_eq!(d["client_error"], "CLIENT_ERROR_NONE");
    assert_eq!(d["from_startup"], true);
    assert_eq!(d["buffer_overran"], false);
    assert_eq!(d["num_samples"], 2);
    assert_eq!(d["self_allocated"], 8192 + 40960);
    assert_eq!(d["self_freed"], 4096);
    assert_eq!(d["alloc_count"], 2 + 10);
    assert_eq!(d["free_count"], 1);
    assert_eq!(d["stats"]["heap_samples"], 12);
    assert_eq!(d["stats"]["unwinding_errors"], 1);
    assert_eq!(d["stats"]["map_reparses"], 2);
    assert_eq!(d["stats"]["total_unwinding_time_us"], 345);
    assert_eq!(d["stats"]["client_spinlock_blocked_us"], 6);
    assert_eq!(
        d["stats"]["unwinding_time_us"],
        serde_json::json!([
            {"upper_limit": 1, "max_bucket": false, "count": 10},
            {"upper_limit": 0, "max_bucket": true, "count": 2}
        ])
    );

    // Samples resolved through the interned data (written after the dump).
    let samples = s["heap_samples"].as_array().unwrap();
    assert_eq!(samples.len(), 2);
    let functions = |sample: &Value| -> Value {
        sample["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["function"].clone())
            .collect()
    };
    assert_eq!(samples[0]["callstack_id"], 2);
    assert_eq!(
        functions(&samples[0]),
        serde_json::json!(["main", "malloc"])
    );
    assert_eq!(samples[1]["self_allocated"], 40960);
    assert_eq!(
        functions(&samples[1]),
        serde_json::json!(["main", null, "malloc"])
    );
    let main = &samples[0]["frames"][0];
    assert_eq!(main["mapping"], "/usr/bin/demo");
    assert_eq!(main["build_id"], "");
    assert_eq!(main["rel_pc"], 0x100);
    assert_eq!(main["kind"], "KIND_NATIVE");
    let demo = &samples[1]["frames"][1];
    assert_eq!(demo["mapping"], "/usr/lib/libdemo.so");
    assert_eq!(demo["build_id"], hex(&BUILD_ID));
    assert_eq!(demo["rel_pc"], LIBDEMO_REL_PC);
    assert_eq!(demo["kind"], "custom");
    // ModuleSymbols matched by (path, raw build id, rel_pc).
    assert_eq!(
        demo["symbols"],
        serde_json::json!(["inlined_helper", "demo_alloc"])
    );

    let perf = &s["perf_samples"][0];
    assert_eq!(perf["cpu"], 3);
    assert_eq!(perf["pid"], PID);
    assert_eq!(perf["tid"], PID + 1);
    assert_eq!(perf["seq"], PERF_SEQ);
    assert_eq!(perf["cpu_mode"], "MODE_USER");
    assert_eq!(perf["timebase_count"], 10_000_000);
    assert_eq!(perf["unwind_error"], "UNWIND_ERROR_NONE");
    assert_eq!(perf["sample_skipped_reason"], "PROFILER_SKIP_NOT_IN_SCOPE");
    assert_eq!(perf["frames"][0]["function"], "spin");
    assert_eq!(perf["frames"][0]["mapping"], "/demo");

    let ms = &s["module_symbols"][0];
    assert_eq!(ms["path"], "/usr/lib/libdemo.so");
    assert_eq!(ms["build_id"], hex(&BUILD_ID));
    assert_eq!(ms["addresses"], 1);
    assert_eq!(
        ms["symbols"][0]["lines"][1],
        serde_json::json!({"function": "demo_alloc", "file": "demo.c", "line": 30})
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn whole_trace_and_streamed_packets_are_the_same_bytes() {
    use prost::Message;
    let packets = realistic_trace();
    let whole = perfetto::Trace {
        packet: packets.clone(),
    };
    assert_eq!(whole.encode_to_vec(), streamed(&packets));
    let back = perfetto::Trace::decode(streamed(&packets).as_slice()).unwrap();
    assert_eq!(back.packet, packets);
}

#[test]
fn unknown_fields_are_reported_at_any_depth() {
    // A valid packet from our types...
    let mut ok = packet(HEAP_SEQ, 1);
    ok.sequence_flags = Some(perfetto::SEQ_INCREMENTAL_STATE_CLEARED);
    let mut bytes = streamed(&[ok]);

    // ...then a hand-made one: TracePacket { profile_packet { process_dumps {
    //   pid, client_error = 7 (no such enum value),
    //   samples { callstack_id, field 99 } } }, timestamp as LEN (wire type
    //   mismatch), field 999 }.
    let mut sample = varint_field(1, 2);
    sample.extend(varint_field(99, 5));
    let mut dump = varint_field(1, PID as u64);
    dump.extend(len_field(2, &sample));
    dump.extend(varint_field(14, 7));
    let profile = len_field(5, &dump);
    let mut pkt = len_field(37, &profile);
    pkt.extend(varint_field(10, HEAP_SEQ as u64));
    pkt.extend(len_field(8, b"oops"));
    pkt.extend(varint_field(999, 1));
    bytes.extend(len_field(1, &pkt));

    let file = write_temp(&bytes);
    let run = run_script(&[&path_arg(&file)]);
    let j = &run.json;
    assert_eq!(run.code, 1, "{j:#}");
    assert_eq!(j["ok"], false);
    assert_eq!(j["packet_count"], 2);
    let mut unknown = str_list(&j["unknown_fields"]);
    unknown.sort();
    assert_eq!(
        unknown,
        [
            "packet[1]#8 (len)",
            "packet[1]#999 (varint)",
            "packet[1].profile_packet.process_dumps[0]#14 (varint)",
            "packet[1].profile_packet.process_dumps[0].samples[0]#99 (varint)",
        ],
        "{j:#}"
    );
}

#[test]
fn parse_failures_are_reported() {
    let mut bytes = streamed(&realistic_trace());
    bytes.truncate(bytes.len() - 3);
    let file = write_temp(&bytes);
    let run = run_script(&[&path_arg(&file)]);
    assert_eq!(run.code, 1, "{:#}", run.json);
    assert_eq!(run.json["ok"], false);
    let err = run.json["error"].as_str().unwrap_or_default();
    assert!(err.starts_with("parse failure"), "{:#}", run.json);
}

#[test]
fn semantic_problems_are_warnings_and_fatal_with_strict() {
    // A cleared sequence without a sequence id, a dangling callstack and no
    // clock snapshot for the heap dump's MONOTONIC_COARSE timestamps.
    let bad = TracePacket {
        sequence_flags: Some(perfetto::SEQ_INCREMENTAL_STATE_CLEARED),
        data: Some(trace_packet::Data::ProfilePacket(ProfilePacket {
            index: Some(0),
            process_dumps: vec![profile_packet::ProcessHeapSamples {
                pid: Some(1),
                samples: vec![heap_sample(77, 4096, 0)],
                timestamp: Some(1),
                ..Default::default()
            }],
            ..Default::default()
        })),
        ..Default::default()
    };
    let file = write_temp(&streamed(&[bad]));
    let lenient = run_script(&[&path_arg(&file)]);
    assert_eq!(lenient.code, 0, "{:#}", lenient.json);
    let warnings = str_list(&lenient.json["warnings"]);
    assert_eq!(warnings.len(), 3, "{warnings:#?}");
    assert!(warnings[0].contains("without trusted_packet_sequence_id"));
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("callstack 77 not interned"))
    );
    assert!(warnings.iter().any(|w| w.contains("MONOTONIC_COARSE")));
    let strict = run_script(&["--strict", &path_arg(&file)]);
    assert_eq!(strict.code, 1, "{:#}", strict.json);
    assert_eq!(strict.json["ok"], false);
}

#[test]
fn missing_perfetto_package_says_how_to_install_it() {
    // Shadow the real package with one that fails to import.
    let dir = tempfile::tempdir().unwrap();
    let pkg: PathBuf = dir.path().join("perfetto");
    std::fs::create_dir(&pkg).unwrap();
    std::fs::write(
        pkg.join("__init__.py"),
        "raise ImportError('simulated missing perfetto')\n",
    )
    .unwrap();
    let file = write_temp(&streamed(&realistic_trace()));
    let run = run_script_env(&[&path_arg(&file)], Some(dir.path()));
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(
        run.stderr.contains("pip install perfetto"),
        "{}",
        run.stderr
    );
}
