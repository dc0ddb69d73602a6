//! User contexts end to end: `tests/programs/contexts/endpoints.c`, a
//! server whose acceptor thread makes a context per request
//! (`endpoint=/a|/b`, `request=N`) and hands its snapshot
//! (`heapprofd_context_current`) to a pool of four workers, which install
//! it (`heapprofd_context_activate`) while they allocate; /a allocates
//! three times what /b does. The program prints its own per-endpoint
//! totals; `report --by endpoint` must give them back exactly at `-i 1`
//! and within 5% when sampled, `record --context` must record only the
//! contexts it names, and the trace (read with `check_trace.py --strict`,
//! the official schema) must show each context as the root frame of its
//! samples.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use heapprofd_tests::record_harness::{
    check_trace, heapprofd_ok, record, record_programs, scratch_dir,
};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(300);

fn endpoints() -> PathBuf {
    record_programs().path("endpoints")
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// (bytes, allocations) per endpoint as the program counted them
/// ("endpoint /a bytes=N allocs=M").
fn truth(stdout: &str) -> BTreeMap<String, (u64, u64)> {
    assert!(stdout.contains("contexts ok"), "{stdout}");
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("endpoint "))
        .map(|l| {
            let mut parts = l.split(' ');
            let name = parts.next().unwrap_or("").to_owned();
            let num = |p: Option<&str>, k: &str| {
                p.and_then(|x| x.strip_prefix(k))
                    .and_then(|x| x.parse().ok())
                    .unwrap_or_else(|| panic!("bad line {l}"))
            };
            let bytes = num(parts.next(), "bytes=");
            let allocs = num(parts.next(), "allocs=");
            (name, (bytes, allocs))
        })
        .collect()
}

/// `report --by endpoint`: (allocated bytes, allocations) per value
/// (`(none)` for samples outside any context with the key).
fn by_endpoint(trace: &Path) -> BTreeMap<String, (u64, u64)> {
    by_key(trace, "endpoint")
}

fn by_key(trace: &Path, key: &str) -> BTreeMap<String, (u64, u64)> {
    let out = heapprofd_ok(&["report", &s(trace), "--by", key, "--format", "json"]);
    let v: Value = serde_json::from_str(&out.stdout).expect("report json");
    let heaps = v["heaps"].as_array().expect("heaps");
    assert_eq!(heaps.len(), 1, "{v}");
    heaps[0]["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|x| {
            (
                x["value"].as_str().unwrap_or("(none)").to_owned(),
                (
                    x["allocated"].as_u64().unwrap_or(0),
                    x["alloc_count"].as_u64().unwrap_or(0),
                ),
            )
        })
        .collect()
}

#[test]
fn per_endpoint_totals_are_exact_at_interval_1() {
    let dir = scratch_dir("contexts-exact");
    let trace = dir.join("t.pftrace");
    let out = record(
        &["-i", "1", "-o", &s(&trace)],
        &[&s(&endpoints()), "1000"],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let want = truth(&out.stdout);
    assert_eq!(want["/a"], (6_160_896, 12_000), "the program's own count");
    let got = by_endpoint(&trace);
    assert_eq!(got["/a"], want["/a"]);
    assert_eq!(got["/b"], want["/b"]);
    // The acceptor's queue nodes (1000 x 32 bytes) and the C library's
    // own allocations are outside any context.
    assert!(got["(none)"].1 >= 1000, "{got:?}");
    // In the trace: every sample of a context has its root frame,
    // `endpoint=/a; request=N` (the request's context extends the
    // endpoint's), so the Perfetto UI's flame graph opens on one root per
    // context; `handle` is right below it.
    let t = check_trace(&trace);
    let mut per_root: BTreeMap<String, u64> = BTreeMap::new();
    for smp in t.latest() {
        let root = smp.frames.first().cloned().unwrap_or_default();
        if let Some(rest) = root.strip_prefix("endpoint=") {
            let endpoint = rest.split(';').next().unwrap_or("").to_owned();
            assert!(rest.contains("; request="), "{root}");
            assert!(smp.frames.iter().any(|f| f == "handle"), "{:?}", smp.frames);
            *per_root.entry(endpoint).or_default() += smp.allocated;
        }
    }
    assert_eq!(per_root["/a"], want["/a"].0);
    assert_eq!(per_root["/b"], want["/b"].0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sampled_per_endpoint_totals_are_within_five_percent() {
    let dir = scratch_dir("contexts-sampled");
    let trace = dir.join("t.pftrace");
    // ~150 MB allocated: about 28,000 samples of 4 KiB for /a and 9,000
    // for /b, so 5% is over four standard deviations of /b's estimate
    // (which worker serves which request, and so each thread's sampler
    // sequence, varies from run to run despite the fixed seed).
    let out = record(
        &["-i", "4096", "--seed", "1", "-o", &s(&trace)],
        &[&s(&endpoints()), "20000"],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let want = truth(&out.stdout);
    let got = by_endpoint(&trace);
    for e in ["/a", "/b"] {
        let (w, g) = (want[e].0 as f64, got[e].0 as f64);
        assert!(
            (g - w).abs() <= 0.05 * w,
            "{e}: sampled {g} bytes, allocated {w}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_filter_records_only_the_contexts_it_names() {
    let dir = scratch_dir("contexts-filter");
    let trace = dir.join("t.pftrace");
    let out = record(
        &["-i", "1", "--context", "endpoint=/b", "-o", &s(&trace)],
        &[&s(&endpoints()), "1000"],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let want = truth(&out.stdout);
    let got = by_endpoint(&trace);
    assert_eq!(
        got,
        BTreeMap::from([("/b".to_owned(), want["/b"])]),
        "only /b's allocations, nothing outside a context"
    );
    // `any` (and a key): both endpoints, still nothing outside them.
    for filter in ["any", "request"] {
        let out = record(
            &["-i", "1", "--context", filter, "-o", &s(&trace)],
            &[&s(&endpoints()), "1000"],
            TIMEOUT,
        );
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        let want = truth(&out.stdout);
        let got = by_endpoint(&trace);
        assert_eq!(got, want, "--context {filter}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// With the workers held until all 5000 requests are queued, 5000 request
/// contexts are alive at once: the client stores 4093 (4095 slots, two
/// taken by the endpoints'); the last 907 requests get the overflow
/// context, counted and named in the summary, their samples (exactly
/// their allocations at -i 1) under `heapprofd.context=overflow`.
#[test]
fn contexts_beyond_the_table_are_counted_and_flagged() {
    let dir = scratch_dir("contexts-overflow");
    let trace = dir.join("t.pftrace");
    let out = record(
        &["-i", "1", "-o", &s(&trace)],
        &[&s(&endpoints()), "5000", "0"],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("no room for 907 user contexts"),
        "{}",
        out.stderr
    );
    // Requests 4093..=4999: 453 of /a (24 blocks) and 454 of /b (8).
    let got = by_key(&trace, "heapprofd.context");
    assert_eq!(got["overflow"].1, 453 * 24 + 454 * 8, "{got:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_filter_is_a_usage_error() {
    let out = record(
        &["--context", "=x", "-o", "/tmp/never.pftrace"],
        &["true"],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("KEY=VALUE"), "{}", out.stderr);
}
