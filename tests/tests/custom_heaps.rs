//! The custom allocator API end to end: `tests/programs/heaps/pool.c` (a
//! slab pool carved from 64 KiB malloc blocks, reporting into heap "pool"
//! through `client/include/heapprofd.h`) and `heapprofd-test-rust-heap`
//! (a `GlobalAlloc` wrapper reporting into heap "rust" through the
//! `heapprofd-api` crate), recorded with `--heaps`, `--all-heaps`,
//! `--heap-interval`, and with the heap registered before the profile
//! starts (`record --pid` waking a preloaded dormant client). Every trace
//! is read back with `check_trace.py --strict` (the official schema), so
//! what is checked is what trace processor sees per `heap_name`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use heapprofd_proto::service::DIR_ENV;
use heapprofd_tests::attach_harness::{Target, attach_with};
use heapprofd_tests::record_harness::{
    Sample, Totals, TraceSummary, check_trace, record, record_programs, release_bins, scratch_dir,
};

const TIMEOUT: Duration = Duration::from_secs(300);
/// pool.c's slot and block sizes.
const SLOT: u64 = 96;
const BLOCK: u64 = 65536;
/// Objects `pool` allocates first (the argument).
const NOBJ: u64 = 10_000;

fn pool() -> PathBuf {
    record_programs().path("pool")
}

