//! `heapprofd-rs symbolize` and `report` on a trace from Perfetto's own
//! heapprofd: `tests/programs/perfetto/android_heapprofd_trace.py` writes,
//! with the official schema, a trace shaped as Android's heapprofd writes
//! one (its sequences, the fixed internings packet, a dump's
//! ProfilePacket with its InternedData in the same packet and the empty
//! one closing it, raw build ids, one string interner, frames naming the
//! empty string), with no symbols. Its mappings are a device's: the
//! program as `/system/bin/many_stacks`, a library inside an APK
//! (`.../base.apk!libdl_alloc.so`, at an offset of the APK) and bionic's
//! libc (a build id nobody has). Their build ids and `rel_pc`s are the
//! real binaries' (`readelf`, `nm`). `symbolize` with the binaries in a
//! directory must name every frame of the two modules it has, with
//! `file:line`s (the APK library found by its name without the
//! `base.apk!` prefix, Perfetto's rule), say what it did not find, and
//! keep the trace what the official schema accepts; heapprofd-rs's own
//! `report` then names the frames.

use std::path::{Path, PathBuf};
use std::process::Command;

use heapprofd_tests::client_harness::workspace_root;
use heapprofd_tests::record_harness::{
    check_trace, check_trace_script, heapprofd_ok, record_programs, scratch_dir,
};
use heapprofd_tests::symbolize_harness::{
    has_line, module_samples, module_symbol_lines, symbolize_ok,
};

const PROGRAM: &str = "/system/bin/many_stacks";
const APK_LIB: &str = "/data/app/~~f7Kx2Q==/com.example.app-9Zt0bQ==/base.apk!libdl_alloc.so";
const LIBC: &str = "/apex/com.android.runtime/lib64/bionic/libc.so";

fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The hex build id of an ELF file (`readelf -n`).
fn build_id(file: &Path) -> String {
    let notes = tool("readelf", &["-n", file.to_str().unwrap()]);
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {}", file.display()))
        .to_string()
}

/// An address inside function `name` of an ELF file (`nm -S`): its start
/// plus a few bytes, as a return address inside it would be.
fn pc_in(file: &Path, name: &str) -> u64 {
    let syms = tool("nm", &["-S", "--defined-only", file.to_str().unwrap()]);
    for l in syms.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() == 4 && f[3] == name && f[2].eq_ignore_ascii_case("t") {
            let addr = u64::from_str_radix(f[0], 16).unwrap();
            let size = u64::from_str_radix(f[1], 16).unwrap();
            return addr + 4.min(size - 1);
        }
    }
    panic!("no function {name} in {}", file.display())
}

/// The executable `PT_LOAD` of an ELF file: (file offset, virtual address).
fn exec_segment(file: &Path) -> (u64, u64) {
    let ph = tool("readelf", &["-lW", file.to_str().unwrap()]);
    for l in ph.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.first() == Some(&"LOAD") && f.len() >= 8 && f[6..f.len() - 1].contains(&"E") {
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            return (hex(f[1]), hex(f[2]));
        }
    }
    panic!("no executable segment in {}", file.display())
}

/// A device mapping of `file`'s executable segment at `base`, the ELF at
/// `start_offset` of the mapped file (an APK's stored library).
fn mapping(path: &str, file: &Path, base: u64, start_offset: u64) -> serde_json::Value {
    let (offset, vaddr) = exec_segment(file);
    let page = |x: u64| x & !0xfff;
    serde_json::json!({
        "path": path,
        "build_id": build_id(file),
        "start": base + page(vaddr),
        "end": base + page(vaddr) + 0x10000,
        "exact_offset": start_offset + page(offset),
        "start_offset": start_offset,
        "load_bias": vaddr - offset,
    })
}

