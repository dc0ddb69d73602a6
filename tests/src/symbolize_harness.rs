//! What the `symbolize` tests share: a `--no-symbolize` trace of
//! `many_stacks`, running `heapprofd-rs symbolize`, reading a trace's
//! frames back (their own names, else their offline symbols) and the
//! `ModuleSymbols` lines of one module, and preparing stripped binaries and
//! their debug files with binutils.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::client_harness::{Output, run};
use crate::record_harness::{check_trace, heapprofd, record, record_programs};

/// How many stacks `many_stacks` makes (one 32-byte block each, through
/// `stack_leaf`).
pub const N: usize = 5;

/// `many_stacks N` copied to `dir/bin/`, recorded at `-i 1` with
/// `--no-symbolize`: the program, the trace.
pub fn unsymbolized_trace(dir: &Path) -> (PathBuf, PathBuf) {
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

/// Per sample in the trace with a frame in `module`: its frames' names,
/// from the frame's own name or else its offline symbols (innermost inline
/// first, so reversed), outermost caller first; and its allocation count.
pub fn module_samples(trace: &Path, module: &str) -> Vec<(Vec<String>, u64)> {
    let t = check_trace(trace);
    let mut v = Vec::new();
    for s in t.json["summary"]["heap_samples"].as_array().unwrap() {
        let frames = s["frames"].as_array().unwrap();
        if !frames.iter().any(|f| f["mapping"] == module) {
            continue;
        }
        let mut names = Vec::new();
        for f in frames {
            if let Some(n) = f["function"].as_str().filter(|n| !n.is_empty()) {
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

/// [`module_samples`] of the program.
pub fn program_samples(trace: &Path, prog: &Path) -> Vec<(Vec<String>, u64)> {
    module_samples(trace, prog.to_str().unwrap())
}

/// One line of a `ModuleSymbols` address: function, source file, line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolLine {
    /// Function name.
    pub function: String,
    /// Source file, if the debug information has one.
    pub file: Option<String>,
    /// Line number, if the debug information has one.
    pub line: Option<u64>,
}

/// Every line of every address of the `ModuleSymbols` packets for `module`
/// (mapping path) in the trace.
pub fn module_symbol_lines(trace: &Path, module: &str) -> Vec<SymbolLine> {
    let t = check_trace(trace);
    let mut v = Vec::new();
    for m in t.json["summary"]["module_symbols"].as_array().unwrap() {
        if m["path"] != module {
            continue;
        }
        for a in m["symbols"].as_array().unwrap() {
            for l in a["lines"].as_array().unwrap() {
                v.push(SymbolLine {
                    function: l["function"].as_str().unwrap_or_default().to_string(),
                    file: l["file"].as_str().map(str::to_string),
                    line: l["line"].as_u64().filter(|&n| n > 0),
                });
            }
        }
    }
    v
}

/// Runs `heapprofd-rs symbolize ARGS`.
pub fn symbolize(args: &[&str]) -> Output {
    let mut c: Command = heapprofd();
    c.arg("symbolize").args(args);
    run(c, Duration::from_secs(120))
}

/// Runs `heapprofd-rs symbolize TRACE --symbols DIRS -o OUT` and expects
/// success; returns its output.
pub fn symbolize_ok(trace: &Path, dirs: &[&Path], out: &Path) -> Output {
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let o = symbolize(&[
        trace.to_str().unwrap(),
        "--symbols",
        &dirs.join(":"),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    o
}

/// Allocations of the samples whose innermost frame is `stack_leaf`, each
/// checked to go through `main`.
pub fn leaf_allocations(samples: &[(Vec<String>, u64)]) -> u64 {
    samples
        .iter()
        .filter(|(f, _)| f.last().is_some_and(|l| l == "stack_leaf"))
        .map(|(f, c)| {
            assert!(f.iter().any(|x| x == "main"), "{f:?}");
            c
        })
        .sum()
}

/// The build id of `module` as the trace's frames have it (hex).
pub fn trace_build_id(trace: &Path, module: &Path) -> String {
    let t = check_trace(trace);
    t.json["summary"]["heap_samples"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap().iter())
        .find(|f| f["mapping"] == module.to_str().unwrap())
        .and_then(|f| f["build_id"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no build id of {} in the trace", module.display()))
}

/// `dir/.build-id/xx/rest.debug` for a hex build id, its directory made.
pub fn build_id_file(dir: &Path, build_id: &str) -> PathBuf {
    let p = dir
        .join(".build-id")
        .join(&build_id[..2])
        .join(format!("{}.debug", &build_id[2..]));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    p
}

/// Runs a binutils command and expects success.
pub fn binutils(program: &str, args: &[&Path]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `objcopy --only-keep-debug BIN OUT`: the debug file of `bin`.
pub fn keep_debug(bin: &Path, out: &Path) {
    binutils("objcopy", &[Path::new("--only-keep-debug"), bin, out]);
}

/// `bin` stripped into `out` (`--strip-debug` keeps `.symtab`,
/// `--strip-all` does not), with a `.gnu_debuglink` to `debug` (its file
/// name and the CRC32 of its bytes now) when given.
pub fn stripped(bin: &Path, out: &Path, how: &str, debug: Option<&Path>) {
    binutils("objcopy", &[Path::new(how), bin, out]);
    if let Some(d) = debug {
        let arg = format!("--add-gnu-debuglink={}", d.display());
        binutils("objcopy", &[Path::new(&arg), out]);
    }
}

/// Whether a line of `v` names `function` with a file ending in `file` and
/// a line number.
pub fn has_line(v: &[SymbolLine], function: &str, file: &str) -> bool {
    v.iter().any(|l| {
        l.function == function
            && l.file.as_deref().is_some_and(|f| f.ends_with(file))
            && l.line.is_some()
    })
}
