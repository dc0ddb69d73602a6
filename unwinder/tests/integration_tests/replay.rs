//! Replaying walks (`WalkTrace`): a sample that has the traced inputs and
//! holds the traced values at every traced address must unwind exactly like
//! the traced walk. Checked on real samples of this process under thousands
//! of random changes to their stack copies and registers: whenever the
//! trace says "same", a full walk must agree.

use std::sync::Arc;

use heapprofd_unwinder::{
    Arch, FdMaps, FdMemory, ModuleCache, ProcessContext, RawUnwind, RegisterFile, StackSample,
    WalkTrace, stack_matches, walk_inputs,
};

use crate::selfcapture::{self, SelfSample};

fn live_context() -> ProcessContext {
    ProcessContext::new(
        std::process::id(),
        Box::new(FdMaps::new(std::fs::File::open("/proc/self/maps").unwrap())),
        Box::new(FdMemory::new(
            std::fs::File::open("/proc/self/mem").unwrap(),
        )),
        Arc::new(ModuleCache::default()),
    )
}

fn probe() -> u64 {
    let x = 0u8;
    &x as *const u8 as u64
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn same(a: &RawUnwind, b: &RawUnwind) -> bool {
    a.pcs == b.pcs && a.leaf_is_return == b.leaf_is_return && a.error == b.error
}

/// What [`check_replay`] saw.
#[allow(dead_code)] // fields read through Debug
#[derive(Debug)]
pub struct ReplayCheck {
    pub replayable: bool,
    pub bp_used: bool,
    pub claimed: usize,
    pub differed: usize,
}

/// Traces the walk of (`regs`, `sp`, `stack`), then mutates copies of the
/// stack and registers at random; whenever the trace claims the walk is
/// unchanged, a full walk must agree (asserted).
pub fn check_replay(
    ctx: &mut ProcessContext,
    regs: &RegisterFile,
    sp: u64,
    stack: &[u8],
    seed: u64,
    rounds: usize,
) -> ReplayCheck {
    let skip = 0..0;
    let mut base = RawUnwind::default();
    let mut trace = WalkTrace::default();
    let sample = StackSample {
        arch: Arch::X86_64,
        regs,
        stack_pointer: sp,
        stack,
        skip: skip.clone(),
    };
    ctx.unwind_raw_traced(&sample, &mut base, &mut trace);
    // The traced walk agrees with the untraced one.
    let mut plain = RawUnwind::default();
    ctx.unwind_raw(Arch::X86_64, regs, sp, stack, skip.clone(), &mut plain);
    assert!(same(&base, &plain));
    let mut check = ReplayCheck {
        replayable: trace.replayable,
        bp_used: trace.bp.is_some(),
        claimed: 0,
        differed: 0,
    };
    let words = stack.len() / 8;
    if !trace.replayable || words == 0 {
        return check;
    }
    let mut rng = Rng(seed | 1);
    for _ in 0..rounds {
        let mut regs = *regs;
        let mut stack = stack.to_vec();
        for _ in 0..1 + rng.below(3) {
            let w = match rng.below(4) {
                // A word the walk read, or one next to it.
                0 | 1 if !trace.reads.is_empty() => {
                    let (addr, _) = trace.reads[rng.below(trace.reads.len() as u64) as usize];
                    let off = (addr - sp) as usize / 8;
                    (off + rng.below(3) as usize)
                        .saturating_sub(1)
                        .min(words - 1)
                }
                _ => rng.below(words as u64) as usize,
            };
            let v = match rng.below(3) {
                0 => rng.next(),
                1 => u64::from_le_bytes(stack[w * 8..w * 8 + 8].try_into().unwrap()) ^ 1,
                _ => {
                    // Another word of the same stack: plausible pointers.
                    let o = rng.below(words as u64) as usize * 8;
                    u64::from_le_bytes(stack[o..o + 8].try_into().unwrap())
                }
            };
            stack[w * 8..w * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        if rng.below(4) == 0 {
            regs.0[6] = rng.next(); // rbp
        }
        let inputs = walk_inputs(Arch::X86_64, &regs, sp, &stack);
        let claims_same = inputs.is_some_and(|(pc, isp, bp)| {
            pc == trace.pc && isp == trace.sp && trace.bp.is_none_or(|b| b == bp)
        }) && stack_matches(&trace.reads, sp, &stack);
        let mut r = RawUnwind::default();
        ctx.unwind_raw(Arch::X86_64, &regs, sp, &stack, skip.clone(), &mut r);
        if claims_same {
            check.claimed += 1;
            assert!(
                same(&r, &base),
                "the trace claimed an identical walk: {:x?} vs {:x?}",
                r.pcs,
                base.pcs
            );
        } else if !same(&r, &base) {
            check.differed += 1;
        }
    }
    check
}

fn check_mutations(ctx: &mut ProcessContext, s: &SelfSample, seed: u64, rounds: usize) {
    let c = check_replay(ctx, &s.regs, s.sp, &s.stack, seed, rounds);
    eprintln!("{c:?} of {rounds}");
    assert!(c.replayable, "a stack read only from its copy");
    // Both branches were exercised.
    assert!(c.claimed > rounds / 10, "{c:?}");
    assert!(c.differed > rounds / 20, "{c:?}");
}

#[test]
fn replayed_walks_equal_full_walks() {
    let end = selfcapture::mapping_end(probe());
    let mut ctx = live_context();
    for (depth, seed) in [(3, 0x9e37_79b9_7f4a_7c15), (12, 0x2545_f491_4f6c_dd1d)] {
        let s = selfcapture::capture_at_depth(depth, end);
        check_mutations(&mut ctx, &s, seed, 3000);
    }
}

#[test]
fn a_thread_stack_replays_too() {
    std::thread::spawn(|| {
        let end = selfcapture::mapping_end(probe());
        let mut ctx = live_context();
        let s = selfcapture::capture_at_depth(7, end);
        check_mutations(&mut ctx, &s, 0xdead_beef_cafe_f00d, 2000);
    })
    .join()
    .unwrap();
}
