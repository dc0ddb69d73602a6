//! The stack-request API's in-process walk (`heapprofd_walk_stack`, issue
//! 15) against real programs under `LD_PRELOAD`: `tests/programs/walk/`.
//!
//! - gdb agrees: at a breakpoint on the client's entry, gdb's physical
//!   frames (past `main`, to `_start`) are exactly the pcs the walk then
//!   delivers, for C built `-O2 -fomit-frame-pointer` and for C++ (the
//!   same flags) through a shared library's template frames, a virtual
//!   call and a `std::function`.
//! - Real signal handlers: SIGPROF (`setitimer`, and a thread sending
//!   SIGPROF to the burner one at a time) while the program burns CPU in
//!   three functions, and while it loops on `malloc`/`free` (so handlers
//!   interrupt the allocator itself, glibc's and the client's hooks), on
//!   the main thread and on a thread of its own; every walk starts at the
//!   interrupted pc (unbiased) and reaches the root, none crashes or hangs.
//! - A library `dlopen`ed after `heapprofd_walk_prepare` (by path, or by
//!   a bare name found through `LD_LIBRARY_PATH` or the program's
//!   `DT_RPATH`) is walked through without preparing again: the exported
//!   `dlopen` hook rebuilt the tables. A bare name only the caller's
//!   `DT_RUNPATH` finds still loads (the hook left the call to glibc) and
//!   needs the documented second prepare.
//! - Walks interrupting the table updates of a `dlopen`/`dlclose` loop on
//!   the same thread end, or fail with NO_UNWIND_INFO in code of the
//!   library being loaded or unloaded; none crashes.
//! - A frame in generated code named by `/tmp/perf-PID.map` is JIT, and
//!   the walk continues through it (frame pointers) to `_start`.
//! - Failures, not crashes: a pc in no object, a stack of garbage return
//!   addresses, a stack pointer on no stack, recursion past the depth
//!   limit.
//! - Without the client, the header's functions are the documented no-op.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use heapprofd_tests::client_harness::{client_so, compile, run, workspace_root};

const TIMEOUT: Duration = Duration::from_secs(600);
/// Walks per signal test (about 20 s each on a loaded 2-core machine).
const SIGNAL_WALKS: u64 = 20_000;

/// Where the programs were built.
fn programs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = workspace_root().join("tests/programs/walk");
        let include = workspace_root().join("client/include");
        let dir = std::env::temp_dir().join(format!("heapprofd-walk-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let s = |f: &str| src.join(f).to_string_lossy().into_owned();
        let o = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let inc = format!("-I{}", include.display());
        let flags = ["-O2", "-g", "-fomit-frame-pointer"];
        let mut c = vec!["gcc"];
        c.extend(flags);
        c.extend(["-rdynamic", "-pthread", &inc, "-o"]);
        let (out, walk_c) = (o("walk"), s("walk.c"));
        c.extend([out.as_str(), walk_c.as_str()]);
        compile(&c);
        let (lib, lib_src) = (o("libwalklib.so"), s("walklib.cpp"));
        let mut l = vec!["g++"];
        l.extend(flags);
        l.extend(["-shared", "-fPIC", "-o", &lib, &lib_src]);
        compile(&l);
        let (exe, exe_src) = (o("walk_cxx"), s("walk_cxx.cpp"));
        let (incsrc, libdir, rpath) = (
            format!("-I{}", src.display()),
            format!("-L{}", dir.display()),
            format!("-Wl,-rpath,{}", dir.display()),
        );
        let mut x = vec!["g++"];
        x.extend(flags);
        x.extend([
            &inc,
            &incsrc,
            "-o",
            &exe,
            &exe_src,
            &libdir,
            "-lwalklib",
            &rpath,
        ]);
        compile(&x);
        let (dlib, dlib_src) = (o("libdlwalk.so"), s("dlwalklib.c"));
        let mut d = vec!["gcc"];
        d.extend(flags);
        d.extend(["-shared", "-fPIC", "-o", &dlib, &dlib_src]);
        compile(&d);
        // dlwalk without a search path of its own, with DT_RUNPATH and
        // with DT_RPATH naming the directory.
        let dlwalk_src = s("dlwalk.c");
        let runpath = format!("-Wl,--enable-new-dtags,-rpath,{}", dir.display());
        let rpath_old = format!("-Wl,--disable-new-dtags,-rpath,{}", dir.display());
        for (name, extra) in [
            ("dlwalk", None),
            ("dlwalk_runpath", Some(&runpath)),
            ("dlwalk_rpath", Some(&rpath_old)),
        ] {
            let out = o(name);
            let mut c = vec!["gcc"];
            c.extend(flags);
            c.extend(["-rdynamic", &inc, "-o", &out, &dlwalk_src, "-ldl"]);
            c.extend(extra.map(String::as_str));
            compile(&c);
        }
        dir
    })
}

