//! `heapprofd-client-bench`: the client benchmarks of docs/PERFORMANCE.md.
//!
//! Runs `tests/programs/client/bench.c` (1 and 2 threads of malloc/free
//! pairs, sizes 16..4096, call depth 20) without the library, with it
//! dormant, and with it active at 1 GiB (a handful of samples: the fast
//! paths alone), 512 KiB, 32 KiB and 4 KiB intervals
//! (`heapprofd-test-receiver` draining), interleaving the configurations in
//! every repetition so they share the machine's noise, and prints medians
//! and ratios against the baseline measured in the same run. Then it
//! measures the client-side cost of one sampled allocation with about 2, 8
//! and 32 KiB of stack copied: interval 1 minus dormant, in the bench's
//! "split" mode (all allocations, then all frees, each phase timed with the
//! thread's CPU clock), so the cost of a sample and the cost of recording
//! its free are told apart; with a 1 GiB ring so that nothing is dropped.
//!
//! Usage: `cargo run --release -p heapprofd-tests --bin heapprofd-client-bench --
//! [--reps N] [--pairs N] [--stack-pairs N]`

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use heapprofd_tests::client_harness::{
    Receiver, client_so, fields, programs, run, sessions, unique_socket,
};

const TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy)]
struct Sample {
    wall: f64,
    cpu: f64,
    alloc_cpu: f64,
    free_cpu: f64,
    mallocs: u64,
    overflow: u64,
    stack_bytes: u64,
}

fn receiver_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.with_file_name("heapprofd-test-receiver")
}

/// Ring buffer for the overhead runs: the receiver's default, 8 MiB
/// (heapprofd's default too).
const RING_DEFAULT: u64 = 8 << 20;
/// Ring buffer for the per-sample cost runs: big enough that nothing is
/// dropped even if the receiver falls behind (dropped records would be
/// cheaper and flatter the numbers).
const RING_BIG: u64 = 1 << 30;

/// The shape of one bench run.
#[derive(Debug, Clone, Copy)]
struct Shape {
    threads: u32,
    pairs: u64,
    depth: u32,
    stack_kib: u32,
    /// Allocate everything, then free everything, timing both phases.
    split: bool,
}

