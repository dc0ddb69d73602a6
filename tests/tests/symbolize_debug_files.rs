//! `heapprofd-rs symbolize` with split debug information: a `--no-symbolize`
//! trace of `many_stacks` (built with `-g`), then only a stripped copy of
//! the program and its `objcopy --only-keep-debug` file reachable, each
//! way the search allows:
//!
//! - by build id: `DIR/.build-id/xx/rest.debug` in a `--symbols` directory
//!   (beside a stripped binary found elsewhere, or alone);
//! - by `.gnu_debuglink` (`--add-gnu-debuglink`): the named file beside the
//!   binary, in `.debug/` beside it, and under a debug root (a `--symbols`
//!   directory) at the directory the program was mapped from.
//!
//! Each must give the program's frames names and `file:line`s (present
//! only in the debug file). Refused, with the frames left unnamed: a
//! debuglink target whose CRC32 is not the link's (named in a warning) and
//! a `.build-id` file of another build.

use std::path::{Path, PathBuf};

use heapprofd_tests::record_harness::{record_programs, scratch_dir};
use heapprofd_tests::symbolize_harness::{
    N, SymbolLine, build_id_file, has_line, keep_debug, leaf_allocations, module_symbol_lines,
    program_samples, stripped, symbolize_ok, trace_build_id, unsymbolized_trace,
};

/// The program's frames in the symbolized trace: names and lines.
fn symbolized(raw: &Path, prog: &Path, dirs: &[&Path], out: &Path) -> (u64, Vec<SymbolLine>) {
    symbolize_ok(raw, dirs, out);
    (
        leaf_allocations(&program_samples(out, prog)),
        module_symbol_lines(out, prog.to_str().unwrap()),
    )
}

/// Names and `many_stacks.c:LINE` for `stack_leaf`, `stack_recurse` and
/// `main`, and every allocation through `stack_leaf`.
fn assert_named_with_lines(case: &str, (leaf, lines): &(u64, Vec<SymbolLine>)) {
    assert_eq!(*leaf, N as u64, "{case}: {lines:?}");
    for f in ["stack_leaf", "stack_recurse", "main"] {
        assert!(
            has_line(lines, f, "many_stacks.c"),
            "{case}: {f}: {lines:?}"
        );
    }
}

fn dir_in(base: &Path, name: &str) -> PathBuf {
    let d = base.join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn split_debug_files_by_build_id_and_debuglink() {
    let dir = scratch_dir("symbolize-debug");
    let (prog, raw) = unsymbolized_trace(&dir);
    let build_id = trace_build_id(&raw, &prog);
    let work = dir_in(&dir, "work");
    let debug = work.join("many_stacks.debug");
    keep_debug(&prog, &debug);
    let strip_all = |out: &Path, link: Option<&Path>| stripped(&prog, out, "--strip-all", link);

    // The stripped binary alone: found (its build id), but nothing names
    // the frames. What every case below adds to.
    let bare = dir_in(&dir, "bare");
    strip_all(&bare.join("many_stacks"), None);
    let (leaf, lines) = symbolized(&raw, &prog, &[&bare], &dir.join("bare.pftrace"));
    assert_eq!(leaf, 0, "{lines:?}");
    assert!(lines.is_empty(), "{lines:?}");

    // By build id, in a second symbol directory: `--symbols BIN:DBG`.
    let dbg = dir_in(&dir, "dbg");
    std::fs::copy(&debug, build_id_file(&dbg, &build_id)).unwrap();
    let r = symbolized(&raw, &prog, &[&bare, &dbg], &dir.join("by-id.pftrace"));
    assert_named_with_lines("binary in BIN, debug file in DBG/.build-id", &r);

    // By build id with no binary at all: the debug file is the module.
    let r = symbolized(&raw, &prog, &[&dbg], &dir.join("by-id-alone.pftrace"));
    assert_named_with_lines("only DBG/.build-id", &r);

    // `.gnu_debuglink`, beside the binary. `--strip-debug` keeps `.symtab`
    // (names) but not the lines: the lines come from the debug file.
    let beside = dir_in(&dir, "beside");
    std::fs::copy(&debug, beside.join("many_stacks.debug")).unwrap();
    stripped(
        &prog,
        &beside.join("many_stacks"),
        "--strip-debug",
        Some(&debug),
    );
    let r = symbolized(&raw, &prog, &[&beside], &dir.join("beside.pftrace"));
    assert_named_with_lines("debuglink beside the binary", &r);

    // In `.debug/` beside the binary.
    let dotdebug = dir_in(&dir, "dotdebug");
    std::fs::copy(
        &debug,
        dir_in(&dotdebug, ".debug").join("many_stacks.debug"),
    )
    .unwrap();
    strip_all(&dotdebug.join("many_stacks"), Some(&debug));
    let r = symbolized(&raw, &prog, &[&dotdebug], &dir.join("dotdebug.pftrace"));
    assert_named_with_lines("debuglink in .debug/", &r);

    // Under a debug root, at the directory the program was mapped from:
    // `--symbols BIN:ROOT` with ROOT/<mapped dir>/many_stacks.debug.
    let bin = dir_in(&dir, "bin-linked");
    strip_all(&bin.join("many_stacks"), Some(&debug));
    let root = dir_in(&dir, "root");
    let mapped_dir = prog.parent().unwrap().strip_prefix("/").unwrap();
    std::fs::copy(
        &debug,
        dir_in(&root, mapped_dir.to_str().unwrap()).join("many_stacks.debug"),
    )
    .unwrap();
    let r = symbolized(&raw, &prog, &[&bin, &root], &dir.join("root.pftrace"));
    assert_named_with_lines("debuglink under the debug root", &r);
    // Without the root: nothing (the link's target is nowhere else).
    let (leaf, lines) = symbolized(&raw, &prog, &[&bin], &dir.join("no-root.pftrace"));
    assert_eq!(leaf, 0, "{lines:?}");

    // A debuglink target with another CRC32 (the same debug file with one
    // byte more: it would otherwise work): refused, named in a warning.
    let wrong = dir_in(&dir, "wrong-crc");
    let wrong_debug = wrong.join("many_stacks.debug");
    let mut bytes = std::fs::read(&debug).unwrap();
    bytes.push(0);
    std::fs::write(&wrong_debug, bytes).unwrap();
    strip_all(&wrong.join("many_stacks"), Some(&debug));
    let out_trace = dir.join("wrong-crc.pftrace");
    let o = symbolize_ok(&raw, &[&wrong], &out_trace);
    assert!(
        o.stderr
            .contains(&format!("warning: {}", wrong_debug.display()))
            && o.stderr.contains("CRC32"),
        "{}",
        o.stderr
    );
    assert_eq!(leaf_allocations(&program_samples(&out_trace, &prog)), 0);
    assert!(module_symbol_lines(&out_trace, prog.to_str().unwrap()).is_empty());

    // A `.build-id` debug file of another build (stepper's, placed under
    // this program's build id): not used.
    let other = dir_in(&dir, "other-build");
    let other_debug = work.join("stepper.debug");
    keep_debug(&record_programs().path("stepper"), &other_debug);
    std::fs::copy(&other_debug, build_id_file(&other, &build_id)).unwrap();
    let (leaf, lines) = symbolized(&raw, &prog, &[&bare, &other], &dir.join("other.pftrace"));
    assert_eq!(leaf, 0, "{lines:?}");
    assert!(lines.is_empty(), "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
