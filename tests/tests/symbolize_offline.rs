//! `heapprofd-rs symbolize`: a trace recorded with `--no-symbolize` (frames
//! with build ids and addresses only) gets `ModuleSymbols` from the
//! binaries in `--symbols` directories, matched by build id and searched
//! as `PERFETTO_BINARY_PATH` is (DIR/<mapping path>, DIR/<file name>,
//! DIR/.build-id/xx/rest.debug), a stripped binary's split debug file
//! found by build id; `check_trace.py` resolves every frame through them
//! as trace_processor does, and heapprofd-rs's own `report` and `convert`
//! show the names.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use heapprofd_tests::client_harness::run;
use heapprofd_tests::record_harness::{
    check_trace, heapprofd, heapprofd_ok, record, record_programs, scratch_dir,
};

const N: usize = 5;

/// `many_stacks N` copied to `dir/bin/`, recorded at `-i 1` with
/// `--no-symbolize`: the program, the trace.
fn unsymbolized_trace(dir: &Path) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let prog = dir.join("bin/many_stacks");
    std::fs::copy(record_programs().path("many_stacks"), &prog).unwrap();
    let trace = dir.join("raw.pftrace");
    let out = record(
        &["-i", "1", "--no-symbolize", "-o", trace.to_str().unwrap()],
        &[prog.to_str().unwrap(), &N.to_string()],
        Duration::from_secs(300),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    (prog, trace)
}

/// Per sample of `many_stacks` in the trace: its frames' names, from the
/// frame's own name or else its offline symbols (innermost inline first,
/// so reversed), outermost caller first; and its allocation count.
fn program_samples(trace: &Path, prog: &Path) -> Vec<(Vec<String>, u64)> {
    let t = check_trace(trace);
    let mut v = Vec::new();
    for s in t.json["summary"]["heap_samples"].as_array().unwrap() {
        let frames = s["frames"].as_array().unwrap();
        if !frames
            .iter()
            .any(|f| f["mapping"] == prog.to_str().unwrap())
        {
            continue;
        }
        let mut names = Vec::new();
        for f in frames {
            if let Some(n) = f["function"].as_str() {
                names.push(n.to_string());
            } else if let Some(syms) = f["symbols"].as_array() {
                names.extend(syms.iter().rev().map(|x| x.as_str().unwrap().to_string()));
            } else {
                names.push("?".into());
            }
        }
        v.push((names, s["alloc_count"].as_u64().unwrap()));
    }
    v
}

fn symbolize(args: &[&str]) -> heapprofd_tests::client_harness::Output {
    let mut c: Command = heapprofd();
    c.arg("symbolize").args(args);
    run(c, Duration::from_secs(120))
}

fn leaf_allocations(samples: &[(Vec<String>, u64)]) -> u64 {
    samples
        .iter()
        .filter(|(f, _)| f.last().is_some_and(|l| l == "stack_leaf"))
        .map(|(f, c)| {
            assert!(f.iter().any(|x| x == "main"), "{f:?}");
            c
        })
        .sum()
}

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
    let t = check_trace(&raw);
    let build_id = t.json["summary"]["heap_samples"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap().iter())
        .find(|f| f["mapping"] == prog.to_str().unwrap())
        .and_then(|f| f["build_id"].as_str())
        .expect("the program's build id")
        .to_string();
    let debug = by_id
        .join(".build-id")
        .join(&build_id[..2])
        .join(format!("{}.debug", &build_id[2..]));
    std::fs::create_dir_all(debug.parent().unwrap()).unwrap();
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