/// Runs the bench once. `interval`: None = no library, Some(0) = dormant.
fn bench(shape: Shape, interval: Option<u64>, seed: u64, ring: u64) -> Sample {
    let mut cmd = Command::new(programs().path("bench"));
    cmd.args([
        shape.threads.to_string(),
        shape.pairs.to_string(),
        shape.depth.to_string(),
        shape.stack_kib.to_string(),
        if shape.split { "split" } else { "pairs" }.to_string(),
    ]);
    let mut rx = None;
    match interval {
        None => {}
        Some(0) => {
            cmd.env("LD_PRELOAD", client_so());
        }
        Some(i) => {
            let r = Receiver::start(
                &receiver_bin(),
                &unique_socket("bench"),
                &[
                    "--interval",
                    &i.to_string(),
                    "--seed",
                    &seed.to_string(),
                    "--shmem-size",
                    &ring.to_string(),
                ],
            );
            cmd.env("LD_PRELOAD", client_so())
                .env("HEAPPROFD_SOCKET", &r.socket)
                .env("HEAPPROFD_BLOCKING_INIT", "1");
            rx = Some(r);
        }
    }
    let out = run(cmd, TIMEOUT);
    assert_eq!(out.code, Some(0), "bench failed: {}", out.stderr);
    let f = fields(&out.stdout);
    let mut s = Sample {
        wall: f["inner_ns"] as f64,
        cpu: f["cpu_ns"] as f64,
        alloc_cpu: f["alloc_cpu_ns"] as f64,
        free_cpu: f["free_cpu_ns"] as f64,
        mallocs: 0,
        overflow: 0,
        stack_bytes: 0,
    };
    if let Some(r) = rx {
        let lines = r.finish(TIMEOUT);
        for sess in sessions(&lines) {
            s.mallocs += sess.get("mallocs");
            s.overflow += sess.get("overflow");
            s.stack_bytes += sess.get("stack_bytes");
        }
    }
    s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let args = heapprofd_tests::bench_args::BenchArgs::parse(
        "usage: heapprofd-client-bench [--reps N] [--pairs N] [--stack-pairs N]\n\n\
         Times the preloaded client on tests/programs/client/bench.c against the bare program,\n\
         dormant and at several intervals, and the cost of one sampled malloc and free\n\
         (docs/PERFORMANCE.md, client). Build the release binaries first.",
        &["--reps N", "--pairs N", "--stack-pairs N"],
    );
    let reps: usize = args.value("--reps", 7);
    let pairs: u64 = args.value("--pairs", 2_000_000);
    let stack_pairs: u64 = args.value("--stack-pairs", 20_000);
    println!("client library: {}", client_so().display());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("loadavg at start: {}", load.trim());
    let configs: [(&str, Option<u64>); 6] = [
        ("baseline", None),
        ("dormant", Some(0)),
        // Active, but a handful of samples per run (4 GiB allocated in total):
        // the fast paths alone.
        ("1 GiB (~no samples)", Some(1 << 30)),
        ("512 KiB", Some(512 << 10)),
        ("32 KiB", Some(32 << 10)),
        ("4 KiB", Some(4 << 10)),
    ];
    println!("\n## Overhead ({reps} reps, {pairs} pairs/thread, depth 20; medians)\n");
    println!(
        "| threads | config | wall ms | wall ratio | wall ratio min..max | cpu ms | cpu ratio | samples/run | dropped/run |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for threads in [1u32, 2] {
        let mut res: Vec<Vec<Sample>> = vec![Vec::new(); configs.len()];
        for rep in 0..reps {
            // Rotate the order so no configuration always runs first.
            for k in 0..configs.len() {
                let c = (k + rep) % configs.len();
                let shape = Shape {
                    threads,
                    pairs,
                    depth: 20,
                    stack_kib: 0,
                    split: false,
                };
                res[c].push(bench(shape, configs[c].1, rep as u64 + 1, RING_DEFAULT));
            }
        }
        let base_wall = median(res[0].iter().map(|s| s.wall).collect());
        let base_cpu = median(res[0].iter().map(|s| s.cpu).collect());
        for (c, (name, _)) in configs.iter().enumerate() {
            // Per-rep ratios against the same rep's baseline show the noise.
            let ratios: Vec<f64> = res[c]
                .iter()
                .zip(&res[0])
                .map(|(s, b)| s.wall / b.wall)
                .collect();
            let (lo, hi) = ratios
                .iter()
                .fold((f64::MAX, 0f64), |(l, h), &r| (l.min(r), h.max(r)));
            let wall = median(res[c].iter().map(|s| s.wall).collect());
            let cpu = median(res[c].iter().map(|s| s.cpu).collect());
            let samples = median(res[c].iter().map(|s| s.mallocs as f64).collect());
            let dropped = median(res[c].iter().map(|s| s.overflow as f64).collect());
            println!(
                "| {threads} | {name} | {:.1} | {:.3} | {lo:.2}..{hi:.2} | {:.1} | {:.3} | {samples:.0} | {dropped:.0} |",
                wall / 1e6,
                wall / base_wall,
                cpu / 1e6,
                cpu / base_cpu
            );
        }
    }
    println!(
        "\n## Cost of one sampled allocation (interval 1, 1 thread, {stack_pairs} allocations \
         then {stack_pairs} frees; medians of {reps})\n"
    );
    println!(
        "| target stack | depth, pad | avg stack copied | ns per sampled malloc (cpu) | ns per recorded free (cpu) | dropped/run |"
    );
    println!("|---|---|---|---|---|---|");
    // Depth and pad chosen so the copy (frames + the top of the thread's
    // stack block) is about 2, 8 and 32 KiB; the table shows the real size.
    for (target, depth, pad) in [(2u32, 20u32, 0u32), (8, 20, 6), (32, 20, 30)] {
        let shape = Shape {
            threads: 1,
            pairs: stack_pairs,
            depth,
            stack_kib: pad,
            split: true,
        };
        let mut d_alloc = Vec::new();
        let mut d_free = Vec::new();
        let mut avg_stack = Vec::new();
        let mut dropped = Vec::new();
        for rep in 0..reps {
            let dormant = bench(shape, Some(0), 0, RING_BIG);
            let active = bench(shape, Some(1), rep as u64 + 1, RING_BIG);
            d_alloc.push((active.alloc_cpu - dormant.alloc_cpu) / stack_pairs as f64);
            d_free.push((active.free_cpu - dormant.free_cpu) / stack_pairs as f64);
            avg_stack.push(active.stack_bytes as f64 / active.mallocs.max(1) as f64);
            dropped.push(active.overflow as f64);
        }
        println!(
            "| {target} KiB | {depth}, {pad} KiB | {:.0} B | {:.0} | {:.0} | {:.0} |",
            median(avg_stack),
            median(d_alloc),
            median(d_free),
            median(dropped)
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("\nloadavg at end: {}", load.trim());
}