/// The symbol directory (the program and the library) and the trace
/// `android_heapprofd_trace.py` writes (`--android-q` with `q`).
fn android_trace(dir: &Path, q: bool) -> (PathBuf, PathBuf) {
    let prog = record_programs().path("many_stacks");
    let lib = record_programs().path("libdl_alloc.so");
    let syms = dir.join("symbols");
    std::fs::create_dir_all(&syms).unwrap();
    std::fs::copy(&prog, syms.join("many_stacks")).unwrap();
    std::fs::copy(&lib, syms.join("libdl_alloc.so")).unwrap();

    let (init, malloc) = (0x4_a2c0, 0x3_e104);
    let pc = |name| pc_in(&prog, name);
    let spec = serde_json::json!({
        "pid": 4242,
        "cmdline": PROGRAM,
        "heap": "libc.malloc",
        "interval": 4096,
        "mappings": [
            mapping(PROGRAM, &prog, 0x5d12_3400_0000, 0),
            mapping(APK_LIB, &lib, 0x7a56_7800_0000, 0x20_0000),
            {
                "path": LIBC, "build_id": "5b1c0ffee0ddf00d5b1c0ffee0ddf00d5b1c0ffe",
                "start": 0x7b00_0000_0000_u64, "end": 0x7b00_0010_0000_u64,
                "exact_offset": 0x4_0000, "start_offset": 0, "load_bias": 0,
            },
        ],
        "stacks": [
            {
                "frames": [[2, init], [0, pc("main")], [0, pc("stack_recurse")],
                           [0, pc("stack_leaf")], [2, malloc]],
                "alloc_count": 3, "self_allocated": 96,
            },
            {
                "frames": [[2, init], [0, pc("main")], [1, pc_in(&lib, "dl_alloc")], [2, malloc]],
                "alloc_count": 2, "self_allocated": 96,
            },
        ],
    });
    let spec_file = dir.join("spec.json");
    std::fs::write(&spec_file, spec.to_string()).unwrap();
    let raw = dir.join("android.pftrace");
    let script = workspace_root().join("tests/programs/perfetto/android_heapprofd_trace.py");
    let mut c = Command::new("python3");
    c.arg(&script);
    if q {
        c.arg("--android-q");
    }
    let out = c
        .arg(&spec_file)
        .arg(&raw)
        .output()
        .expect("run android_heapprofd_trace.py");
    assert!(
        out.status.success(),
        "android_heapprofd_trace.py (needs the `perfetto` Python package: \
         scripts/install-deps.sh): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (syms, raw)
}

/// `report` of a trace: the frames of the two modules as module+offset
/// before `symbolize`, named after it.
fn assert_report_names(trace: &Path, named: bool) {
    let report = heapprofd_ok(&["report", trace.to_str().unwrap()]).stdout;
    for unnamed in ["many_stacks+0x", "base.apk!libdl_alloc.so+0x"] {
        assert_eq!(report.contains(unnamed), !named, "{unnamed}:\n{report}");
    }
    for f in ["stack_leaf", "stack_recurse", "samples  dl_alloc"] {
        assert_eq!(report.contains(f), named, "{f}:\n{report}");
    }
}

/// `symbolize`'s account: two modules of three found, libc named missing.
fn assert_found_two(stderr: &str) {
    assert!(stderr.contains("2 of 3 modules"), "{stderr}");
    assert!(stderr.contains(&format!("not found: {LIBC}")), "{stderr}");
}

#[test]
fn perfetto_heapprofd_trace_symbolized_and_reported() {
    let dir = scratch_dir("symbolize-perfetto");
    let (syms, raw) = android_trace(&dir, false);

    // As written: the official schema accepts it, nothing is named.
    check_trace(&raw);
    for m in [PROGRAM, APK_LIB] {
        let s = module_samples(&raw, m);
        assert!(!s.is_empty(), "{m}");
        assert!(
            s.iter().all(|(f, _)| f.iter().all(|n| n == "?")),
            "{m}: {s:?}"
        );
    }
    assert_report_names(&raw, false);

    let out = dir.join("symbolized.pftrace");
    assert_found_two(&symbolize_ok(&raw, &[&syms], &out).stderr);

    // Every frame of the two modules named, outermost first, as
    // trace_processor resolves them (mapping path + raw build id, rel_pc).
    let program = module_samples(&out, PROGRAM);
    assert!(
        program
            .iter()
            .any(|(f, c)| *c == 3 && f[1..4] == ["main", "stack_recurse", "stack_leaf"]),
        "{program:?}"
    );
    let apk = module_samples(&out, APK_LIB);
    assert!(
        apk.iter()
            .any(|(f, c)| *c == 2 && f[1..3] == ["main", "dl_alloc"]),
        "{apk:?}"
    );
    let lines = module_symbol_lines(&out, PROGRAM);
    for f in ["main", "stack_recurse", "stack_leaf"] {
        assert!(has_line(&lines, f, "many_stacks.c"), "{f}: {lines:?}");
    }
    let lines = module_symbol_lines(&out, APK_LIB);
    assert!(has_line(&lines, "dl_alloc", "libdl_alloc.c"), "{lines:?}");

    // heapprofd-rs's own report names them too.
    assert_report_names(&out, true);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Android 10's shape (the tables in the ProfilePacket): check_trace.py
/// does not resolve those, so the official schema is checked without its
/// frame summary, and heapprofd-rs's `report` (which reads them) shows
/// the names.
#[test]
fn android_10_trace_symbolized_and_reported() {
    let dir = scratch_dir("symbolize-perfetto-q");
    let (syms, raw) = android_trace(&dir, true);
    let schema = |t: &Path| {
        let out = Command::new("python3")
            .arg(check_trace_script())
            .arg(t)
            .output()
            .expect("run check_trace.py");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(out.status.success() && json["ok"] == true, "{json}");
        assert_eq!(json["summary"]["profile_packets"][0]["continued"], false);
    };
    schema(&raw);
    assert_report_names(&raw, false);
    let out = dir.join("symbolized.pftrace");
    assert_found_two(&symbolize_ok(&raw, &[&syms], &out).stderr);
    schema(&out);
    assert_report_names(&out, true);
    let _ = std::fs::remove_dir_all(&dir);
}
