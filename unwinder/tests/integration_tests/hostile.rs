//! Hostile and degenerate input: every case must end in a classified error
//! (or a clean partial stack), never a panic.

use std::sync::Arc;
use std::time::Duration;

use heapprofd_unwinder::{
    Arch, MapsSource, ModuleCache, NoMemory, ProcessContext, ProcessOptions, RegisterFile,
    StaticMaps, SymbolizeOptions, UnwindErrorKind,
};

fn own_maps() -> String {
    std::fs::read_to_string("/proc/self/maps").unwrap()
}

fn ctx_with(maps: String, options: ProcessOptions) -> ProcessContext {
    ProcessContext::with_options(
        std::process::id(),
        Box::new(StaticMaps(maps)),
        Box::new(NoMemory),
        Arc::new(ModuleCache::default()),
        options,
    )
}

fn ctx() -> ProcessContext {
    ctx_with(own_maps(), ProcessOptions::default())
}

fn regs(pc: u64, sp: u64, bp: u64) -> RegisterFile {
    let mut r = RegisterFile::default();
    r.0[16] = pc;
    r.0[7] = sp;
    r.0[6] = bp;
    r
}

/// A pc inside this test binary's code.
fn code_pc() -> u64 {
    code_pc as *const () as usize as u64 + 4
}

#[test]
fn zero_registers_are_invalid() {
    let mut c = ctx();
    let stack = [0u8; 64];
    let r = c.unwind(Arch::X86_64, &RegisterFile::default(), 0x1000, &stack, 0..0);
    assert_eq!(r.error, Some(UnwindErrorKind::InvalidRegisters));
    assert_eq!(r.real_frames().len(), 0);
    assert_eq!(r.frames.len(), 1);
    let name = c.symbolize_frame(&r.frames[0])[0].function.clone();
    assert_eq!(name.as_deref(), Some("ERROR INVALID_REGISTERS"));
    assert_eq!(c.stats().errors_of(UnwindErrorKind::InvalidRegisters), 1);
}

#[test]
fn sp_outside_the_copied_stack() {
    let mut c = ctx();
    let stack = [0u8; 256];
    let r = c.unwind(
        Arch::X86_64,
        &regs(code_pc(), 0x5000, 0),
        0x1000,
        &stack,
        0..0,
    );
    assert_eq!(r.error, Some(UnwindErrorKind::InvalidRegisters));
    let r = c.unwind(
        Arch::X86_64,
        &regs(code_pc(), 0xfff, 0),
        0x1000,
        &stack,
        0..0,
    );
    assert_eq!(r.error, Some(UnwindErrorKind::InvalidRegisters));
    // sp at the very end of an (empty-remaining) copy is allowed.
    let r = c.unwind(
        Arch::X86_64,
        &regs(code_pc(), 0x1100, 0),
        0x1000,
        &stack,
        0..0,
    );
    assert_ne!(r.error, Some(UnwindErrorKind::InvalidRegisters));
}

#[test]
fn pc_in_no_mapping() {
    let mut c = ctx_with(
        own_maps(),
        ProcessOptions {
            reparse_interval: Duration::ZERO,
            ..Default::default()
        },
    );
    let stack = [0u8; 64];
    let r = c.unwind(Arch::X86_64, &regs(0x10, 0x1000, 0), 0x1000, &stack, 0..0);
    assert_eq!(r.error, Some(UnwindErrorKind::InvalidMap));
    assert!(r.real_frames().is_empty());
    // The maps were re-read once to look for a new mapping.
    assert_eq!(c.stats().map_reparses, 1);
}

// The x86_64 walk of this binary's own code (elsewhere its code is not
// x86_64).
#[cfg(target_arch = "x86_64")]
#[test]
fn empty_stack_keeps_the_first_frame() {
    let mut c = ctx();
    let r = c.unwind(
        Arch::X86_64,
        &regs(code_pc(), 0x7000_0000, 0),
        0x7000_0000,
        &[],
        0..0,
    );
    assert_eq!(r.real_frames().len(), 1);
    assert_eq!(r.real_frames()[0].pc, code_pc());
    assert_eq!(r.error, Some(UnwindErrorKind::MemoryInvalid));
}