fn s(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Totals per heap, and per heap and function (samples whose stack holds it).
fn by_heap(t: &TraceSummary) -> BTreeMap<String, Totals> {
    let mut m: BTreeMap<String, Totals> = BTreeMap::new();
    for smp in t.latest() {
        m.entry(smp.heap.clone()).or_default().add(&smp);
    }
    m
}

fn in_function(t: &TraceSummary, heap: &str, f: &str) -> Totals {
    let mut tot = Totals::default();
    for smp in t.latest().iter().filter(|x: &&Sample| x.heap == heap) {
        // C names, or Rust paths ending in `::f`.
        if smp
            .frames
            .iter()
            .any(|fr| fr == f || fr.strip_suffix(f).is_some_and(|p| p.ends_with("::")))
        {
            tot.add(smp);
        }
    }
    tot
}

fn totals(allocs: u64, bytes: u64, frees: u64, freed: u64) -> Totals {
    Totals {
        allocs,
        bytes,
        frees,
        freed,
    }
}

/// What pool.c does with NOBJ: NOBJ + NOBJ/5 slots, every other one of the
/// first NOBJ freed; blocks of 682 slots.
fn pool_truth() -> (Totals, u64) {
    let allocs = NOBJ + NOBJ / 5;
    let frees = NOBJ / 2;
    let per_block = BLOCK / SLOT;
    (
        totals(allocs, allocs * SLOT, frees, frees * SLOT),
        NOBJ.div_ceil(per_block),
    )
}

#[test]
fn pool_heap_is_exact_at_interval_1_and_malloc_sees_only_the_blocks() {
    let dir = scratch_dir("pool");
    let trace = dir.join("t.pftrace");
    let n = NOBJ.to_string();
    let out = record(
        &["-i", "1", "--heaps", "libc.malloc,pool", "-o", &s(&trace)],
        &[&s(&pool()), &n],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (want, blocks) = pool_truth();
    assert!(
        out.stdout
            .contains(&format!("heap=1 enabled=1 interval=1 blocks={blocks}")),
        "{}",
        out.stdout
    );
    assert_eq!(
        out.stdout.matches("pool disabled").count(),
        1,
        "{}",
        out.stdout
    );
    let t = check_trace(&trace);
    let heaps = by_heap(&t);
    eprintln!("per heap: {heaps:?}");
    assert_eq!(heaps.get("pool"), Some(&want));
    assert_eq!(
        heaps.get("libc.malloc"),
        Some(&totals(blocks, blocks * BLOCK, 0, 0)),
        "libc.malloc holds the pool's blocks and nothing else"
    );
    assert_eq!(
        in_function(&t, "libc.malloc", "refill"),
        totals(blocks, blocks * BLOCK, 0, 0)
    );
    assert_eq!(
        in_function(&t, "pool", "pool_fill"),
        totals(NOBJ, NOBJ * SLOT, NOBJ / 2, NOBJ / 2 * SLOT)
    );
    // Frees are charged to the allocating stack: half of pool_fill's
    // slots come back, and none of pool_refill's.
    assert_eq!(
        in_function(&t, "pool", "pool_refill"),
        totals(NOBJ / 5, NOBJ / 5 * SLOT, 0, 0)
    );
    // Each heap is its own profile: one dump per heap, both named.
    let names: Vec<&str> = t
        .dumps
        .iter()
        .filter_map(|d| d["heap_name"].as_str())
        .collect();
    assert!(
        names.contains(&"pool") && names.contains(&"libc.malloc"),
        "{names:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn heaps_not_asked_for_are_not_recorded() {
    let dir = scratch_dir("pool-default");
    let trace = dir.join("t.pftrace");
    let n = NOBJ.to_string();
    let out = record(&["-i", "1", "-o", &s(&trace)], &[&s(&pool()), &n], TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("heap=1 enabled=0 interval=0"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("pool disabled"), "{}", out.stdout);
    let t = check_trace(&trace);
    let heaps = by_heap(&t);
    assert!(!heaps.contains_key("pool"), "{heaps:?}");
    let (_, blocks) = pool_truth();
    assert_eq!(in_function(&t, "libc.malloc", "refill").allocs, blocks);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn all_heaps_and_a_heaps_own_interval() {
    let dir = scratch_dir("pool-all");
    let n = NOBJ.to_string();
    // --all-heaps: the pool at -i (1), libc.malloc too.
    let trace = dir.join("all.pftrace");
    let out = record(
        &["-i", "1", "--all-heaps", "-o", &s(&trace)],
        &[&s(&pool()), &n],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("enabled=1 interval=1"),
        "{}",
        out.stdout
    );
    let heaps = by_heap(&check_trace(&trace));
    assert_eq!(heaps.get("pool"), Some(&pool_truth().0));
    assert!(heaps.contains_key("libc.malloc"), "{heaps:?}");
    // --heaps pool with its own interval: libc.malloc is left out, the
    // enabled callback is told the pool's interval.
    let trace = dir.join("own.pftrace");
    let out = record(
        &[
            "-i",
            "1",
            "--heaps",
            "pool",
            "--heap-interval",
            "pool=4k",
            "-o",
            &s(&trace),
        ],
        &[&s(&pool()), &n],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("enabled=1 interval=4096"),
        "{}",
        out.stdout
    );
    let t = check_trace(&trace);
    let heaps = by_heap(&t);
    assert!(
        heaps.get("libc.malloc").is_none_or(|h| h.allocs == 0),
        "{heaps:?}"
    );
    let p = heaps.get("pool").copied().unwrap_or_default();
    // Sampled at 4 KiB: 1.15 MB of 96-byte slots give about 281 samples of
    // 4096 bytes each; a generous bound, the exact estimate is the
    // sampler's unit tests' business.
    assert!(p.allocs > 100 && p.allocs < 600, "{p:?}");
    // Each sample stands for 4096 bytes per picked byte (rarely 2 in one slot).
    assert!(
        p.bytes % 4096 == 0 && p.bytes >= p.allocs * 4096 && p.bytes < p.allocs * 4096 * 2,
        "{p:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_heap_registered_before_the_profile_starts_is_recorded() {
    let so = release_bins().client_so.clone();
    let dir = scratch_dir("pool-pid");
    let trace = dir.join("t.pftrace");
    let mut c = std::process::Command::new(pool());
    c.arg(NOBJ.to_string())
        .arg("--wait-enabled")
        .env("LD_PRELOAD", &so)
        // A service of the machine's own (its startup-trigger store) must
        // not claim the dormant client: a private, empty service directory.
        .env(DIR_ENV, dir.join("no-service"))
        .env_remove("HEAPPROFD_SOCKET");
    let mut t = Target::start(c);
    // The heap is registered (and the client dormant) before record starts.
    let out = attach_with(
        t.pid,
        &["-i", "1", "--heaps", "pool", "-d", "2s", "-o", &s(&trace)],
        &[("HEAPPROFD_ATTACH", "signal")],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (want, blocks) = pool_truth();
    assert_eq!(
        t.line(Duration::from_secs(60)),
        format!("heap=1 enabled=1 interval=1 blocks={blocks}")
    );
    // The disabled callback runs when the profile ends, before exit.
    assert_eq!(t.line(Duration::from_secs(60)), "pool disabled");
    assert_eq!(t.line(Duration::from_secs(60)), "bye");
    t.wait_exit(0);
    let heaps = by_heap(&check_trace(&trace));
    assert_eq!(heaps.get("pool"), Some(&want));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rust_global_allocator_reports_through_the_crate() {
    let dir = scratch_dir("rust-heap");
    let trace = dir.join("t.pftrace");
    let bin = env!("CARGO_BIN_EXE_heapprofd-test-rust-heap");
    let out = record(
        &["-i", "1", "--heaps", "libc.malloc,rust", "-o", &s(&trace)],
        &[bin],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("heap=1 enabled=1 kept=1000"),
        "{}",
        out.stdout
    );
    let t = check_trace(&trace);
    // fill: 1000 boxes of 200 bytes and the vector of 1000 pointers; churn:
    // 500 vectors of 300 bytes, all dropped. (`kept` is dropped at the end
    // of main: freed too.)
    assert_eq!(
        in_function(&t, "rust", "fill"),
        totals(1001, 1000 * 200 + 8000, 1001, 1000 * 200 + 8000)
    );
    assert_eq!(
        in_function(&t, "rust", "churn"),
        totals(500, 500 * 300, 500, 500 * 300)
    );
    // The wrapper forwards to the system allocator: malloc saw them too.
    assert_eq!(
        in_function(&t, "libc.malloc", "churn"),
        totals(500, 500 * 300, 500, 500 * 300)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Four threads report into one heap at once: at -i 1 every report is
/// recorded (80000 allocations of 32 to 88 bytes, every third freed, and
/// 400 self-sampled ones of 1000 bytes); at 1 GiB with a fixed seed (whose
/// first gap is beyond the 4.8 MB the threads allocate, whatever their
/// order) only the self-sampled ones are, each as the 1000 bytes it said.
#[test]
fn threads_share_a_heap_and_report_sample_bypasses_its_sampler() {
    let dir = scratch_dir("heap-threads");
    let prog = s(&record_programs().path("heap_threads"));
    let per_thread_bytes: u64 = (0..20_000u64).map(|i| 32 + (i % 8) * 8).sum();
    let per_thread_freed: u64 = (0..20_000u64)
        .filter(|i| i % 3 == 0)
        .map(|i| 32 + (i % 8) * 8)
        .sum();
    let trace = dir.join("exact.pftrace");
    let out = record(
        &["-i", "1", "--heaps", "arena", "-o", &s(&trace)],
        &[&prog],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("recorded=80400"), "{}", out.stdout);
    let t = check_trace(&trace);
    assert_eq!(
        in_function(&t, "arena", "arena_alloc"),
        totals(
            80_000,
            4 * per_thread_bytes,
            4 * 6_667,
            4 * per_thread_freed
        )
    );
    assert_eq!(
        in_function(&t, "arena", "arena_sampled"),
        totals(400, 400 * 1000, 0, 0)
    );
    let trace = dir.join("sampled.pftrace");
    let out = record(
        &[
            "--seed",
            "1",
            "--heaps",
            "arena",
            "--heap-interval",
            "arena=1GiB",
            "-o",
            &s(&trace),
        ],
        &[&prog],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("recorded=400"), "{}", out.stdout);
    let t = check_trace(&trace);
    assert_eq!(in_function(&t, "arena", "arena_alloc").allocs, 0);
    assert_eq!(
        in_function(&t, "arena", "arena_sampled"),
        totals(400, 400 * 1000, 0, 0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
