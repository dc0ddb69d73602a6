//! Traces through the official parser: the realistic one (every field
//! known, the summary as written), hand-broken ones (unknown fields, parse
//! failures, semantic warnings), and a missing `perfetto` package.

use std::path::PathBuf;

use heapprofd_proto::perfetto::{self, ProfilePacket, TracePacket, profile_packet, trace_packet};
use prost::encoding::{WireType, encode_key, encode_varint};
use serde_json::Value;

use crate::fixture::{
    BOOT_NS, BUILD_ID, COARSE_NS, HEAP_SEQ, LIBDEMO_REL_PC, PERF_SEQ, PID, heap_sample, packet,
    realistic_trace, streamed,
};
use crate::script::{path_arg, run_script, run_script_env, str_list, write_temp};

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
