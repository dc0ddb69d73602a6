//! The `HeapprofdConfig` schema of `--config` against the official one: the
//! descriptor of the `perfetto` Python package (`pip install perfetto`, as
//! the proto tests use), field by field, and the official text-format
//! parser on the same inputs (what it accepts we accept with the same
//! values; what it refuses for an unknown field we refuse too).
//!
//! Missing `python3` or `perfetto` fails the test (no silent skip).

use std::process::Command;

use heapprofd_daemon::config::heapprofd_config::{CONTINUOUS_DUMP_FIELDS, FIELDS, Kind};
use heapprofd_daemon::config::trace_config::TRACE_CONFIG_FIELDS;
use heapprofd_daemon::config::{decode_text, parse_config};

fn python(script: &str, input: &str) -> String {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 must be installed (scripts/install-deps.sh)");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("writing to python");
    let out = child.wait_with_output().expect("python3");
    assert!(
        out.status.success(),
        "python3 failed (is the perfetto package installed? pip install perfetto): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

const IMPORT: &str = "from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as p\n";

#[test]
fn fields_match_the_official_descriptor() {
    let script = format!(
        "{IMPORT}import json\n\
         def fields(d): return sorted([f.name, f.number, f.type, f.label == 3 if hasattr(f, 'label') else f.is_repeated] for f in d.fields)\n\
         print(json.dumps({{'h': fields(p.HeapprofdConfig.DESCRIPTOR), 'c': fields(p.HeapprofdConfig.ContinuousDumpConfig.DESCRIPTOR), 't': sorted(f.name for f in p.TraceConfig.DESCRIPTOR.fields)}}))"
    );
    let official: serde_json::Value =
        serde_json::from_str(&python(&script, "")).expect("json from python");
    let ours = |specs: &[heapprofd_daemon::config::heapprofd_config::FieldSpec]| {
        let mut v: Vec<serde_json::Value> = specs
            .iter()
            .map(|s| {
                let ty = match s.kind {
                    Kind::U64 => 4,
                    Kind::U32 => 13,
                    Kind::Bool => 8,
                    Kind::Str => 9,
                    Kind::ContinuousDump => 11,
                };
                serde_json::json!([s.name, s.number, ty, s.repeated])
            })
            .collect();
        v.sort_by_key(|x| x.to_string());
        v
    };
    let mut theirs_h: Vec<serde_json::Value> = official["h"].as_array().expect("h").clone();
    theirs_h.sort_by_key(|x| x.to_string());
    assert_eq!(ours(FIELDS), theirs_h);
    let mut theirs_c: Vec<serde_json::Value> = official["c"].as_array().expect("c").clone();
    theirs_c.sort_by_key(|x| x.to_string());
    assert_eq!(ours(CONTINUOUS_DUMP_FIELDS), theirs_c);
    let mut t: Vec<&str> = TRACE_CONFIG_FIELDS.to_vec();
    t.sort_unstable();
    let theirs_t: Vec<&str> = official["t"]
        .as_array()
        .expect("t")
        .iter()
        .map(|v| v.as_str().expect("name"))
        .collect();
    assert_eq!(t, theirs_t);
}

/// The official parser's verdict on a bare HeapprofdConfig: `ok <json of
/// the fields set>` or `error <message>`.
fn official_parse(text: &str) -> Result<serde_json::Value, String> {
    let script = format!(
        "{IMPORT}import sys, json\n\
         from google.protobuf import text_format, json_format\n\
         m = p.HeapprofdConfig()\n\
         try:\n    text_format.Parse(sys.stdin.read(), m)\n\
         except text_format.ParseError as e:\n    print('error', e); sys.exit(0)\n\
         print('ok', json.dumps(json_format.MessageToDict(m, preserving_proto_field_name=True)))"
    );
    let out = python(&script, text);
    match out.split_once(' ') {
        Some(("ok", json)) => Ok(serde_json::from_str(json.trim()).expect("json")),
        Some(("error", e)) => Err(e.trim().to_string()),
        _ => panic!("unexpected output from python: {out}"),
    }
}

#[test]
fn the_official_parser_agrees() {
    for text in [
        "sampling_interval_bytes: 4096 process_cmdline: \"python3\" process_cmdline: 'b'",
        "sampling_interval_bytes: 0x1000 pid: [1, 2, 3] all: true no_startup: True",
        "sampling_interval_bytes: 1 continuous_dump_config { dump_phase_ms: 5 dump_interval_ms: 100 }",
        "sampling_interval_bytes: 1 continuous_dump_config: < dump_interval_ms: 7 >; block_client: 1",
        "sampling_interval_bytes: 8 heaps: [\"libc.malloc\"] heap_sampling_intervals: [16] dump_at_max: t",
        "# comment\nsampling_interval_bytes: 4096 max_heapprofd_memory_kb: 1024 max_heapprofd_cpu_secs: 5",
        "sampling_interval_bytes: 4096 shmem_size_bytes: 1048576 block_client_timeout_us: 100",
    ] {
        let theirs = official_parse(text).unwrap_or_else(|e| panic!("{text}: official: {e}"));
        let (ours, _, _) = decode_text(text).unwrap_or_else(|e| panic!("{text}: ours: {e:?}"));
        // Compare the values that both sides set.
        let get = |k: &str| theirs.get(k).cloned().unwrap_or(serde_json::Value::Null);
        let num = |v: serde_json::Value| -> Option<u64> {
            match v {
                serde_json::Value::String(s) => s.parse().ok(),
                serde_json::Value::Number(n) => n.as_u64(),
                _ => None,
            }
        };
        assert_eq!(
            ours.sampling_interval_bytes,
            num(get("sampling_interval_bytes")),
            "{text}"
        );
        let pids: Vec<u64> = get("pid")
            .as_array()
            .map(|a| a.iter().filter_map(|v| num(v.clone())).collect())
            .unwrap_or_default();
        assert_eq!(ours.pid, pids, "{text}");
        assert_eq!(ours.all, get("all").as_bool().unwrap_or(false), "{text}");
        assert_eq!(
            ours.block_client,
            get("block_client").as_bool().unwrap_or(false),
            "{text}"
        );
        assert_eq!(
            ours.dump_at_max,
            get("dump_at_max").as_bool().unwrap_or(false),
            "{text}"
        );
        assert_eq!(
            ours.continuous_dump_config
                .map(|c| u64::from(c.dump_interval_ms)),
            num(get("continuous_dump_config")["dump_interval_ms"].clone()),
            "{text}"
        );
        assert_eq!(
            ours.max_heapprofd_cpu_secs,
            num(get("max_heapprofd_cpu_secs")),
            "{text}"
        );
        let names: Vec<String> = get("process_cmdline")
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|v| v.as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(ours.process_cmdline, names, "{text}");
    }
    for text in [
        "sampling_interval: 4096",
        "sampling_interval_bytes: 1 continuous_dump_config { dump_phase: 1 }",
        "sampling_interval_bytes: -1",
        "all: maybe",
        "all: true all: false",
    ] {
        let theirs = official_parse(text);
        assert!(theirs.is_err(), "{text}: the official parser accepted it");
        assert!(decode_text(text).is_err(), "{text}: we accepted it");
    }
    // And a whole profile from a bare config.
    assert!(parse_config("sampling_interval_bytes: 4096 all: true").is_ok());
}
