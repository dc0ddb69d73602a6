//! `record`'s symbol cache (`--symbol-cache DIR`, `--no-symbol-cache`):
//! names found by one run are kept by build id and used by the next, and
//! never once a debug file appears that the first run looked for.
//!
//! `many_stacks` (built with `-g`) is copied, stripped of its debug
//! information but with `.symtab` and a `.gnu_debuglink` to its
//! `--only-keep-debug` file, which is moved away. A first run names the
//! program's frames from `.symtab` only (no `many_stacks.c:LINE`); with
//! the debug file back beside the binary (the binary unchanged), the next
//! run must name them with their lines, not reuse the first run's answers.

use std::path::Path;
use std::time::Duration;

use heapprofd_tests::record_harness::{heapprofd_ok, record, record_programs, scratch_dir};
use heapprofd_tests::symbolize_harness::{N, keep_debug, stripped};

/// Records `prog` at `-i 1` with `cache` args; the report's text.
fn run(prog: &Path, cache: &[&str], trace: &Path) -> String {
    let mut args = vec!["-i", "1", "-o", trace.to_str().unwrap()];
    args.extend_from_slice(cache);
    let out = record(
        &args,
        &[prog.to_str().unwrap(), &N.to_string()],
        Duration::from_secs(300),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let report = heapprofd_ok(&["report", trace.to_str().unwrap(), "--top", "50"]);
    report.stdout
}

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.filter_map(Result::ok).count())
}

#[test]
fn a_debug_file_that_appears_is_used_and_answers_are_reused_otherwise() {
    let dir = scratch_dir("symbol-cache");
    let cache = dir.join("cache");
    let cache_arg = ["--symbol-cache", cache.to_str().unwrap()];
    let debug = dir.join("many_stacks.debug");
    keep_debug(&record_programs().path("many_stacks"), &debug);
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let prog = bin.join("many_stacks");
    stripped(
        &record_programs().path("many_stacks"),
        &prog,
        "--strip-debug",
        Some(&debug),
    );
    let aside = dir.join("aside.debug");
    std::fs::rename(&debug, &aside).unwrap();

    // No debug file: names from `.symtab`, no lines; answers kept.
    let first = run(&prog, &cache_arg, &dir.join("1.pftrace"));
    assert!(first.contains("stack_leaf"), "{first}");
    assert!(!first.contains("many_stacks.c:"), "{first}");
    assert!(files_in(&cache) > 0, "nothing kept in {}", cache.display());

    // The same again: the same names, from the cache.
    let again = run(&prog, &cache_arg, &dir.join("2.pftrace"));
    assert!(again.contains("stack_leaf") && !again.contains("many_stacks.c:"));

    // The debug link's target appears beside the binary: lines.
    std::fs::rename(&aside, bin.join("many_stacks.debug")).unwrap();
    let linked = run(&prog, &cache_arg, &dir.join("3.pftrace"));
    assert!(
        linked.contains("stack_leaf (") && linked.contains("many_stacks.c:"),
        "{linked}"
    );
    // And those answers are kept and reused as they are.
    let reused = run(&prog, &cache_arg, &dir.join("4.pftrace"));
    let named = |r: &str| -> Vec<String> {
        let mut v: Vec<String> = r
            .lines()
            .filter(|l| l.contains("many_stacks.c:"))
            .map(|l| l.split_once("est.").map_or(l, |x| x.1).trim().to_owned())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(named(&linked), named(&reused));

    // --no-symbol-cache neither reads nor writes it.
    let off = dir.join("off");
    let o = run(
        &prog,
        &["--symbol-cache", off.to_str().unwrap(), "--no-symbol-cache"],
        &dir.join("5.pftrace"),
    );
    assert!(o.contains("many_stacks.c:"), "{o}");
    assert!(!off.exists(), "--no-symbol-cache wrote {}", off.display());
    let _ = std::fs::remove_dir_all(&dir);
}
