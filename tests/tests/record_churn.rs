//! `heapprofd-rs record` of `tests/programs/churn/` (issue 11): a program
//! that loads and unloads libraries round after round (each with its own
//! build id, three loaded at a time so their addresses move) and starts
//! two short-lived allocating threads per round. Modules are evicted from
//! the daemon's cache as they are unloaded; this checks, at `-i 1`, that
//! nothing is lost or counted twice on the way: with continuous dumps, the
//! trace has every allocation and free heaptrack sees, and the kept blocks
//! of every library.
//!
//! And that the stacks are right: the daemon unwinds a sample after the
//! fact, so without the client's `dlclose` barrier (the daemon catches up
//! before a library goes, and re-reads the maps after) a library unloaded
//! (or replaced at the same address) by then cut the stack or named the
//! wrong library (docs/PERFORMANCE.md, "Unwinding samples of unloaded
//! libraries"). Every allocation made by a library's own function must
//! have a stack named after that library's functions, and no stack may end
//! in an error frame.

use std::path::{Path, PathBuf};
use std::time::Duration;

use heapprofd_tests::client_harness::{compile, run, workspace_root};
use heapprofd_tests::record_harness::{Heaptrack, check_trace, heapprofd, record, scratch_dir};

const TIMEOUT: Duration = Duration::from_secs(300);
/// Libraries built.
const LIBS: usize = 10;
/// Rounds run (each library loaded six times).
const ROUNDS: &str = "60";
/// The block each library's first call keeps for good.
const KEPT: u64 = 65536;

/// The library number of a frame named after one of a library's own
/// functions (`plugin_leaf_7`, `plugin_descend_7`: library 7).
fn plugin_of(frame: &str) -> Option<usize> {
    let k = frame
        .strip_prefix("plugin_leaf_")
        .or_else(|| frame.strip_prefix("plugin_descend_"))?;
    k.parse().ok()
}

/// Every allocation of a library's `plugin_leaf` (each `churn_work` call
/// makes 24, the first call of each library one more it keeps) is
/// attributed to a stack whose innermost frame is that function and whose
/// library frames all name the same library; no stack has an error frame.
fn check_stacks(latest: &[heapprofd_tests::record_harness::Sample], rounds: u64) {
    let (mut plugin_allocs, mut errors, mut shown) = (0u64, 0u64, 0);
    for s in latest {
        if s.frames.iter().any(|f| f.starts_with("ERROR")) {
            errors += s.alloc_count;
            if shown < 5 {
                eprintln!("cut stack ({} allocations): {:?}", s.alloc_count, s.frames);
                shown += 1;
            }
        }
        let Some(k) = s.frames.last().and_then(|f| {
            f.starts_with("plugin_leaf_")
                .then(|| plugin_of(f))
                .flatten()
        }) else {
            continue;
        };
        plugin_allocs += s.alloc_count;
        for f in &s.frames {
            if let Some(j) = plugin_of(f) {
                assert_eq!(j, k, "a stack mixes libraries {k} and {j}: {:?}", s.frames);
            }
        }
        // The leaf's caller: the descent of the same library, or (the kept
        // block, a tail call from churn_work) churn's main.
        let caller = &s.frames[s.frames.len().saturating_sub(2)];
        assert!(
            caller == &format!("plugin_descend_{k}") || caller == "main",
            "plugin_leaf_{k} called from {caller}: {:?}",
            s.frames
        );
    }
    assert_eq!(errors, 0, "allocations with a cut stack");
    assert_eq!(
        plugin_allocs,
        rounds * 3 * 24 + LIBS as u64,
        "allocations attributed to a library's plugin_leaf"
    );
}

/// Builds the libraries and the program into `dir`; returns the program.
fn build(dir: &Path) -> PathBuf {
    let src = workspace_root().join("tests/programs/churn");
    let plugin = src.join("plugin.c").to_string_lossy().into_owned();
    for k in 0..LIBS {
        let out = dir.join(format!("libplugin_{k}.so"));
        let def = format!("-DPLUGIN={k}");
        compile(&[
            "gcc",
            "-O2",
            "-g",
            "-shared",
            "-fPIC",
            &def,
            "-o",
            &out.to_string_lossy(),
            &plugin,
        ]);
    }
    let prog = dir.join("churn");
    compile(&[
        "gcc",
        "-O2",
        "-g",
        "-pthread",
        "-Wall",
        "-Werror",
        "-o",
        &prog.to_string_lossy(),
        &src.join("churn.c").to_string_lossy(),
        "-ldl",
    ]);
    prog
}

