//! Helpers for the end-to-end tests of `report` and `convert` on real runs
//! (`tests/tests/record_analysis.rs`, `tests/tests/report_views.rs`):
//! recording a test program to a checked trace, reading `report --format
//! json`, and waiting until a `--continuous-dump` trace being written has
//! some number of dumps (no assertion of these tests depends on timing).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::client_harness::{Output, run};
use crate::record_harness::{Live, check_trace, heapprofd, heapprofd_ok, record, record_programs};

/// How long one command of these tests may take.
pub const TIMEOUT: Duration = Duration::from_secs(180);

/// The path of the compiled record test program `name`.
pub fn prog(name: &str) -> String {
    record_programs().path(name).to_string_lossy().into_owned()
}

/// `p` as a string argument.
pub fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Runs `heapprofd-rs ARGS` with a timeout, whatever its exit.
pub fn run_cli(args: &[&str]) -> Output {
    let mut c = heapprofd();
    c.args(args);
    run(c, TIMEOUT)
}

/// The JSON that `heapprofd-rs ARGS` prints (which must succeed).
pub fn cli_json(args: &[&str]) -> Value {
    let out = heapprofd_ok(args);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}\n{}", out.stdout))
}

/// Records `record -o DIR/NAME ARGS -- CMD`, expects exit 0 and a trace
/// that the official-schema checker accepts.
pub fn recorded(dir: &Path, name: &str, args: &[&str], cmd: &[&str]) -> PathBuf {
    let trace = dir.join(name);
    let mut a = vec!["-o", trace.to_str().unwrap()];
    a.extend_from_slice(args);
    let out = record(&a, cmd, TIMEOUT);
    assert_eq!(out.code, Some(0), "{cmd:?}: {}", out.stderr);
    check_trace(&trace);
    trace
}