fn walk_prog(args: &[&str]) -> String {
    let mut cmd = Command::new(programs().join("walk"));
    cmd.args(args).env("LD_PRELOAD", client_so());
    let out = run(cmd, TIMEOUT);
    assert_eq!(
        out.code,
        Some(0),
        "walk {args:?} crashed or failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// (type, pc) of the FRAME lines, and the last line ("END", "FAIL n").
fn frames(out: &str) -> (Vec<(u32, u64)>, String) {
    let mut f = Vec::new();
    let mut last = String::new();
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["FRAME", t, pc] => f.push((t.parse().unwrap(), u64::from_str_radix(pc, 16).unwrap())),
            ["END"] | ["FAIL", _] => last = l.to_string(),
            _ => {}
        }
    }
    (f, last)
}

/// Runs `exe` under gdb; gdb's frames below the client's entry (pc, name)
/// and the program's own output.
fn under_gdb(exe: &Path, args: &[&str]) -> (Vec<(u64, String)>, String) {
    let script = workspace_root().join("tests/programs/walk/gdb_bt.py");
    let mut cmd = Command::new("gdb");
    cmd.args(["-batch", "-nx", "-ex"])
        .arg(format!(
            "set environment LD_PRELOAD={}",
            client_so().display()
        ))
        .arg("-x")
        .arg(&script)
        .arg("--args")
        .arg(exe)
        .args(args);
    let out = run(cmd, TIMEOUT);
    let stdout = out.stdout;
    let gdb: Vec<(u64, String)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("GDB "))
        .map(|l| {
            let (pc, name) = l.split_once(' ').unwrap();
            (u64::from_str_radix(pc, 16).unwrap(), name.to_string())
        })
        .collect();
    assert!(
        gdb.first()
            .is_some_and(|f| f.1 == "heapprofd_rs_walk_stack"),
        "gdb did not stop at the client's entry:\n{stdout}\n{}",
        out.stderr
    );
    (gdb[1..].to_vec(), stdout)
}

#[track_caller]
fn check_same_as_gdb(exe: &Path, args: &[&str], expect_names: &[&str]) {
    let (gdb, out) = under_gdb(exe, args);
    let (walked, last) = frames(&out);
    let gdb_pcs: Vec<u64> = gdb.iter().map(|f| f.0).collect();
    let walked_pcs: Vec<u64> = walked.iter().map(|f| f.1).collect();
    let names: Vec<&str> = gdb.iter().map(|f| f.1.as_str()).collect();
    assert_eq!(walked_pcs, gdb_pcs, "walk vs gdb ({names:?})\n{out}");
    assert_eq!(last, "END", "{out}");
    assert!(walked.iter().all(|f| f.0 == 1), "all native: {walked:?}");
    assert!(out.contains("RC 0 BIASED 1"), "{out}");
    // The frames gdb names are the program's call chain, to _start.
    for want in expect_names {
        assert!(
            names.iter().any(|n| n.contains(want)),
            "{want} not in {names:?}"
        );
    }
    assert_eq!(names.last().copied(), Some("_start"), "{names:?}");
}

#[test]
fn c_without_frame_pointers_matches_gdb() {
    let exe = programs().join("walk");
    check_same_as_gdb(&exe, &["chain"], &["leaf", "c_fn", "b_fn", "a_fn", "main"]);
}

#[test]
fn cxx_through_a_shared_library_matches_gdb() {
    let exe = programs().join("walk_cxx");
    check_same_as_gdb(
        &exe,
        &[],
        &[
            "Walker::walk_now",
            "Walker::visit",
            "walklib::relay<0>",
            "walklib::relay<2>",
            "walklib::run",
            "Outer::go",
            "main",
        ],
    );
}

/// The counters a signal run prints.
fn counter(out: &str, key: &str) -> u64 {
    let w: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("WALKS "))
        .unwrap_or_else(|| panic!("no WALKS line:\n{out}"))
        .split_whitespace()
        .collect();
    let i = w.iter().position(|x| *x == key).unwrap();
    w[i + 1].parse().unwrap()
}

/// INNER lines: (symbol, object) where the kept walks started.
fn inner(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| l.strip_prefix("INNER "))
        .map(|l| {
            let (s, o) = l.split_once(' ').unwrap();
            (s.to_string(), o.to_string())
        })
        .collect()
}

