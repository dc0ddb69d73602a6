//! Captures the calling thread's registers and stack the way the client
//! library does (inline asm for the registers, then a copy of `[sp, stack
//! end)`), for tests and benchmarks that unwind their own process.

#![allow(dead_code)]

use heapprofd_unwinder::RegisterFile;

/// A sample of the current thread.
#[derive(Debug, Clone)]
pub struct SelfSample {
    pub regs: RegisterFile,
    pub sp: u64,
    pub stack: Vec<u8>,
}

/// End of the mapping that contains `addr` in `/proc/self/maps`.
pub fn mapping_end(addr: u64) -> u64 {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let range = line.split_whitespace().next().unwrap();
        let (lo, hi) = range.split_once('-').unwrap();
        let lo = u64::from_str_radix(lo, 16).unwrap();
        let hi = u64::from_str_radix(hi, 16).unwrap();
        if lo <= addr && addr < hi {
            return hi;
        }
    }
    panic!("{addr:#x} is in no mapping");
}

/// Captures registers and the stack from the current sp to `stack_end`.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub fn capture(stack_end: u64) -> SelfSample {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers; touches no memory.
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags)
        );
    }
    let len = (stack_end - sp) as usize;
    // SAFETY: [sp, stack_end) is this thread's live stack, above the
    // current stack pointer, and mapped (stack_end is its mapping's end).
    let stack = unsafe { std::slice::from_raw_parts(sp as *const u8, len) }.to_vec();
    let mut regs = RegisterFile::default();
    regs.0[16] = ip;
    regs.0[7] = sp;
    regs.0[6] = bp;
    SelfSample { regs, sp, stack }
}

/// Captures registers and the stack from the current sp to `stack_end`
/// (pc, sp, frame pointer and link register: what the walk starts from).
#[cfg(target_arch = "aarch64")]
#[inline(never)]
pub fn capture(stack_end: u64) -> SelfSample {
    use heapprofd_proto::wire::aarch64;
    let (pc, sp, fp, lr): (u64, u64, u64, u64);
    // SAFETY: reads four registers; touches no memory.
    unsafe {
        std::arch::asm!(
            "adr {pc}, .",
            "mov {sp}, sp",
            "mov {fp}, x29",
            "mov {lr}, x30",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            lr = out(reg) lr,
            options(nomem, nostack, preserves_flags)
        );
    }
    let len = (stack_end - sp) as usize;
    // SAFETY: [sp, stack_end) is this thread's live stack, above the
    // current stack pointer, and mapped (stack_end is its mapping's end).
    let stack = unsafe { std::slice::from_raw_parts(sp as *const u8, len) }.to_vec();
    let mut regs = RegisterFile::default();
    regs.0[aarch64::PC] = pc;
    regs.0[aarch64::SP] = sp;
    regs.0[aarch64::FP] = fp;
    regs.0[aarch64::LR] = lr;
    SelfSample { regs, sp, stack }
}

/// Recurses `depth` times, then captures.
#[inline(never)]
pub fn capture_at_depth(depth: u32, stack_end: u64) -> SelfSample {
    if depth == 0 {
        return capture(stack_end);
    }
    let s = capture_at_depth(std::hint::black_box(depth - 1), stack_end);
    std::hint::black_box(&s);
    s
}
