//! Unwinder benchmarks (plain `harness = false` binary, no framework).
//!
//! Run: `cargo bench -p heapprofd-unwinder --bench unwind`
//!
//! 1. **warm unwind**: a real sample of this process (registers + stack
//!    copied the way the client does it) taken inside libc's `qsort`
//!    comparator under a Rust recursion, about 30 frames, unwound again
//!    and again with one `ProcessContext` (module cache and framehop rule
//!    cache warm). Reported as unwinds/s on one core.
//!    Then the same with `unwind_raw` (addresses only, the daemon's hot
//!    path), and the replay check that stands in for a walk when a sample
//!    matches a traced one (`walk_inputs` + `stack_matches`).
//! 2. **warm symbolization**: `symbolize_frame` of every frame of that
//!    sample after the first pass (a per-module cache lookup).
//! 3. **cold start**: a fresh `ModuleCache`; parse libc for unwinding, then
//!    the first symbolization of a libc address (build-id lookup of the
//!    libc6-dbg debug file, decompressing its DWARF, symbol table,
//!    `addr2line` context). Median of a few runs.

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heapprofd_unwinder::{
    Arch, FdMaps, FdMemory, Frame, ModuleCache, ProcessContext, RawUnwind, StackSample,
    UnwindResult, WalkTrace, stack_matches, walk_inputs,
};

#[path = "../tests/integration_tests/selfcapture.rs"]
mod selfcapture;

use selfcapture::SelfSample;

static SAMPLE: Mutex<Option<SelfSample>> = Mutex::new(None);
static STACK_END: Mutex<u64> = Mutex::new(0);

extern "C" fn compare(a: *const libc::c_void, b: *const libc::c_void) -> libc::c_int {
    let mut slot = SAMPLE.lock().unwrap();
    if slot.is_none() {
        let end = *STACK_END.lock().unwrap();
        *slot = Some(selfcapture::capture(end));
    }
    // SAFETY: qsort passes pointers to elements of the i32 array below.
    let (x, y) = unsafe { (*(a as *const i32), *(b as *const i32)) };
    x.cmp(&y) as libc::c_int
}

#[inline(never)]
fn recurse_then_qsort(depth: u32) -> i32 {
    if depth == 0 {
        let mut v = [5i32, 3, 9, 1, 7, 2, 8, 6];
        // SAFETY: valid array, element size and comparator.
        unsafe {
            libc::qsort(
                v.as_mut_ptr().cast(),
                v.len(),
                std::mem::size_of::<i32>(),
                Some(compare),
            )
        };
        return v[0];
    }
    black_box(recurse_then_qsort(black_box(depth - 1))) + 1
}

fn context(cache: Arc<ModuleCache>) -> ProcessContext {
    ProcessContext::new(
        std::process::id(),
        Box::new(FdMaps::new(std::fs::File::open("/proc/self/maps").unwrap())),
        Box::new(FdMemory::new(
            std::fs::File::open("/proc/self/mem").unwrap(),
        )),
        cache,
    )
}

/// Runs `f` repeatedly for about `budget`; returns (iterations, elapsed).
fn time_loop(budget: Duration, mut f: impl FnMut()) -> (u64, Duration) {
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < budget {
        for _ in 0..1000 {
            f();
        }
        n += 1000;
    }
    (n, t0.elapsed())
}