#[test]
fn sigprof_walks_start_at_the_interrupted_function() {
    let n = SIGNAL_WALKS.to_string();
    let out = walk_prog(&["sigprof", &n]);
    let walks = counter(&out, "WALKS");
    assert!(walks >= SIGNAL_WALKS, "{out}");
    // Every walk's first frame is the interrupted pc of the ucontext,
    // unbiased, and every one reached main and the root.
    assert_eq!(counter(&out, "MISMATCHED"), 0, "{out}");
    assert_eq!(counter(&out, "ENDED"), walks, "{out}");
    assert_eq!(counter(&out, "REACHED_MAIN"), walks, "{out}");
    // The burner spends nearly all its time in burn_c (the innermost loop).
    let inner = inner(&out);
    let in_burn = inner.iter().filter(|(s, _)| s.starts_with("burn_")).count();
    assert!(
        in_burn * 10 >= inner.len() * 9,
        "{in_burn} of {}",
        inner.len()
    );
}

#[test]
fn sigprof_walks_on_a_thread_reach_its_start_function() {
    // The thread's stack bounds come from /proc/self/maps on its first
    // walk (it never sampled), then from its TLS block.
    let out = walk_prog(&["sigprof", "5000", "thread"]);
    let walks = counter(&out, "WALKS");
    assert!(walks >= 5000, "{out}");
    assert_eq!(counter(&out, "MISMATCHED"), 0, "{out}");
    assert_eq!(counter(&out, "ENDED"), walks, "{out}");
    // REACHED_MAIN counts walks through burn_thread here.
    assert_eq!(counter(&out, "REACHED_MAIN"), walks, "{out}");
    let inner = inner(&out);
    let in_burn = inner.iter().filter(|(s, _)| s.starts_with("burn_")).count();
    assert!(
        in_burn * 10 >= inner.len() * 9,
        "{in_burn} of {}",
        inner.len()
    );
}

#[test]
fn handlers_interrupting_malloc_walk_it() {
    let n = SIGNAL_WALKS.to_string();
    let out = walk_prog(&["malloc", &n]);
    let walks = counter(&out, "WALKS");
    assert!(walks >= SIGNAL_WALKS, "{out}");
    assert_eq!(counter(&out, "MISMATCHED"), 0, "{out}");
    assert_eq!(counter(&out, "ENDED"), walks, "{out}");
    assert_eq!(counter(&out, "REACHED_MAIN"), walks, "{out}");
    // Walks started inside the allocator: glibc's malloc/free and the
    // client's hooks (the walk allocates nothing, else glibc's arena lock,
    // held by the interrupted malloc, would deadlock the handler).
    let inner = inner(&out);
    let in_libc = inner.iter().filter(|(_, o)| o.contains("libc.so")).count();
    let in_client = inner
        .iter()
        .filter(|(_, o)| o.contains("libheapprofd_client"))
        .count();
    assert!(
        in_libc * 4 >= inner.len(),
        "{in_libc} of {} in libc",
        inner.len()
    );
    assert!(in_client > 0, "no walk started in the client's hooks");
}

/// The REASON lines: (reason, count).
fn reasons(out: &str) -> Vec<(u32, u64)> {
    out.lines()
        .filter_map(|l| l.strip_prefix("REASON "))
        .map(|l| {
            let (r, n) = l.split_once(' ').unwrap();
            (r.parse().unwrap(), n.parse().unwrap())
        })
        .collect()
}

#[test]
fn walks_interrupting_dlopen_and_dlclose_are_safe() {
    let lib = programs().join("libwalklib.so");
    let out = walk_prog(&["dlchurn", "5000", &lib.to_string_lossy()]);
    let walks = counter(&out, "WALKS");
    assert!(walks >= 5000, "{out}");
    assert!(
        counter(&out, "ALLOCS") > 0,
        "no dlopen/dlclose round: {out}"
    );
    assert_eq!(counter(&out, "MISMATCHED"), 0, "{out}");
    // Most walks end. The others interrupted code of the library while
    // glibc loaded or unloaded it (its constructors, destructors), when
    // the tables do not hold it: NO_UNWIND_INFO (1), never anything else.
    let failed: u64 = reasons(&out).iter().map(|r| r.1).sum();
    assert!(reasons(&out).iter().all(|r| r.0 == 1), "{out}");
    assert_eq!(counter(&out, "ENDED") + failed, walks, "{out}");
    assert!(counter(&out, "ENDED") * 2 > walks, "{out}");
}

#[test]
fn corrupt_contexts_fail_with_their_reason() {
    let out = walk_prog(&["corrupt"]);
    let case = |name: &str| {
        let start = out.find(&format!("CASE {name}\n")).unwrap();
        let rest = &out[start..];
        let end = rest[1..].find("CASE ").map_or(rest.len(), |e| e + 1);
        frames(&rest[..end])
    };
    // A pc in no object: delivered as UNKNOWN, then NO_UNWIND_INFO (1).
    assert_eq!(
        case("nopc"),
        (vec![(0, 0x40)], "FAIL 1".to_string()),
        "{out}"
    );
    // burn_c's entry over garbage: the "return address" read is garbage.
    let (f, last) = case("garbage");
    assert_eq!(f.len(), 2, "{out}");
    assert_eq!(f[0].0, 1);
    assert_eq!(f[1], (0, 0x4141414141414141));
    assert_eq!(last, "FAIL 1");
    // A stack pointer on no stack: NO_STACK (6), no frame.
    assert_eq!(case("nostack"), (vec![], "FAIL 6".to_string()), "{out}");
}

