//! Recognising a sample whose walk must give the same result as an earlier
//! one, without walking it.
//!
//! For a given set of mappings the walk is a pure function of its inputs:
//! the first frame's registers (x86_64: pc, sp, bp), and the stack words the
//! unwind rules read (return addresses, saved frame pointers). framehop's
//! rules are chosen by pc from the modules, which only change when the maps
//! are re-read. So if a later sample has the same pc and sp (and bp, unless
//! the walk was shown not to depend on it), and holds the same value at every
//! address the first walk read, in order, then by induction each step reads
//! the same address, gets the same value and reaches the same state: the
//! walk would read exactly those words and return exactly the same frames.
//! Checking the reads (one or two words per frame) is several times cheaper
//! than walking (a rule-cache lookup, a rule and a read per frame).
//!
//! Only walks whose every read was served from the stack copy can be
//! replayed: a read of the process's memory (outside the copy) could give a
//! different value later, and its refusal or failure depends on the copy's
//! bounds. Only x86_64 is traced (aarch64 also takes the link register and a
//! pointer-authentication mask into account; not traced, never replayed).
//!
//! Not every input matters. Whether the walk depends on bp is decided by
//! walking a second time with bp's bit 62 flipped (a non-canonical address,
//! so any read at an address derived from it fails): if that walk reads the
//! same addresses and ends the same way, no step used bp's value (it was
//! carried along unused, or replaced by a saved value read from the stack),
//! and the trace holds for any bp; otherwise bp is part of the trace's key.
//! The same test is run for each word read, poisoned alone in a copy of the
//! stack: a saved register restored into bp that no later step uses before
//! the next restore (common in code that uses rbp as a general register,
//! where its saved value changes from call to call) changes nothing and is
//! dropped from the trace; a return address always changes the walk and is
//! kept. In framehop's x86_64 rules a read value becomes the next pc, the
//! next bp, or the base of the next reads, so a value that did not matter
//! when poisoned cannot matter for any other value. Finally every dropped
//! word and bp (if unused) are poisoned together and the walk must still be
//! the same, else nothing is dropped.

use heapprofd_proto::wire::{Arch, RegisterFile, x86_64};

use crate::frame::RawUnwind;
use crate::unwind::{ProcessView, ReadLog, StackSample, Walker};

/// What a walk depended on; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct WalkTrace {
    /// Whether the walk can be replayed at all: x86_64, valid registers,
    /// every read served from the stack copy.
    pub replayable: bool,
    /// The first frame's pc.
    pub pc: u64,
    /// The first frame's sp.
    pub sp: u64,
    /// The first frame's bp, when the walk depends on it.
    pub bp: Option<u64>,
    /// (address, value) of every stack word read whose value matters, in
    /// order.
    pub reads: Vec<(u64, u64)>,
    /// Scratch for the relevance checks.
    check: RawUnwind,
    check_log: ReadLog,
    scratch: Vec<u8>,
    unused: Vec<u64>,
}

/// The first frame's (pc, sp, bp) of an x86_64 sample whose registers the
/// walk accepts, or `None` (other architectures, or registers the walk
/// rejects as INVALID_REGISTERS).
#[inline]
pub fn walk_inputs(
    arch: Arch,
    regs: &RegisterFile,
    stack_pointer: u64,
    stack: &[u8],
) -> Option<(u64, u64, u64)> {
    if arch != Arch::X86_64 {
        return None;
    }
    let r = &regs.0;
    let (pc, sp, bp) = (r[x86_64::RIP], r[x86_64::RSP], r[x86_64::RBP]);
    let stack_end = stack_pointer.saturating_add(stack.len() as u64);
    if pc == 0 || sp == 0 || (!stack.is_empty() && !(stack_pointer..=stack_end).contains(&sp)) {
        return None;
    }
    Some((pc, sp, bp))
}

/// Whether the stack copy `[stack_pointer, stack_pointer + stack.len())`
/// holds `value` at every `address` of `reads`.
#[inline]
pub fn stack_matches(reads: &[(u64, u64)], stack_pointer: u64, stack: &[u8]) -> bool {
    reads.iter().all(|&(addr, value)| {
        let Some(off) = addr
            .checked_sub(stack_pointer)
            .and_then(|o| usize::try_from(o).ok())
        else {
            return false;
        };
        match off.checked_add(8).and_then(|e| stack.get(off..e)) {
            Some(b) => {
                let mut w = [0u8; 8];
                w.copy_from_slice(b);
                u64::from_le_bytes(w) == value
            }
            None => false,
        }
    })
}