/// Dumps in a trace that may still be being written (a partial last packet
/// makes `report` fail after printing its JSON).
pub fn dumps_so_far(trace: &Path) -> u64 {
    if std::fs::metadata(trace).map_or(true, |m| m.len() == 0) {
        return 0;
    }
    let out = run_cli(&["report", "--format", "json", &s(trace)]);
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_default();
    v["heaps"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter_map(|x| x["dumps"].as_u64())
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Waits until `trace` has at least `n` dumps.
pub fn wait_for_dumps(trace: &Path, n: u64) {
    let start = Instant::now();
    while dumps_so_far(trace) < n {
        assert!(
            start.elapsed() < TIMEOUT,
            "the trace never got {n} dumps ({} so far)",
            dumps_so_far(trace)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The file of the first mapping of a gzipped pprof profile: what `pprof`
/// prints as its `File:` header. Read with a minimal protobuf walk
/// (`Profile.mapping` = 3, `Mapping.filename` = 5, `Profile.string_table`
/// = 6), independent of the writer's message types; `gzip -dc` unpacks.
pub fn pprof_main_file(pprof: &Path) -> String {
    let bytes = gunzip(pprof);
    let fields = proto_fields(&bytes);
    let strings: Vec<String> = fields
        .iter()
        .filter(|f| f.0 == 6)
        .map(|f| String::from_utf8_lossy(f.2).into_owned())
        .collect();
    let first = fields.iter().find(|f| f.0 == 3).expect("a mapping");
    let filename = proto_fields(first.2)
        .iter()
        .find(|f| f.0 == 5)
        .map_or(0, |f| f.1);
    strings[usize::try_from(filename).unwrap()].clone()
}

fn gunzip(pprof: &Path) -> Vec<u8> {
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(pprof)
        .output()
        .expect("run gzip");
    assert!(out.status.success(), "gzip -dc {}", pprof.display());
    out.stdout
}

/// One pprof sample: its function names, leaf first, and its values.
pub type PprofSample = (Vec<String>, Vec<i64>);

/// The sample types (`type/unit`) and the samples of a gzipped pprof
/// profile, each sample as its function names leaf first and its values.
/// Read with the same minimal walk as [`pprof_main_file`]: `Profile.sample`
/// = 2 (`location_id` = 1, `value` = 2, packed), `sample_type` = 1,
/// `location` = 4 (`id` = 1, `line` = 4 with `function_id` = 1),
/// `function` = 5 (`id` = 1, `name` = 2).
pub fn pprof_samples(pprof: &Path) -> (Vec<String>, Vec<PprofSample>) {
    let bytes = gunzip(pprof);
    let fields = proto_fields(&bytes);
    let strings: Vec<String> = fields
        .iter()
        .filter(|f| f.0 == 6)
        .map(|f| String::from_utf8_lossy(f.2).into_owned())
        .collect();
    let sub =
        |m: &[u8], n: u64| -> u64 { proto_fields(m).iter().find(|f| f.0 == n).map_or(0, |f| f.1) };
    let index = |i: u64| usize::try_from(i).unwrap();
    let functions: std::collections::HashMap<u64, String> = fields
        .iter()
        .filter(|f| f.0 == 5)
        .map(|f| (sub(f.2, 1), strings[index(sub(f.2, 2))].clone()))
        .collect();
    let locations: std::collections::HashMap<u64, String> = fields
        .iter()
        .filter(|f| f.0 == 4)
        .map(|f| {
            let m = proto_fields(f.2);
            let id = m.iter().find(|x| x.0 == 1).map_or(0, |x| x.1);
            let line = m.iter().find(|x| x.0 == 4).map_or(&[][..], |x| x.2);
            (id, functions[&sub(line, 1)].clone())
        })
        .collect();
    let types = fields
        .iter()
        .filter(|f| f.0 == 1)
        .map(|f| {
            format!(
                "{}/{}",
                strings[index(sub(f.2, 1))],
                strings[index(sub(f.2, 2))]
            )
        })
        .collect();
    let samples = fields
        .iter()
        .filter(|f| f.0 == 2)
        .map(|f| {
            let m = proto_fields(f.2);
            let packed = |n: u64| -> Vec<u64> {
                let mut out = Vec::new();
                for x in m.iter().filter(|x| x.0 == n) {
                    let mut b = x.2;
                    if b.is_empty() {
                        out.push(x.1); // not packed
                    }
                    while !b.is_empty() {
                        out.push(varint(&mut b));
                    }
                }
                out
            };
            let names = packed(1).iter().map(|l| locations[l].clone()).collect();
            // int64 values: two's complement in the varint.
            let values = packed(2).iter().map(|&v| v as i64).collect();
            (names, values)
        })
        .collect();
    (types, samples)
}

fn varint(b: &mut &[u8]) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (byte, rest) = b.split_first().expect("truncated varint");
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    v
}

/// The fields of one protobuf message: (number, varint value, bytes of a
/// length-delimited field).
fn proto_fields(mut b: &[u8]) -> Vec<(u64, u64, &[u8])> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b);
        match key & 7 {
            0 => out.push((key >> 3, varint(&mut b), &[][..])),
            1 => b = &b[8..],
            2 => {
                let n = usize::try_from(varint(&mut b)).unwrap();
                out.push((key >> 3, 0, &b[..n]));
                b = &b[n..];
            }
            5 => b = &b[4..],
            t => panic!("protobuf wire type {t}"),
        }
    }
    out
}

/// Per row of the first heap of a `report --timeline --format json`, its
/// `grew_most_sites` as (site, bytes).
pub fn grown_sites(timeline: &Value) -> Vec<Vec<(String, i64)>> {
    let list = |r: &Value| -> Vec<(String, i64)> {
        let sites = r["grew_most_sites"].as_array().expect("grew_most_sites");
        sites
            .iter()
            .map(|g| {
                (
                    g["site"].as_str().unwrap().into(),
                    g["bytes"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let rows = timeline["heaps"][0]["rows"].as_array().expect("rows");
    rows.iter().map(list).collect()
}

/// A `-c 100ms` recording of `analysis steps` into `dir/t.pftrace`: 100 MiB
/// allocated by peak_site and freed, then 10 MiB kept by after_peak_site;
/// each phase lasts until the trace has two dumps after it.
pub fn peak_trace(dir: &Path) -> PathBuf {
    stepped_trace(dir, "t.pftrace", &["alloc100", "free100", "alloc10"])
}

/// A `-c 100ms` recording of `analysis steps` into `dir/NAME`, running
/// `steps` (commands of `analysis steps`) one after the other; each lasts
/// until the trace has two dumps after it.
pub fn stepped_trace(dir: &Path, name: &str, steps: &[&str]) -> PathBuf {
    let trace = dir.join(name);
    let mut live = Live::start(
        &["-i", "4096", "-c", "100ms", "-o", &s(&trace)],
        &[&prog("analysis"), "steps"],
    );
    let mut dumps = dumps_so_far(&trace);
    for &step in steps {
        live.step(step);
        wait_for_dumps(&trace, dumps + 2);
        dumps = dumps_so_far(&trace);
    }
    let out = live.finish(TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    check_trace(&trace);
    trace
}