#[test]
fn every_allocation_of_a_churning_program_is_counted_at_interval_1() {
    let dir = scratch_dir("churn");
    let prog = build(&dir);
    let (prog_s, dir_s, libs) = (
        prog.to_string_lossy().into_owned(),
        dir.to_string_lossy().into_owned(),
        LIBS.to_string(),
    );
    let cmd = [prog_s.as_str(), dir_s.as_str(), libs.as_str(), ROUNDS];
    let trace = dir.join("t.pftrace").to_string_lossy().into_owned();
    let out = record(&["-i", "1", "-c", "200ms", "-o", &trace], &cmd, TIMEOUT);
    assert_eq!(out.code, Some(0), "record failed:\n{}", out.stderr);
    assert_eq!(out.stdout, format!("rounds {ROUNDS}\n"));
    let summary = check_trace(Path::new(&trace));
    summary.assert_non_decreasing();
    assert_eq!(summary.pids().len(), 1, "one process");
    for d in &summary.dumps {
        for flag in ["buffer_overran", "buffer_corrupted", "hit_guardrail"] {
            assert_eq!(d[flag], false, "{flag} set:\n{d}");
        }
    }
    let latest = summary.latest();
    check_stacks(&latest, ROUNDS.parse().unwrap());
    let allocs: u64 = latest.iter().map(|s| s.alloc_count).sum();
    let bytes: u64 = latest.iter().map(|s| s.allocated).sum();
    let frees: u64 = latest.iter().map(|s| s.free_count).sum();
    let live: u64 = bytes - latest.iter().map(|s| s.freed).sum::<u64>();
    eprintln!("ours: {allocs} allocations of {bytes} bytes, {frees} frees, {live} bytes live");

    let ht_dir = dir.join("heaptrack");
    std::fs::create_dir_all(&ht_dir).unwrap();
    let ht = Heaptrack::run(&cmd, &ht_dir);
    // heaptrack's preload is C++: libstdc++'s start-up allocation in
    // ld.so's `_dl_init` is its, not the program's.
    let startup = |frames: &[String]| frames.iter().any(|f| f.starts_with("_dl_init"));
    let ht_allocs: u64 = ht
        .allocations
        .iter()
        .filter(|(f, _)| !startup(f))
        .map(|(_, n)| n)
        .sum();
    let ht_leaked: u64 = ht.leaked.iter().map(|(_, n)| n).sum();
    eprintln!(
        "heaptrack: {} allocations ({ht_allocs} the program's) of {} bytes, \
         {ht_leaked} bytes leaked",
        ht.total_calls, ht.total_bytes
    );
    assert_eq!(allocs, ht_allocs, "allocations: ours vs heaptrack");
    // Each library's 24 blocks a call, three calls a round, and its kept
    // block: the bulk of what both count.
    let rounds: u64 = ROUNDS.parse().unwrap();
    assert!(allocs >= rounds * 3 * 24 + LIBS as u64, "{allocs}");
    // Every library kept its block: live at the end, in both.
    assert!(live >= LIBS as u64 * KEPT, "{live} bytes live");
    assert!(ht_leaked >= LIBS as u64 * KEPT, "{ht_leaked} bytes leaked");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Fresh copies: every round loads a new copy of a library (a new build
/// id, so new mappings, frames and stacks that never come back). The
/// callsites of copies already unloaded go idle and are retired from the
/// daemon's tree during the run (`Profile::retire_idle`), and their
/// frames, mappings and strings from its interner
/// (`Interner::retire_unused`, two passes at least 2 s apart: the run
/// lasts longer than that); the trace must still have every allocation,
/// each under its library's functions, and no stack may end in an error
/// frame (a frame dropped while a stack that names it was on its way).
#[test]
fn retiring_the_stacks_of_unloaded_copies_loses_no_allocation() {
    const FRESH_ROUNDS: u64 = 2000;
    let dir = scratch_dir("churn-fresh");
    let prog = build(&dir);
    let trace = dir.join("t.pftrace");
    let rounds = FRESH_ROUNDS.to_string();
    let mut c = heapprofd();
    c.env("HEAPPROFD_DEBUG", "1")
        .args(["record", "-i", "1", "-c", "100ms", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&prog)
        .arg(&dir)
        .arg(LIBS.to_string())
        .arg(&rounds)
        // 2 ms after each round: at least 4 s in all.
        .args(["2000", "fresh"]);
    let out = run(c, TIMEOUT);
    assert_eq!(out.code, Some(0), "record failed:\n{}", out.stderr);
    assert_eq!(out.stdout, format!("rounds {FRESH_ROUNDS}\n"));
    // HEAPPROFD_DEBUG's lines: callsites retired, interned frames dropped.
    let number_after = |tag: &str| -> usize {
        out.stderr
            .lines()
            .filter_map(|l| {
                let rest = l.split(tag).nth(1)?;
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .sum()
    };
    assert!(
        number_after("retired ") > 0,
        "no callsite retired:\n{}",
        out.stderr
    );
    assert!(
        number_after("dropped (") > 0,
        "no interned frame dropped:\n{}",
        out.stderr
    );
    let summary = check_trace(&trace);
    summary.assert_non_decreasing();
    check_stacks(&summary.latest(), FRESH_ROUNDS);
    let _ = std::fs::remove_dir_all(&dir);
}
