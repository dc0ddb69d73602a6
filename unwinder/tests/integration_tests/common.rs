//! Shared helpers: build test programs, capture a real sample under gdb,
//! unwind it offline and compare with gdb's backtrace.
//!
//! A capture (see `tests/programs/capture.py`) is what a heapprofd sample
//! holds — registers, the stack bytes from sp to the end of the stack's
//! mapping, the maps — plus the vDSO bytes and gdb's backtrace of the same
//! stopped thread. The process is killed before we unwind, so the unwinder
//! sees exactly what the daemon sees for a process that already exited:
//! only the sample, the maps, and the files on disk.
//!
//! # Name normalization (documented differences between gdb and us)
//!
//! Both sides name every frame, inline frames included, innermost first.
//! gdb prints DWARF `DW_AT_name`s qualified by scope; we print demangled
//! linkage names. Before comparing, both are reduced by [`normalize`]:
//! parameter lists (and a trailing `const`) and template/generic argument
//! lists are removed, Rust
//! closure spellings (`{closure#0}` / `{{closure}}`) become `{closure}`, a
//! trailing `::h<hash>` is dropped, and only the last `::` component is
//! kept (gdb leaves lambdas and some inline functions unqualified while
//! the linkage name is qualified). An unnamed frame is `??` on both sides.
//! gdb's synthesized tail-call frames (built from DWARF call-site info for a
//! function that jumped to its callee and so has no frame on the stack) are
//! left out of gdb's list by the capture script.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use heapprofd_unwinder::{
    Arch, ModuleCache, ProcessContext, RegisterFile, SnapshotMemory, StaticMaps, UnwindResult,
};

/// A sample captured under gdb.
#[derive(Debug)]
pub struct Capture {
    pub dir: PathBuf,
    pub pid: u32,
    pub regs: RegisterFile,
    pub sp: u64,
    pub stack: Vec<u8>,
    pub maps: String,
    pub vdso: Option<(u64, Vec<u8>)>,
    /// gdb's frame names, innermost first.
    pub bt: Vec<String>,
}

/// Scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("unwinder-tests")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn programs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs")
}

/// Runs a command, panicking with its output if it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Shell pipeline helper (used for the MiniDebugInfo recipe).
pub fn sh(dir: &Path, script: &str) -> String {
    run(Command::new("sh").arg("-ec").arg(script).current_dir(dir))
}

/// Whether gdb-based tests can run here. They are required unless
/// `HEAPPROFD_SKIP_GDB_TESTS=1` (they need gdb, gcc, g++, rustc and libc6-dbg).
pub fn gdb_tests_enabled() -> bool {
    if std::env::var_os("HEAPPROFD_SKIP_GDB_TESTS").is_some_and(|v| v == "1") {
        eprintln!("HEAPPROFD_SKIP_GDB_TESTS=1: skipping a gdb comparison test");
        return false;
    }
    true
}

fn parse_hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap()
}

/// Runs `program args` under gdb until `breakpoint`, and reads the capture.
pub fn capture(dir: &Path, program: &Path, args: &[&str], breakpoint: &str) -> Capture {
    let out = dir.join("capture");
    std::fs::create_dir_all(&out).unwrap();
    let script = programs_dir().join("capture.py");
    let gdb_out = Command::new("gdb")
        .args(["-batch", "-nx", "-q", "-x"])
        .arg(&script)
        .arg("--args")
        .arg(program)
        .args(args)
        .env("HP_OUT", &out)
        .env("HP_BREAK", breakpoint)
        .output()
        .expect("gdb is required for these tests (or set HEAPPROFD_SKIP_GDB_TESTS=1)");
    let read = |n: &str| {
        std::fs::read_to_string(out.join(n)).unwrap_or_else(|e| {
            panic!(
                "capture file {n} missing ({e}); gdb said:\n{}\n{}",
                String::from_utf8_lossy(&gdb_out.stdout),
                String::from_utf8_lossy(&gdb_out.stderr)
            )
        })
    };
    let mut regs = RegisterFile::default();
    for line in read("regs").lines() {
        let mut p = line.split_whitespace();
        let i: usize = p.next().unwrap().parse().unwrap();
        let _name = p.next();
        regs.0[i] = parse_hex(p.next().unwrap());
    }
    let sp = parse_hex(&read("stack.addr"));
    let stack = std::fs::read(out.join("stack")).unwrap();
    let vdso = std::fs::read(out.join("vdso"))
        .ok()
        .map(|b| (parse_hex(&read("vdso.addr")), b));
    Capture {
        dir: out.clone(),
        pid: read("pid").trim().parse().unwrap(),
        regs,
        sp,
        stack,
        maps: read("maps"),
        vdso,
        bt: read("bt").lines().map(str::to_owned).collect(),
    }
}

/// A process context for the capture: static maps, memory = the vDSO dump
/// only (the stack is in the sample).
pub fn context(cap: &Capture, cache: &Arc<ModuleCache>) -> ProcessContext {
    let mut mem = SnapshotMemory::new();
    if let Some((addr, bytes)) = &cap.vdso {
        mem.add_region(*addr, bytes.clone());
    }
    ProcessContext::new(
        cap.pid,
        Box::new(StaticMaps(cap.maps.clone())),
        Box::new(mem),
        Arc::clone(cache),
    )
}

/// Unwinds the capture, after checking on it that replayed walks (see
/// `replay.rs`; x86_64) agree with full walks.
pub fn unwind(ctx: &mut ProcessContext, cap: &Capture) -> UnwindResult {
    #[cfg(target_arch = "x86_64")]
    {
        let c = crate::replay::check_replay(ctx, &cap.regs, cap.sp, &cap.stack, cap.sp, 300);
        eprintln!("replay check of {}: {c:?}", cap.dir.display());
    }
    ctx.unwind(Arch::X86_64, &cap.regs, cap.sp, &cap.stack, 0..0)
}