/// The JIT line's range: (start, size).
fn jit_range(out: &str) -> (u64, u64) {
    let l = out
        .lines()
        .find(|l| l.starts_with("JIT "))
        .expect("JIT line");
    let w: Vec<&str> = l.split_whitespace().collect();
    (
        u64::from_str_radix(w[1], 16).unwrap(),
        u64::from_str_radix(w[2], 16).unwrap(),
    )
}

#[test]
fn a_frame_in_code_the_perf_map_names_is_jit_and_the_walk_goes_on() {
    let out = walk_prog(&["jit"]);
    let (start, size) = jit_range(&out);
    let (f, last) = frames(&out);
    // jit_leaf, the generated code (a return address inside it), run_jit,
    // main, libc's two start frames, _start.
    let kinds: Vec<u32> = f.iter().map(|x| x.0).collect();
    assert_eq!(kinds, vec![1, 2, 1, 1, 1, 1, 1], "{out}");
    assert!(f[1].1 > start && f[1].1 <= start + size, "{out}");
    assert_eq!(last, "END", "{out}");
}

#[test]
fn recursion_past_the_limit_fails_with_depth_limit() {
    let out = walk_prog(&["deep"]);
    let (f, last) = frames(&out);
    assert_eq!(f.len(), 256, "{out}");
    assert_eq!(last, "FAIL 3", "{out}");
}

#[test]
fn without_the_client_the_header_is_a_no_op() {
    let mut cmd = Command::new(programs().join("walk"));
    cmd.arg("noclient").env_remove("LD_PRELOAD");
    let out = run(cmd, TIMEOUT);
    assert_eq!(out.code, Some(0));
    assert_eq!(out.stdout.trim(), "PREPARE -1 WALK -1 CALLED 0");
}

/// dlwalk's FRAME lines: (type, symbol), and the last line.
fn dlwalk(exe: &str, args: &[&str], lib_path: bool) -> (Vec<(u32, String)>, String) {
    let mut cmd = Command::new(programs().join(exe));
    cmd.args(args).env("LD_PRELOAD", client_so());
    if lib_path {
        cmd.env("LD_LIBRARY_PATH", programs());
    }
    let out = run(cmd, TIMEOUT);
    assert_eq!(
        out.code,
        Some(0),
        "{exe} {args:?}:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    let mut f = Vec::new();
    let mut last = String::new();
    for l in out.stdout.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["FRAME", t, _, name] => f.push((t.parse().unwrap(), name.to_string())),
            ["END"] | ["FAIL", _] => last = l.to_string(),
            _ => {}
        }
    }
    (f, last)
}

#[test]
fn a_library_dlopened_after_prepare_is_walked_without_preparing_again() {
    let lib = programs().join("libdlwalk.so");
    let lib = lib.to_string_lossy();
    for (exe, name, lib_path) in [
        ("dlwalk", &*lib, false),
        ("dlwalk", "libdlwalk.so", true),
        ("dlwalk_rpath", "libdlwalk.so", false),
    ] {
        let (frames, last) = dlwalk(exe, &[name], lib_path);
        assert_eq!(last, "END", "{exe} {name}: {frames:?}");
        let names: Vec<&str> = frames.iter().take(4).map(|f| f.1.as_str()).collect();
        assert_eq!(
            names,
            ["walk_here", "dlwalk_inner", "dlwalk_outer", "main"],
            "{exe} {name}: {frames:?}"
        );
        assert!(frames.iter().all(|f| f.0 == 1), "{exe} {name}: {frames:?}");
    }
}

#[test]
fn a_bare_name_only_the_callers_runpath_finds_still_loads() {
    // The hook cannot make this call itself (the client has no
    // DT_RUNPATH): glibc's dlopen runs as the caller's, the library loads
    // (exit 0), and its frames need a second prepare.
    let (frames, last) = dlwalk("dlwalk_runpath", &["libdlwalk.so"], false);
    assert_eq!(last, "FAIL 1", "{frames:?}");
    assert_eq!(
        frames.get(1),
        Some(&(0, "dlwalk_inner".to_string())),
        "{frames:?}"
    );
    let (frames, last) = dlwalk("dlwalk_runpath", &["libdlwalk.so", "reprepare"], false);
    assert_eq!(last, "END", "{frames:?}");
    assert_eq!(frames.get(2).map(|f| f.1.as_str()), Some("dlwalk_outer"));
}