#[test]
fn garbage_stacks_never_panic() {
    let mut c = ctx();
    // Deterministic xorshift; stacks full of code addresses and junk.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let pcs: Vec<u64> = c
        .mappings()
        .iter()
        .filter(|m| m.exec)
        .map(|m| m.start + (m.end - m.start) / 3)
        .collect();
    for i in 0..300 {
        let len = (next() % 4096) as usize & !7;
        let sp = 0x7fff_0000_0000u64 + (next() % 0x1000) * 8;
        let mut stack = vec![0u8; len];
        for w in stack.chunks_exact_mut(8) {
            let v = match next() % 4 {
                0 => pcs[(next() as usize) % pcs.len()] + next() % 64,
                1 => sp + next() % (len as u64 + 64),
                2 => 0,
                _ => next(),
            };
            w.copy_from_slice(&v.to_le_bytes());
        }
        let pc = if i % 5 == 0 {
            next()
        } else {
            pcs[(next() as usize) % pcs.len()]
        };
        let bp = if i % 2 == 0 {
            sp + next() % (len as u64 + 8)
        } else {
            next()
        };
        let arch = if i % 7 == 0 {
            Arch::Aarch64
        } else {
            Arch::X86_64
        };
        let mut r = regs(pc, sp, bp);
        r.0[29] = bp;
        r.0[30] = next();
        r.0[31] = sp;
        r.0[32] = pc;
        let res = c.unwind(arch, &r, sp, &stack, 0..0);
        assert!(res.real_frames().len() <= 512);
        for f in &res.frames {
            let _ = c.symbolize_frame(f);
        }
    }
    let s = c.stats();
    assert_eq!(s.unwinds, 300);
    assert!(s.total_errors() > 0);
}