/// Our frame names, inline frames expanded, innermost first.
pub fn names(ctx: &ProcessContext, r: &UnwindResult) -> Vec<String> {
    let mut out = Vec::new();
    for f in r.real_frames() {
        for s in ctx.symbolize_frame(f).iter() {
            out.push(s.function.clone().unwrap_or_else(|| "??".to_owned()));
        }
    }
    out
}

/// Removes balanced `open`..`close` groups.
fn strip_groups(s: &str, open: char, close: char) -> String {
    let mut out = String::with_capacity(s.len());
    let mut depth = 0usize;
    for c in s.chars() {
        if c == open {
            depth += 1;
        } else if c == close && depth > 0 {
            depth -= 1;
        } else if depth == 0 {
            out.push(c);
        }
    }
    out
}

/// See the module docs.
pub fn normalize(name: &str) -> String {
    let mut s = name.replace("{{closure}}", "{closure}");
    // {closure#0} -> {closure}
    while let Some(i) = s.find("{closure#") {
        let Some(j) = s[i..].find('}') else { break };
        s.replace_range(i..i + j + 1, "{closure}");
    }
    // Operators contain the characters we strip; protect them.
    let s = s
        .replace("->", "@arrow")
        .replace("operator()", "operator@call")
        .replace("operator<<", "operator@shl")
        .replace("operator<", "operator@lt")
        .replace("operator>", "operator@gt");
    let s = strip_groups(&s, '(', ')');
    let s = strip_groups(&s, '<', '>');
    let mut s = s
        .trim()
        .trim_end_matches(" const")
        .trim_end_matches("::")
        .to_owned();
    if let Some(i) = s.rfind("::h")
        && s.len() - i == 19
        && s[i + 3..].chars().all(|c| c.is_ascii_hexdigit())
    {
        s.truncate(i);
    }
    let last = s.rsplit("::").next().unwrap_or(&s).trim().to_owned();
    last.replace("operator@call", "operator()")
        .replace("operator@shl", "operator<<")
        .replace("operator@lt", "operator<")
        .replace("operator@gt", "operator>")
}

/// Unwinds the capture and checks the names against gdb's backtrace.
/// Returns the result for further checks.
pub fn assert_same_as_gdb(
    cap: &Capture,
    cache: &Arc<ModuleCache>,
) -> (ProcessContext, UnwindResult) {
    let mut ctx = context(cap, cache);
    let r = unwind(&mut ctx, cap);
    let ours: Vec<String> = names(&ctx, &r).iter().map(|n| normalize(n)).collect();
    let gdb: Vec<String> = cap.bt.iter().map(|n| normalize(n)).collect();
    if ours != gdb {
        let raw = names(&ctx, &r);
        let mut msg = format!(
            "frame names differ (error {:?}); capture in {}\n  # ours | gdb\n",
            r.error,
            cap.dir.display()
        );
        for i in 0..ours.len().max(gdb.len()) {
            let o = ours.get(i).map_or("-", String::as_str);
            let g = gdb.get(i).map_or("-", String::as_str);
            let mark = if o == g { " " } else { "!" };
            let raw_o = raw.get(i).map_or("", String::as_str);
            let raw_g = cap.bt.get(i).map_or("", String::as_str);
            msg.push_str(&format!("{mark}{i:3} {o} | {g}    [{raw_o} | {raw_g}]\n"));
        }
        panic!("{msg}");
    }
    (ctx, r)
}

/// `[address, address + size)` of the first symbol of `bin` whose (raw)
/// name equals `name` or, for mangled names, contains it.
pub fn nm_range(bin: &Path, name: &str) -> (u64, u64) {
    let out = run(Command::new("nm").arg("-S").arg(bin));
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 4 && (f[3] == name || (f[3].starts_with("_") && f[3].contains(name))) {
            let a = u64::from_str_radix(f[0], 16).unwrap();
            let n = u64::from_str_radix(f[1], 16).unwrap();
            return (a, a + n);
        }
    }
    panic!("{name} not in nm output of {}", bin.display());
}

/// gcc/g++ with the given flags.
pub fn compile(compiler: &str, src: &str, out: &Path, flags: &[&str]) {
    run(Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(programs_dir().join(src)));
}

#[test]
fn normalize_examples() {
    let cases = [
        ("main", "main"),
        ("main()", "main"),
        ("app::thrower(int)", "thrower"),
        (
            "std::thread::_Invoker<std::tuple<main(int, char**)::<lambda()> > >::_M_invoke<0>",
            "_M_invoke",
        ),
        (
            "std::thread::_State_impl<std::thread::_Invoker<std::tuple<main::{lambda()#1}> > >::_M_run()",
            "_M_run",
        ),
        ("operator()", "operator()"),
        ("main::{lambda()#1}::operator()() const", "operator()"),
        ("rprog::recurse::{closure#0}", "{closure}"),
        ("rprog::recurse::{{closure}}", "{closure}"),
        (
            "core::iter::adapters::map::map_fold::{closure#0}<u64, u64, u64, fn>",
            "{closure}",
        ),
        ("rprog::leaf::h0123456789abcdef", "leaf"),
        ("__GI___qsort_r", "__GI___qsort_r"),
        (
            "std::panicking::catch_unwind::do_call::<&dyn core::ops::function::Fn<(), Output = i32>, i32>",
            "do_call",
        ),
        (
            "<fn() -> core::result::Result<(), String> as core::ops::FnOnce<()>>::call_once",
            "call_once",
        ),
    ];
    for (input, want) in cases {
        assert_eq!(normalize(input), want, "{input}");
    }
}
