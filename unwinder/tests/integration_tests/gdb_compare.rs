//! Real samples from running programs, unwound offline, compared with gdb.
//!
//! Each test builds a program from `tests/programs/`, stops it under gdb at
//! a breakpoint, captures registers + stack + maps + vDSO (see
//! `common::capture`), kills it, then unwinds the capture and requires the
//! sequence of frame names (inline frames included) to equal gdb's `bt`
//! for the same stopped thread, after `common::normalize`.

use std::path::Path;
use std::sync::Arc;

use heapprofd_unwinder::{Arch, ModuleCache, UnwindErrorKind};

use crate::common::{self, Capture, compile, sh};

fn cache() -> Arc<ModuleCache> {
    Arc::new(ModuleCache::default())
}

fn c_capture(name: &str, flags: &[&str], depth: &str) -> Option<Capture> {
    if !common::gdb_tests_enabled() {
        return None;
    }
    let dir = common::scratch(name);
    let bin = dir.join("deep");
    compile("gcc", "deep.c", &bin, flags);
    Some(common::capture(&dir, &bin, &[depth], "leaf"))
}

/// libc frames must be named from libc6-dbg's DWARF, inline frames included.
fn assert_libc_named(names: &[String]) {
    for want in ["msort_with_tmp", "__libc_start_call_main", "_start"] {
        assert!(
            names.iter().any(|n| n.contains(want)),
            "no {want} in {names:?}"
        );
    }
}

#[test]
fn c_o2_without_frame_pointers_pie() {
    let Some(cap) = c_capture(
        "c_o2_pie",
        &["-O2", "-g", "-fomit-frame-pointer", "-pie", "-fPIE"],
        "10",
    ) else {
        return;
    };
    let (ctx, r) = common::assert_same_as_gdb(&cap, &cache());
    assert_eq!(r.error, None, "clean unwind to _start");
    let names = common::names(&ctx, &r);
    assert_libc_named(&names);
    assert_eq!(names[0], "leaf");
    let (lo, hi) = common::nm_range(&cap.dir.join("../deep"), "leaf");
    let leaf = &r.real_frames()[0];
    assert!(
        (lo..hi).contains(&leaf.rel_pc),
        "{:#x} not in {lo:#x}..{hi:#x}",
        leaf.rel_pc
    );
    assert_eq!(leaf.mapping.as_ref().unwrap().start_offset, 0);

    // The same sample with its stack copy cut short: the frames found are
    // the first frames of the full stack, then MEMORY_INVALID.
    let mut short = common::context(&cap, &cache());
    let cut = &cap.stack[..256];
    let p = short.unwind(Arch::X86_64, &cap.regs, cap.sp, cut, 0..0);
    assert_eq!(p.error, Some(UnwindErrorKind::MemoryInvalid));
    let full: Vec<u64> = r.real_frames().iter().map(|f| f.pc).collect();
    let part: Vec<u64> = p.real_frames().iter().map(|f| f.pc).collect();
    assert!(!part.is_empty() && part.len() < full.len());
    assert_eq!(part[..], full[..part.len()]);
    assert_eq!(short.stats().errors_of(UnwindErrorKind::MemoryInvalid), 1);
    // The inlined helper appears as its own frame, with main as its caller.
    let i = names.iter().position(|n| n == "helper").unwrap();
    assert_eq!(names[i + 1], "main");
    // The first frame is looked up at its pc, the others at pc - 1.
    let f = r.real_frames();
    assert_eq!(f[0].lookup_pc, f[0].pc);
    assert!(f[1..].iter().all(|f| f.lookup_pc == f.pc - 1));
}

#[test]
fn c_o0() {
    let Some(cap) = c_capture("c_o0", &["-O0", "-g"], "10") else {
        return;
    };
    let (ctx, r) = common::assert_same_as_gdb(&cap, &cache());
    assert_eq!(r.error, None);
    assert_libc_named(&common::names(&ctx, &r));
}

#[test]
fn c_non_pie() {
    let Some(cap) = c_capture("c_nopie", &["-O2", "-g", "-no-pie", "-fno-pie"], "10") else {
        return;
    };
    let (ctx, r) = common::assert_same_as_gdb(&cap, &cache());
    assert_eq!(r.error, None);
    // Non-PIE: rel_pc equals the absolute pc (bias 0).
    let leaf = &r.real_frames()[0];
    let m = leaf.mapping.as_ref().unwrap();
    assert!(m.path.ends_with("/deep"));
    assert_eq!(leaf.rel_pc, leaf.pc);
    assert_eq!(m.avma_bias, 0);
    assert!(ctx.mappings().iter().any(|m| m.start == 0x400000));
}

#[test]
fn deep_recursion_over_100_frames() {
    let Some(cap) = c_capture("c_deep", &["-O2", "-g"], "150") else {
        return;
    };
    let (ctx, r) = common::assert_same_as_gdb(&cap, &cache());
    assert_eq!(r.error, None);
    let names = common::names(&ctx, &r);
    assert!(names.iter().filter(|n| *n == "recurse").count() == 151);
    assert!(r.frames.len() > 150);
}

