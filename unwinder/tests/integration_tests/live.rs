//! Unwinding this very process through the production sources: `FdMaps`
//! and `FdMemory` on `/proc/self/{maps,mem}`, modules opened through
//! `/proc/self/map_files`, the vDSO read from memory.

use std::sync::Arc;

use heapprofd_unwinder::{Arch, FdMaps, FdMemory, ModuleCache, ProcessContext, SymbolizeOptions};

use crate::selfcapture;

fn live_context(cache: Arc<ModuleCache>) -> ProcessContext {
    let pid = std::process::id();
    ProcessContext::new(
        pid,
        Box::new(FdMaps::new(std::fs::File::open("/proc/self/maps").unwrap())),
        Box::new(FdMemory::new(
            std::fs::File::open("/proc/self/mem").unwrap(),
        )),
        cache,
    )
}

/// The last path component of a function name: DWARF names are qualified
/// in debug builds (`integration_tests::selfcapture::capture`) and not with
/// the release profile's line-tables-only debug info (`capture`).
fn base(name: &str) -> &str {
    name.rsplit("::").next().unwrap_or(name)
}

fn probe() -> u64 {
    let x = 0u8;
    &x as *const u8 as u64
}

#[test]
fn unwinds_own_thread() {
    let end = selfcapture::mapping_end(probe());
    let s = selfcapture::capture_at_depth(12, end);
    let mut ctx = live_context(Arc::new(ModuleCache::default()));
    let r = ctx.unwind(Arch::native().unwrap(), &s.regs, s.sp, &s.stack, 0..0);
    let names: Vec<String> = r
        .real_frames()
        .iter()
        .flat_map(|f| ctx.symbolize_frame(f).to_vec())
        .map(|s| s.function.unwrap_or_default())
        .collect();
    assert_eq!(base(&names[0]), "capture", "{names:?}");
    let depth = names
        .iter()
        .filter(|n| base(n) == "capture_at_depth")
        .count();
    assert_eq!(depth, 13, "{names:?}");
    assert!(
        names.iter().any(|n| base(n) == "unwinds_own_thread"),
        "{names:?}"
    );
    // A test thread starts in libc's start_thread (then clone3); Debian's
    // aarch64 cross libc has no symbols for it: std's thread start then.
    if cfg!(target_arch = "x86_64") {
        assert!(names.iter().any(|n| n == "start_thread"), "{names:?}");
    } else {
        assert!(
            names.iter().any(|n| n.ends_with("thread_start")),
            "{names:?}"
        );
    }
    assert_eq!(r.error, None, "{names:?}");
    // The vDSO was read from memory and parsed (Debian's qemu-user, 7.2,
    // maps none into an aarch64 guest).
    let vdso = ctx.mappings().iter().find(|m| m.path == "[vdso]");
    assert!(vdso.is_some() || !cfg!(target_arch = "x86_64"));
    if let Some(vdso) = vdso {
        assert!(vdso.module.is_some() && vdso.build_id.is_some());
    }
    // Mappings describe what Perfetto needs.
    let f0 = &r.real_frames()[0];
    let m = f0.mapping.as_ref().unwrap();
    assert!(m.exec && m.build_id.is_some() && m.start <= f0.pc && f0.pc < m.end);
    assert_eq!(f0.rel_pc, f0.pc - m.avma_bias);
}

fn name_of(ctx: &ProcessContext, f: &heapprofd_unwinder::Frame) -> String {
    ctx.symbolize_frame(f)[0]
        .function
        .clone()
        .unwrap_or_default()
}

#[test]
fn client_frames_are_dropped() {
    let end = selfcapture::mapping_end(probe());
    let s = selfcapture::capture_at_depth(3, end);
    let mut ctx = live_context(Arc::new(ModuleCache::default()));
    let full = ctx.unwind(Arch::native().unwrap(), &s.regs, s.sp, &s.stack, 0..0);
    // Pretend `capture` and `capture_at_depth` are the client library: skip
    // the text range covering their frames' pcs.
    let f = full.real_frames();
    let k = f
        .iter()
        .take_while(|fr| base(&name_of(&ctx, fr)).starts_with("capture"))
        .count();
    assert_eq!(k, 5); // capture + 4 x capture_at_depth
    let lo = f[..k].iter().map(|f| f.pc).min().unwrap();
    let hi = f[..k].iter().map(|f| f.pc).max().unwrap() + 1;
    let skipped = ctx.unwind(Arch::native().unwrap(), &s.regs, s.sp, &s.stack, lo..hi);
    let g = skipped.real_frames();
    assert_eq!(g.len(), f.len() - k);
    assert_eq!(g[0].pc, f[k].pc);
    // The new leaf is a return address: looked up at pc - 1.
    assert_eq!(g[0].lookup_pc, g[0].pc - 1);
    let name = name_of(&ctx, &g[0]);
    assert!(name.ends_with("client_frames_are_dropped"), "{name}");
}

#[test]
fn symbolization_off_keeps_build_id_and_rel_pc() {
    let end = selfcapture::mapping_end(probe());
    let s = selfcapture::capture_at_depth(2, end);
    let off = Arc::new(ModuleCache::new(SymbolizeOptions {
        enabled: false,
        ..Default::default()
    }));
    let mut ctx = live_context(off);
    let r = ctx.unwind(Arch::native().unwrap(), &s.regs, s.sp, &s.stack, 0..0);
    assert!(ctx.symbolize_frame(&r.real_frames()[0]).is_empty());
    // Offline: the same (build id, rel_pc) symbolized by an enabled cache.
    let on = Arc::new(ModuleCache::default());
    let ctx_on = live_context(Arc::clone(&on));
    let f = &r.real_frames()[0];
    let id = f.mapping.as_ref().unwrap().build_id.clone().unwrap();
    let m = ctx_on
        .mappings()
        .iter()
        .find(|m| m.build_id.as_deref() == Some(&*id) && m.exec)
        .unwrap();
    let name = m.module.as_ref().unwrap().symbolize(f.rel_pc)[0]
        .function
        .clone()
        .unwrap();
    assert_eq!(base(&name), "capture", "{name}");
}