fn names(ctx: &ProcessContext, r: &UnwindResult) -> Vec<String> {
    r.real_frames()
        .iter()
        .flat_map(|f| ctx.symbolize_frame(f).to_vec())
        .map(|s| s.function.unwrap_or_else(|| "??".into()))
        .collect()
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // useful either way, so a quick mode is taken from the environment.
    let quick = std::env::var_os("HEAPPROFD_BENCH_QUICK").is_some();
    let budget = Duration::from_millis(if quick { 50 } else { 3000 });

    let probe = 0u8;
    *STACK_END.lock().unwrap() = selfcapture::mapping_end(&probe as *const u8 as u64);
    recurse_then_qsort(18);
    let sample = SAMPLE.lock().unwrap().take().expect("comparator ran");

    // 1. Warm unwinding.
    let cache = Arc::new(ModuleCache::default());
    let mut ctx = context(Arc::clone(&cache));
    let unwind = |ctx: &mut ProcessContext| {
        ctx.unwind(Arch::X86_64, &sample.regs, sample.sp, &sample.stack, 0..0)
    };
    let first = unwind(&mut ctx);
    let frames = first.real_frames().len();
    let symbol_names = names(&ctx, &first);
    println!(
        "sample: {} stack bytes, {frames} frames, error {:?}",
        sample.stack.len(),
        first.error
    );
    println!("frames: {}", symbol_names.join(" <- "));
    let (n, dt) = time_loop(budget, || {
        black_box(unwind(&mut ctx));
    });
    let per = dt.as_nanos() as f64 / n as f64;
    println!(
        "warm unwind: {n} unwinds in {:.2?}: {:.0} ns/unwind, {:.0} unwinds/s, {:.1} ns/frame",
        dt,
        per,
        1e9 / per,
        per / frames as f64
    );

    // 1b. The hot-path API: addresses only, into a reused buffer.
    let mut raw = RawUnwind::default();
    let (n, dt) = time_loop(budget, || {
        ctx.unwind_raw(
            Arch::X86_64,
            &sample.regs,
            sample.sp,
            &sample.stack,
            0..0,
            &mut raw,
        );
        black_box(&raw);
    });
    let per = dt.as_nanos() as f64 / n as f64;
    println!(
        "warm unwind_raw: {n} unwinds in {:.2?}: {:.0} ns/unwind, {:.1} ns/frame",
        dt,
        per,
        per / raw.pcs.len().max(1) as f64
    );

    // 1c. Replaying the walk: the check that a sample would walk like a
    // traced one (what the daemon does instead of a walk on a hit).
    let mut trace = WalkTrace::default();
    let traced = StackSample {
        arch: Arch::X86_64,
        regs: &sample.regs,
        stack_pointer: sample.sp,
        stack: &sample.stack,
        skip: 0..0,
    };
    ctx.unwind_raw_traced(&traced, &mut raw, &mut trace);
    assert!(trace.replayable);
    let (n, dt) = time_loop(budget / 10, || {
        ctx.unwind_raw_traced(&traced, &mut raw, &mut trace);
    });
    println!(
        "traced walk (kept once per new trace): {:.1} us",
        dt.as_nanos() as f64 / n as f64 / 1000.0
    );
    let (n, dt) = time_loop(budget, || {
        let inputs = walk_inputs(Arch::X86_64, &sample.regs, sample.sp, &sample.stack);
        let ok = inputs.is_some_and(|(pc, sp, bp)| {
            pc == trace.pc && sp == trace.sp && trace.bp.is_none_or(|b| b == bp)
        }) && stack_matches(&trace.reads, sample.sp, &sample.stack);
        assert!(black_box(ok));
    });
    println!(
        "replay check: {:.0} ns per sample ({} stack words compared, bp {})",
        dt.as_nanos() as f64 / n as f64,
        trace.reads.len(),
        if trace.bp.is_some() { "used" } else { "unused" }
    );

    // 2. Warm symbolization (every frame was symbolized above).
    let frames_vec: Vec<Frame> = first.real_frames().to_vec();
    let (n, dt) = time_loop(budget, || {
        for f in &frames_vec {
            black_box(ctx.symbolize_frame(f));
        }
    });
    let per_frame = dt.as_nanos() as f64 / (n as f64 * frames_vec.len() as f64);
    println!(
        "warm symbolize: {:.1} ns/frame ({} frames per pass, {n} passes in {:.2?})",
        per_frame,
        frames_vec.len(),
        dt
    );

    // 3. Cold start for libc.
    let libc_frame = frames_vec
        .iter()
        .find(|f| {
            f.mapping
                .as_ref()
                .is_some_and(|m| m.path.contains("libc.so"))
        })
        .expect("a libc frame")
        .clone();
    let runs = if quick { 1 } else { 5 };
    let mut load = Vec::new();
    let mut first_sym = Vec::new();
    let mut sources = None;
    for _ in 0..runs {
        let cache = Arc::new(ModuleCache::default());
        let t0 = Instant::now();
        let ctx = context(Arc::clone(&cache));
        let t1 = Instant::now();
        let m = ctx
            .mapping_for(libc_frame.pc)
            .and_then(|m| m.module.clone())
            .expect("libc module");
        let syms = m.symbolize(libc_frame.rel_pc);
        let t2 = Instant::now();
        black_box(syms);
        load.push(t1 - t0);
        first_sym.push(t2 - t1);
        sources = Some(m.symbol_sources());
    }
    load.sort();
    first_sym.sort();
    println!(
        "cold: process context (maps + parse {} modules, libc included): median {:.2?}",
        cache.len(),
        load[load.len() / 2]
    );
    println!(
        "cold: first libc symbolization (debug file {:?}, dwarf {}): median {:.2?}",
        sources.as_ref().and_then(|s| s.debug_file.clone()),
        sources.as_ref().is_some_and(|s| s.has_dwarf),
        first_sym[first_sym.len() / 2]
    );
    let stats = ctx.stats();
    println!(
        "stats: {} unwinds, {} errors, {} map reparses, max unwind {:.2?}",
        stats.unwinds,
        stats.total_errors(),
        stats.map_reparses,
        stats.max_unwind_time
    );
}