#[test]
fn frame_limit_keeps_partial_stack() {
    let Some(cap) = c_capture("c_limit", &["-O2", "-g"], "600") else {
        return;
    };
    let cache = cache();
    let mut ctx = common::context(&cap, &cache);
    let r = common::unwind(&mut ctx, &cap);
    assert_eq!(r.error, Some(UnwindErrorKind::MaxFramesExceeded));
    assert_eq!(r.real_frames().len(), 512);
    let last = r.frames.last().unwrap();
    assert_eq!(last.error, Some(UnwindErrorKind::MaxFramesExceeded));
    let name = ctx.symbolize_frame(last)[0].function.clone();
    assert_eq!(name.as_deref(), Some("ERROR MAX_FRAMES_EXCEEDED"));
    assert_eq!(ctx.stats().errors_of(UnwindErrorKind::MaxFramesExceeded), 1);
    // The frames we kept are gdb's first frames.
    let ours: Vec<String> = common::names(&ctx, &r)
        .iter()
        .map(|n| common::normalize(n))
        .collect();
    let gdb: Vec<String> = cap.bt.iter().map(|n| common::normalize(n)).collect();
    assert_eq!(ours[..], gdb[..ours.len()]);
}

#[test]
fn stripped_with_debuglink() {
    if !common::gdb_tests_enabled() {
        return;
    }
    let dir = common::scratch("c_debuglink");
    compile("gcc", "deep.c", &dir.join("deep"), &["-O2", "-g"]);
    sh(
        &dir,
        "objcopy --only-keep-debug deep deep.debug
         strip --strip-all deep
         objcopy --add-gnu-debuglink=deep.debug deep",
    );
    let cap = common::capture(&dir, &dir.join("deep"), &["10"], "leaf");
    let cache = cache();
    let (ctx, r) = common::assert_same_as_gdb(&cap, &cache);
    assert_eq!(r.error, None);
    let m = r.real_frames()[0].mapping.clone().unwrap();
    let src = m.module.as_ref().unwrap().symbol_sources();
    assert_eq!(
        src.debug_file.as_deref(),
        Some(dir.join("deep.debug").as_path())
    );
    assert!(src.has_dwarf);
    // File and line come from the debug file.
    let s = &ctx.symbolize_frame(&r.real_frames()[0])[0];
    assert!(
        s.file.as_deref().is_some_and(|f| f.ends_with("deep.c")),
        "{s:?}"
    );
    assert!(s.line.is_some());
}

#[test]
fn stripped_with_mini_debug_info() {
    if !common::gdb_tests_enabled() {
        return;
    }
    let dir = common::scratch("c_minidebuginfo");
    compile("gcc", "deep.c", &dir.join("deep"), &["-O2", "-g"]);
    // The recipe from gdb's manual ("MiniDebugInfo").
    sh(
        &dir,
        "nm -D deep --format=posix --defined-only | awk '{ print $1 }' | sort > dynsyms
         nm deep --format=posix --defined-only | awk '{ if ($2 == \"T\" || $2 == \"t\" || $2 == \"D\") print $1 }' | sort > funcsyms
         comm -13 dynsyms funcsyms > keep_symbols
         objcopy --only-keep-debug deep mini_debuginfo
         objcopy -S --remove-section .gdb_index --remove-section .comment --keep-symbols=keep_symbols mini_debuginfo
         strip --strip-all -R .comment deep
         rm -f mini_debuginfo.xz
         xz mini_debuginfo
         objcopy --add-section .gnu_debugdata=mini_debuginfo.xz deep",
    );
    let cap = common::capture(&dir, &dir.join("deep"), &["10"], "leaf");
    let (ctx, r) = common::assert_same_as_gdb(&cap, &cache());
    assert_eq!(r.error, None);
    let m = r.real_frames()[0].mapping.clone().unwrap();
    let src = m.module.as_ref().unwrap().symbol_sources();
    assert!(src.mini_debug_info && !src.has_dwarf, "{src:?}");
    assert!(common::names(&ctx, &r).contains(&"recurse".to_owned()));
}

fn cxx_capture(mode: &str) -> Option<Capture> {
    if !common::gdb_tests_enabled() {
        return None;
    }
    let dir = common::scratch(&format!("cxx_{mode}"));
    let bin = dir.join("cxx");
    compile("g++", "cxx.cpp", &bin, &["-O2", "-g", "-pthread"]);
    Some(common::capture(&dir, &bin, &[mode], "leaf"))
}

#[test]
fn cxx_destructor_during_exception_unwinding() {
    let Some(cap) = cxx_capture("dtor") else {
        return;
    };
    let (ctx, r) = common::assert_same_as_gdb(&cap, &cache());
    assert_eq!(r.error, None);
    let names = common::names(&ctx, &r);
    assert!(names.iter().any(|n| n.contains("~Guard")), "{names:?}");
}