#[test]
fn truncated_elf_in_maps_falls_back_to_frame_pointers() {
    let dir = std::env::temp_dir().join(format!("hp-trunc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::fs::read("/proc/self/exe").unwrap();
    let path = dir.join("truncated.so");
    std::fs::write(&path, &exe[..4096]).unwrap();
    let maps = format!(
        "10000000-10001000 r-xp 00000000 00:00 12345 {}\n\
         20000000-20010000 rw-p 00000000 00:00 0 [stack]\n",
        path.display()
    );
    let mut c = ctx_with(maps, ProcessOptions::default());
    assert!(c.mappings()[0].module.is_none());
    // Frame-pointer chain: [bp] = 0 (end), [bp + 8] = return address.
    let sp = 0x2000_0000u64;
    let mut stack = vec![0u8; 64];
    stack[16..24].copy_from_slice(&0u64.to_le_bytes());
    stack[24..32].copy_from_slice(&0x1000_0800u64.to_le_bytes());
    let r = c.unwind(
        Arch::X86_64,
        &regs(0x1000_0100, sp, sp + 16),
        sp,
        &stack,
        0..0,
    );
    let pcs: Vec<u64> = r.real_frames().iter().map(|f| f.pc).collect();
    assert_eq!(pcs, [0x1000_0100, 0x1000_0800]);
    assert_eq!(r.error, None);
    // No ELF: rel_pc is the file offset.
    assert_eq!(r.real_frames()[1].rel_pc, 0x7ff);
    let _ = c.symbolize_frame(&r.real_frames()[0]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// JIT code: no file, frame-pointer unwinding, names from a perf map.
#[test]
fn jit_frames_named_from_perf_map() {
    let dir = std::env::temp_dir().join(format!("hp-jit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let perf_map = dir.join("perf-4242.map");
    std::fs::write(
        &perf_map,
        "7f0000000000 180 LazyCompile:~inner app.js:3\n7f0000000180 200 LazyCompile:outer app.js:9\n",
    )
    .unwrap();
    let maps = "7f0000000000-7f0000001000 rwxp 00000000 00:00 0\n\
                7ffd00000000-7ffd00010000 rw-p 00000000 00:00 0 [stack]\n";
    let mut c = ProcessContext::with_options(
        4242,
        Box::new(StaticMaps(maps.to_owned())),
        Box::new(NoMemory),
        Arc::new(ModuleCache::default()),
        ProcessOptions {
            perf_map_path: Some(perf_map),
            ..Default::default()
        },
    );
    let sp = 0x7ffd_0000_0000u64;
    let mut stack = vec![0u8; 64];
    // frame 0 bp = sp + 16 -> [caller bp = sp + 32][ret 0x7f0000000200]
    stack[16..24].copy_from_slice(&(sp + 32).to_le_bytes());
    stack[24..32].copy_from_slice(&0x7f00_0000_0200u64.to_le_bytes());
    // caller bp -> [0][ret 0] : end of chain
    let r = c.unwind(
        Arch::X86_64,
        &regs(0x7f00_0000_0010, sp, sp + 16),
        sp,
        &stack,
        0..0,
    );
    let names: Vec<Option<String>> = r
        .real_frames()
        .iter()
        .map(|f| c.symbolize_frame(f)[0].function.clone())
        .collect();
    assert_eq!(
        names,
        [
            Some("LazyCompile:~inner app.js:3".to_owned()),
            Some("LazyCompile:outer app.js:9".to_owned())
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A maps source whose second read shows a library loaded since the first.
struct Growing {
    reads: usize,
    full: String,
}

impl MapsSource for Growing {
    fn read_maps(&mut self) -> std::io::Result<String> {
        self.reads += 1;
        if self.reads == 1 {
            Ok(String::new())
        } else {
            Ok(self.full.clone())
        }
    }
}

#[test]
fn unknown_address_triggers_rate_limited_reparse() {
    let make = |interval| {
        ProcessContext::with_options(
            std::process::id(),
            Box::new(Growing {
                reads: 0,
                full: own_maps(),
            }),
            Box::new(NoMemory),
            Arc::new(ModuleCache::new(SymbolizeOptions::default())),
            ProcessOptions {
                reparse_interval: interval,
                ..Default::default()
            },
        )
    };
    let stack = [0u8; 64];
    let sp = 0x1000;
    // Allowed to re-read: the pc's mapping is found on the second read.
    let mut c = make(Duration::ZERO);
    assert!(c.mappings().is_empty());
    let r = c.unwind(Arch::X86_64, &regs(code_pc(), sp, 0), sp, &stack, 0..0);
    assert_eq!(c.stats().map_reparses, 1);
    assert_eq!(r.real_frames()[0].pc, code_pc());
    assert!(r.real_frames()[0].mapping.is_some());
    // A long rate limit does not hold back the first re-read (a library
    // loaded since the context was made)...
    let mut c = make(Duration::from_secs(3600));
    let r = c.unwind(Arch::X86_64, &regs(code_pc(), sp, 0), sp, &stack, 0..0);
    assert_eq!(c.stats().map_reparses, 1);
    assert!(r.real_frames()[0].mapping.is_some());
    // ...nor one after a re-read that found its address. A re-read that
    // does not find it starts the rate limit: a garbage pc re-reads once,
    // the next garbage pc within the limit does not.
    let r = c.unwind(Arch::X86_64, &regs(0x10, sp, 0), sp, &stack, 0..0);
    assert_eq!(r.error, Some(UnwindErrorKind::InvalidMap));
    assert_eq!(c.stats().map_reparses, 2);
    let r = c.unwind(Arch::X86_64, &regs(0x20, sp, 0), sp, &stack, 0..0);
    assert_eq!(r.error, Some(UnwindErrorKind::InvalidMap));
    assert_eq!(c.stats().map_reparses, 2);
    // Known code still unwinds.
    let r = c.unwind(Arch::X86_64, &regs(code_pc(), sp, 0), sp, &stack, 0..0);
    assert!(r.real_frames()[0].mapping.is_some());
}

/// Maps that read as empty after the first read: a process that exited
/// (its `/proc/PID/maps`, open since the handshake, reads as empty).
struct Exited {
    reads: usize,
    full: String,
}

impl MapsSource for Exited {
    fn read_maps(&mut self) -> std::io::Result<String> {
        self.reads += 1;
        Ok(if self.reads == 1 {
            self.full.clone()
        } else {
            String::new()
        })
    }
}

#[test]
fn maps_of_an_exited_process_keep_the_known_mappings() {
    let mut c = ProcessContext::with_options(
        std::process::id(),
        Box::new(Exited {
            reads: 0,
            full: own_maps(),
        }),
        Box::new(NoMemory),
        Arc::new(ModuleCache::new(SymbolizeOptions::default())),
        ProcessOptions {
            reparse_interval: Duration::ZERO,
            ..Default::default()
        },
    );
    let known = c.mappings().len();
    assert!(known > 0);
    let stack = [0u8; 64];
    let sp = 0x1000;
    // An unknown pc re-reads the maps, which are now empty.
    let r = c.unwind(Arch::X86_64, &regs(0x10, sp, 0), sp, &stack, 0..0);
    assert_eq!(r.error, Some(UnwindErrorKind::InvalidMap));
    assert_eq!(c.stats().map_reparses, 1);
    // The process's last samples still unwind with what was known.
    assert_eq!(c.mappings().len(), known);
    let r = c.unwind(Arch::X86_64, &regs(code_pc(), sp, 0), sp, &stack, 0..0);
    assert!(r.real_frames()[0].mapping.is_some());
}

/// AArch64 is compiled in: a frame-pointer chain through code without CFI.
#[test]
fn aarch64_frame_pointer_chain() {
    let maps = "7f0000000000-7f0000001000 r-xp 00000000 00:00 0\n\
                7ffd00000000-7ffd00010000 rw-p 00000000 00:00 0 [stack]\n";
    let mut c = ctx_with(maps.to_owned(), ProcessOptions::default());
    let sp = 0x7ffd_0000_0000u64;
    let mut stack = vec![0u8; 64];
    // AArch64 frame record at fp: [caller fp][return address (lr)].
    stack[16..24].copy_from_slice(&(sp + 32).to_le_bytes());
    stack[24..32].copy_from_slice(&0x7f00_0000_0300u64.to_le_bytes());
    let mut r = RegisterFile::default();
    r.0[32] = 0x7f00_0000_0100; // pc
    r.0[30] = 0x7f00_0000_0200; // lr
    r.0[31] = sp;
    r.0[29] = sp + 16; // fp
    let res = c.unwind(Arch::Aarch64, &r, sp, &stack, 0..0);
    let pcs: Vec<u64> = res.real_frames().iter().map(|f| f.pc).collect();
    assert_eq!(pcs[0], 0x7f00_0000_0100);
    assert!(pcs.len() >= 2, "{pcs:?} {:?}", res.error);
    assert!(
        res.real_frames()[1..]
            .iter()
            .all(|f| f.lookup_pc == f.pc - 1),
        "{pcs:x?}"
    );
}

/// Code without CFI whose frame-pointer chain leads to unreadable memory:
/// the guess failed, so the error is UNWIND_INFO, not MEMORY_INVALID.
#[test]
fn frame_pointer_guess_into_unreadable_memory_is_unwind_info() {
    let maps = "7f0000000000-7f0000001000 r-xp 00000000 00:00 0\n\
                7ffd00000000-7ffd00010000 rw-p 00000000 00:00 0 [stack]\n";
    let mut c = ctx_with(maps.to_owned(), ProcessOptions::default());
    let sp = 0x7ffd_0000_0000u64;
    let stack = vec![0u8; 64];
    // bp points far above the copied 64 bytes; NoMemory refuses the read.
    let r = c.unwind(
        Arch::X86_64,
        &regs(0x7f00_0000_0010, sp, sp + 0x8000),
        sp,
        &stack,
        0..0,
    );
    assert_eq!(r.real_frames().len(), 1);
    assert_eq!(r.error, Some(UnwindErrorKind::UnwindInfo));
    assert_eq!(c.stats().errors_of(UnwindErrorKind::UnwindInfo), 1);
}
