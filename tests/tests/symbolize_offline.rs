//! `heapprofd-rs symbolize`: a trace recorded with `--no-symbolize` (frames
//! with build ids and addresses only) gets `ModuleSymbols` from the
//! binaries in `--symbols` directories, matched by build id and searched
//! as `PERFETTO_BINARY_PATH` is (DIR/<mapping path>, DIR/<file name>,
//! DIR/.build-id/xx/rest.debug), a stripped binary's split debug file
//! found by build id; `check_trace.py` resolves every frame through them
//! as trace_processor does, and heapprofd-rs's own `report` and `convert`
//! show the names.

use std::path::Path;
use std::process::Command;

use heapprofd_tests::record_harness::{heapprofd_ok, record_programs, scratch_dir};
use heapprofd_tests::symbolize_harness::{
    N, build_id_file, leaf_allocations, program_samples, symbolize, trace_build_id,
    unsymbolized_trace,
};

/// heapprofd-rs's own `report` and `convert --collapsed` read the offline
/// symbols too: the symbolized trace names `stack_leaf`, the input does
/// not (its frames are `many_stacks+0x...`).
fn names_in_report_and_convert(raw: &Path, symbolized: &Path) {
    for (trace, named) in [(raw, false), (symbolized, true)] {
        let t = trace.to_str().unwrap();
        let report = heapprofd_ok(&["report", t]).stdout;
        let folded = heapprofd_ok(&["convert", t, "--collapsed", "-"]).stdout;
        assert_eq!(report.contains("stack_leaf"), named, "{t}:\n{report}");
        assert_eq!(folded.contains("stack_leaf"), named, "{t}:\n{folded}");
        assert_eq!(
            folded.contains("many_stacks+0x"),
            !named,
            "{t}: unnamed program frames:\n{folded}"
        );
        if named {
            // An inline chain or not, the program's stacks go through main.
            let leaf_lines: Vec<&str> = folded
                .lines()
                .filter(|l| l.contains("stack_leaf"))
                .collect();
            assert!(!leaf_lines.is_empty());
            for l in leaf_lines {
                assert!(l.contains(";main;"), "{l}");
            }
        }
    }
}

#[test]
fn symbols_by_build_id_from_the_symbol_directories() {
    let dir = scratch_dir("symbolize");
    let (prog, raw) = unsymbolized_trace(&dir);
    let before = program_samples(&raw, &prog);
    assert!(!before.is_empty());
    assert_eq!(leaf_allocations(&before), 0, "unsymbolized: {before:?}");

    // `other/` holds another program under the same name (another build
    // id): skipped; `syms/` the program itself.
    let other = dir.join("other");
    let syms = dir.join("syms");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::create_dir_all(&syms).unwrap();
    std::fs::copy(record_programs().path("stepper"), other.join("many_stacks")).unwrap();
    std::fs::copy(&prog, syms.join("many_stacks")).unwrap();
    let out_trace = dir.join("sym.pftrace");
    let dirs = format!("{}:{}", other.display(), syms.display());
    let out = symbolize(&[
        raw.to_str().unwrap(),
        "--symbols",
        &dirs,
        "-o",
        out_trace.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let after = program_samples(&out_trace, &prog);
    assert_eq!(leaf_allocations(&after), N as u64, "{after:?}");
    names_in_report_and_convert(&raw, &out_trace);

    // Only `.build-id/xx/rest.debug` (the program under its build id).
    let by_id = dir.join("by-id");
    let build_id = trace_build_id(&raw, &prog);
    let debug = build_id_file(&by_id, &build_id);
    std::fs::copy(&prog, &debug).unwrap();
    let out_trace = dir.join("sym-by-id.pftrace");
    let out = symbolize(&[
        raw.to_str().unwrap(),
        "--symbols",
        by_id.to_str().unwrap(),
        "-o",
        out_trace.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        leaf_allocations(&program_samples(&out_trace, &prog)),
        N as u64
    );

    // Split debug: the program stripped of every symbol, its debug file
    // under `.build-id/` in the same directory (a debug directory too).
    let split = dir.join("split");
    std::fs::create_dir_all(split.join(".build-id").join(&build_id[..2])).unwrap();
    let stripped = split.join("many_stacks");
    let status = Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&stripped)
        .arg(&prog)
        .status()
        .expect("run strip");
    assert!(status.success());
    let status = Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&prog)
        .arg(
            split
                .join(".build-id")
                .join(&build_id[..2])
                .join(format!("{}.debug", &build_id[2..])),
        )
        .status()
        .expect("run objcopy");
    assert!(status.success());
    let out_trace = dir.join("sym-split.pftrace");
    let out = symbolize(&[
        raw.to_str().unwrap(),
        "--symbols",
        split.to_str().unwrap(),
        "-o",
        out_trace.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        !out.stderr
            .contains(&format!("not found: {}", prog.display())),
        "{}",
        out.stderr
    );
    assert_eq!(
        leaf_allocations(&program_samples(&out_trace, &prog)),
        N as u64
    );

    // Nothing matching: an error that says what to do.
    let out = symbolize(&[
        raw.to_str().unwrap(),
        "--symbols",
        other.to_str().unwrap(),
        "-o",
        dir.join("none.pftrace").to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("give --symbols the directories"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}