#[test]
fn cxx_catch_handler() {
    let Some(cap) = cxx_capture("catch") else {
        return;
    };
    let (ctx, r) = common::assert_same_as_gdb(&cap, &cache());
    assert_eq!(r.error, None);
    let names = common::names(&ctx, &r);
    assert!(names.iter().any(|n| n.contains("catcher")), "{names:?}");
}

#[test]
fn cxx_thread_sort_lambda() {
    let Some(cap) = cxx_capture("thread") else {
        return;
    };
    let (ctx, r) = common::assert_same_as_gdb(&cap, &cache());
    let names = common::names(&ctx, &r);
    assert!(
        names.iter().any(|n| n.contains("start_thread")),
        "{names:?}"
    );
    assert!(names.iter().any(|n| n.contains("sorted_sum")), "{names:?}");
    assert_eq!(r.error, None);
}

#[test]
fn rust_release() {
    if !common::gdb_tests_enabled() {
        return;
    }
    let dir = common::scratch("rust_release");
    let bin = dir.join("rprog");
    common::run(
        std::process::Command::new("rustc")
            .args([
                "-C",
                "opt-level=3",
                "-C",
                "debuginfo=2",
                "--edition",
                "2021",
                "-o",
            ])
            .arg(&bin)
            .arg(common::programs_dir().join("rprog.rs")),
    );
    let cap = common::capture(&dir, &bin, &["20"], "rprog::leaf");
    let (ctx, r) = common::assert_same_as_gdb(&cap, &cache());
    assert_eq!(r.error, None);
    let names = common::names(&ctx, &r);
    assert_eq!(names[0], "rprog::leaf");
    assert!(names.iter().filter(|n| *n == "rprog::recurse").count() == 21);
    // rustc's lld output is the "SVMA gap" case: the executable PT_LOAD's
    // p_vaddr - p_offset is not the mapping's start - offset.
    let leaf = &r.real_frames()[0];
    let m = leaf.mapping.as_ref().unwrap();
    let seg = m
        .module
        .as_ref()
        .unwrap()
        .elf
        .segments
        .iter()
        .find(|s| s.exec)
        .unwrap();
    assert_ne!(seg.vaddr, seg.offset);
    assert_ne!(m.avma_bias, m.start - m.offset, "naive bias would be wrong");
    assert_eq!(m.load_bias, seg.vaddr - seg.offset);
    // rel_pc is the ELF virtual address nm reports for the symbol.
    let (lo, hi) = common::nm_range(&bin, "5rprog4leaf");
    assert!(
        (lo..hi).contains(&leaf.rel_pc),
        "{:#x} not in {lo:#x}..{hi:#x}",
        leaf.rel_pc
    );
}

/// Several processes share the cache: libc is parsed once.
#[test]
fn modules_are_shared_between_processes() {
    let (Some(a), Some(b)) = (
        c_capture("share_a", &["-O2", "-g"], "3"),
        c_capture("share_b", &["-O0", "-g"], "3"),
    ) else {
        return;
    };
    let cache = cache();
    common::assert_same_as_gdb(&a, &cache);
    let loaded = cache.stats().modules_loaded;
    common::assert_same_as_gdb(&b, &cache);
    // Only the second `deep` binary is new.
    assert_eq!(cache.stats().modules_loaded, loaded + 1);
    assert!(Path::new(&a.dir).exists());
}

/// DWARF moved into a dwz supplementary file (`.gnu_debugaltlink`): names of
/// functions and inlined functions live in the supplementary file only.
/// Needs the `dwz` tool (`scripts/install-deps.sh` installs it); fails where it is missing.
#[test]
fn dwz_supplementary_file() {
    if !common::gdb_tests_enabled() {
        return;
    }
    assert!(
        std::process::Command::new("dwz")
            .arg("--version")
            .output()
            .is_ok(),
        "dwz is required for this test: apt-get install dwz (or set HEAPPROFD_SKIP_GDB_TESTS=1)"
    );
    let dir = common::scratch("c_dwz");
    compile("gcc", "deep.c", &dir.join("a"), &["-O2", "-g"]);
    compile("gcc", "deep.c", &dir.join("b"), &["-O0", "-g"]);
    let common_debug = dir.join("common.debug");
    sh(
        &dir,
        &format!("dwz -m common.debug -M {} a b", common_debug.display()),
    );
    let cap = common::capture(&dir, &dir.join("a"), &["10"], "leaf");
    let (ctx, r) = common::assert_same_as_gdb(&cap, &cache());
    assert_eq!(r.error, None);
    let m = r.real_frames()[0].mapping.clone().unwrap();
    let src = m.module.as_ref().unwrap().symbol_sources();
    assert_eq!(
        src.sup_file.as_deref(),
        Some(common_debug.as_path()),
        "{src:?}"
    );
    assert!(common::names(&ctx, &r).contains(&"helper".to_owned()));
}