/// [`Walker::walk`] that also records in `trace` what the walk depended on,
/// so that later samples with the same inputs can be recognised
/// ([`walk_inputs`], [`stack_matches`]) and given the same result without a
/// walk (`ProcessContext::unwind_raw_traced`). When the walk is replayable
/// this costs one more walk per distinct word read plus two (the relevance
/// checks, see the module docs): a few microseconds, paid once per kept
/// trace.
pub(crate) fn walk_traced(
    walker: &mut Walker,
    view: &ProcessView<'_>,
    sample: &StackSample<'_>,
    out: &mut RawUnwind,
    trace: &mut WalkTrace,
) {
    trace.replayable = false;
    trace.bp = None;
    let mut log = ReadLog {
        reads: std::mem::take(&mut trace.reads),
        outside: false,
    };
    log.reads.clear();
    walker.walk(view, sample, out, Some(&mut log));
    trace.reads = log.reads;
    let (regs, stack_pointer, stack) = (sample.regs, sample.stack_pointer, sample.stack);
    let Some((pc, sp, bp)) = walk_inputs(sample.arch, regs, stack_pointer, stack) else {
        return;
    };
    if log.outside {
        return;
    }
    (trace.pc, trace.sp) = (pc, sp);

    let mut check = std::mem::take(&mut trace.check);
    let mut scratch = std::mem::take(&mut trace.scratch);
    scratch.clear();
    scratch.extend_from_slice(stack);
    // The same walk with bp poisoned: bit 62 flipped makes any address
    // derived from it non-canonical, so a read there fails.
    let mut poisoned = *regs;
    poisoned.0[x86_64::RBP] = bp ^ POISON;
    let bp_unused = same_walk(
        walker,
        view,
        &StackSample {
            regs: &poisoned,
            stack: &scratch,
            ..sample.clone()
        },
        out,
        trace,
        &mut check,
    );
    // Each word read, poisoned alone: a word whose value changes
    // nothing (a saved register restored into bp and never used
    // before the next restore) needs no check.
    let mut unused = std::mem::take(&mut trace.unused);
    unused.clear();
    for k in 0..trace.reads.len() {
        let (addr, _) = trace.reads[k];
        let off = (addr - stack_pointer) as usize; // in the copy: logged
        let verdict = if trace.reads[..k].iter().any(|&(a, _)| a == addr) {
            unused.contains(&addr)
        } else {
            flip(&mut scratch, off);
            let same = same_walk(
                walker,
                view,
                &StackSample {
                    stack: &scratch,
                    ..sample.clone()
                },
                out,
                trace,
                &mut check,
            );
            flip(&mut scratch, off);
            same
        };
        if verdict && !unused.contains(&addr) {
            unused.push(addr);
        }
    }
    // All of them (and bp) poisoned at once must still give the same
    // walk; otherwise keep every word and bp's verdict alone.
    if !unused.is_empty() {
        for &addr in &unused {
            flip(&mut scratch, (addr - stack_pointer) as usize);
        }
        let r = if bp_unused { &poisoned } else { regs };
        if !same_walk(
            walker,
            view,
            &StackSample {
                regs: r,
                stack: &scratch,
                ..sample.clone()
            },
            out,
            trace,
            &mut check,
        ) {
            unused.clear();
        }
    }
    trace.reads.retain(|(a, _)| !unused.contains(a));
    trace.bp = (!bp_unused).then_some(bp);
    trace.replayable = true;
    trace.check = check;
    trace.scratch = scratch;
    trace.unused = unused;
}

/// Whether walking `sample` gives `out` and reads, all from the copy, the
/// addresses `trace.reads` lists, in order.
fn same_walk(
    walker: &mut Walker,
    view: &ProcessView<'_>,
    sample: &StackSample<'_>,
    out: &RawUnwind,
    trace: &mut WalkTrace,
    check: &mut RawUnwind,
) -> bool {
    let mut log = std::mem::take(&mut trace.check_log);
    log.reads.clear();
    log.outside = false;
    walker.walk(view, sample, check, Some(&mut log));
    let same = !log.outside
        && log.reads.len() == trace.reads.len()
        && log.reads.iter().zip(&trace.reads).all(|(a, b)| a.0 == b.0)
        && check.pcs == out.pcs
        && check.leaf_is_return == out.leaf_is_return
        && check.error == out.error;
    trace.check_log = log;
    same
}

/// Bit 62: flipping it makes any canonical x86_64 address non-canonical.
const POISON: u64 = 1 << 62;

/// Flips [`POISON`] in the stack word at `off`.
fn flip(stack: &mut [u8], off: usize) {
    if let Some(b) = stack.get_mut(off..off + 8) {
        let v = u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) ^ POISON;
        b.copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_matches_checks_bounds_and_values() {
        let mut stack = vec![0u8; 32];
        stack[8..16].copy_from_slice(&0x1234u64.to_le_bytes());
        let sp = 0x1000;
        assert!(stack_matches(&[], sp, &stack));
        assert!(stack_matches(&[(0x1008, 0x1234), (0x1000, 0)], sp, &stack));
        assert!(!stack_matches(&[(0x1008, 0x1235)], sp, &stack));
        assert!(!stack_matches(&[(0x0ff8, 0)], sp, &stack), "below the copy");
        assert!(!stack_matches(&[(0x1019, 0)], sp, &stack), "past the end");
        assert!(!stack_matches(&[(u64::MAX, 0)], sp, &stack));
    }

    #[test]
    fn walk_inputs_rejects_what_the_walk_rejects() {
        let mut r = RegisterFile::default();
        let stack = [0u8; 64];
        assert_eq!(walk_inputs(Arch::X86_64, &r, 0x1000, &stack), None);
        r.0[x86_64::RIP] = 0x40;
        r.0[x86_64::RSP] = 0x1010;
        r.0[x86_64::RBP] = 7;
        assert_eq!(
            walk_inputs(Arch::X86_64, &r, 0x1000, &stack),
            Some((0x40, 0x1010, 7))
        );
        assert_eq!(walk_inputs(Arch::X86_64, &r, 0x1020, &stack), None);
        assert_eq!(walk_inputs(Arch::Aarch64, &r, 0x1000, &stack), None);
        // An empty copy accepts any sp, like the walk.
        assert!(walk_inputs(Arch::X86_64, &r, 0x9000, &[]).is_some());
    }
}
