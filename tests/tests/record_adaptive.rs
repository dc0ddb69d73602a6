//! The adaptive interval end to end (`ClientConfig::FLAG_ADAPTIVE_INTERVAL`):
//! four threads of 2 million malloc/free pairs of 16-4096 bytes
//! (`tests/programs/client/bench.c`) at the default 4 KiB interval, with a
//! 128 KiB ring, produce samples far faster than any daemon unwinds them,
//! so the client raises its interval. The test checks what must hold
//! whatever the machine's pace:
//!
//! * the estimates stay right: the allocation count (weighted at each
//!   sample's own interval, so a daemon that ignored the raise would
//!   undercount) and the bytes (mean size 2,056) against the program's
//!   known totals, within six standard deviations of an estimate drawn
//!   wholly at the widest interval the trace reports (a raised interval
//!   means fewer samples, so a wider spread: a fixed 10% bound failed
//!   once on CI, 2.25 million estimated for 2 million);
//! * the summary's warning, the trace's `sampling_interval_bytes` and
//!   `orig_sampling_interval_bytes` agree on whether it was raised;
//! * `--fixed-interval` and `--seed` never raise it.

use std::path::Path;
use std::time::Duration;

use heapprofd_tests::client_harness::{compile, workspace_root};
use heapprofd_tests::record_harness::{check_trace, record, scratch_dir};

const TIMEOUT: Duration = Duration::from_secs(300);
const THREADS: u64 = 4;
const PAIRS: u64 = 500_000;
/// Mean of `16 + rng % 4081`.
const MEAN_SIZE: f64 = 2056.0;
/// Mean of `1 / (16 + rng % 4081)`.
const MEAN_INVERSE_SIZE: f64 = 1.366e-3;

/// (estimated allocations, allocated bytes, raised warning) of a run.
fn run(dir: &Path, prog: &Path, extra: &[&str]) -> (f64, f64, bool, Vec<serde_json::Value>) {
    let trace = dir.join(format!("t{}.pftrace", extra.len()));
    let trace_s = trace.to_string_lossy().into_owned();
    let mut args = vec!["--shmem-size", "128k", "-o", &trace_s];
    args.extend(extra);
    let out = record(
        &args,
        &[
            prog.to_str().unwrap(),
            &THREADS.to_string(),
            &PAIRS.to_string(),
            "20",
        ],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "record failed:\n{}", out.stderr);
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("allocations est.: allocated "))
        .unwrap_or_else(|| panic!("no summary line:\n{}", out.stderr));
    let count: f64 = line
        .split('~')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .map(|s| s.replace(',', ""))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no estimate in {line}"));
    let mut words = line.split("allocated ").nth(1).unwrap().split_whitespace();
    let value: f64 = words.next().unwrap().parse().unwrap();
    let unit = match words.next().unwrap().trim_end_matches(',') {
        "GiB" => (1u64 << 30) as f64,
        "MiB" => (1u64 << 20) as f64,
        u => panic!("unit {u} in {line}"),
    };
    let raised = out.stderr.contains("taken at a raised interval");
    let dumps = check_trace(&trace).dumps;
    assert!(!dumps.is_empty(), "no dump:\n{}", out.stderr);
    (count, value * unit, raised, dumps)
}

/// How far the estimates may stray from the program's totals when no
/// sample was drawn at more than `interval`: six standard deviations of
/// the estimate had every sample been drawn at it (an upper bound of the
/// spread), plus 1% for libc's own allocations.
///
/// At an interval I, an allocation of s bytes is sampled with probability
/// p ~ s/I and counted as 1/p, so the count's variance is at most the sum
/// of I/s over the allocations; the picked bytes are Poisson with mean B/I,
/// each standing for I bytes, so the bytes' variance is B * I. At the
/// widest interval the client reaches (4 KiB << 10) the count's slack is
/// about a third of it; a daemon that ignored the raise is off by 99%.
fn slack(interval: f64) -> (f64, f64) {
    let allocs = (THREADS * PAIRS) as f64;
    let count_sd = (allocs * interval * MEAN_INVERSE_SIZE).sqrt();
    let bytes_sd = (allocs * MEAN_SIZE * interval).sqrt();
    (
        6.0 * count_sd + 0.01 * allocs,
        6.0 * bytes_sd + 0.01 * allocs * MEAN_SIZE,
    )
}

#[test]
fn a_raised_interval_keeps_the_estimates_and_says_so() {
    let dir = scratch_dir("adaptive");
    let prog = dir.join("bench");
    let src = workspace_root().join("tests/programs/client/bench.c");
    compile(&[
        "gcc",
        "-O2",
        "-g",
        "-pthread",
        "-o",
        prog.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let allocs = (THREADS * PAIRS) as f64;
    for extra in [&[][..], &["--fixed-interval"][..], &["--seed", "5"][..]] {
        let (count, bytes, raised, dumps) = run(&dir, &prog, extra);
        let heap = dumps.iter().filter(|d| d["heap_name"] == "libc.malloc");
        let widest = heap
            .clone()
            .map(|d| d["sampling_interval_bytes"].as_u64().unwrap())
            .max();
        let (count_slack, bytes_slack) = slack(widest.unwrap_or(4096) as f64);
        let what = format!(
            "{extra:?}: ~{count} allocations (+-{count_slack:.0}), {bytes} bytes \
             (+-{bytes_slack:.0}), raised {raised}, widest interval {widest:?}"
        );
        // The program's own allocations, and a few of libc's.
        assert!((count - allocs).abs() < count_slack, "{what}");
        assert!((bytes - allocs * MEAN_SIZE).abs() < bytes_slack, "{what}");
        assert!(
            heap.clone()
                .all(|d| d["orig_sampling_interval_bytes"] == 4096),
            "{what}"
        );
        assert_eq!(raised, widest > Some(4096), "{what}: {dumps:?}");
        if extra.is_empty() {
            assert!(raised, "a 128 KiB ring never filled: {what}");
        } else {
            assert!(!raised, "{what}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
