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
use std::ops::ControlFlow;

use crate::unwind::{ProcessView, ReadLog, StackSample, Step, WalkEnd, Walker};

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
    log: ReadLog,
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
/// walk (`ProcessContext::unwind_raw_traced`).
///
/// Cost, when the walk is replayable: the walk with its reads and frame
/// states logged, a short walk per input tested (see below), and one full
/// walk with every dropped input poisoned. A return address is known to
/// matter without a test (it becomes the next frame's pc). Another word,
/// or bp, is tested by walking on from the frame that first reads it, with
/// it poisoned, only until the walk is back in the logged state (same
/// frame, sp and bp, and the word not read again): from there on the walk
/// is the logged one. Usually that is one or two frames.
pub(crate) fn walk_traced(
    walker: &mut Walker,
    view: &ProcessView<'_>,
    sample: &StackSample<'_>,
    out: &mut RawUnwind,
    trace: &mut WalkTrace,
) {
    trace.replayable = false;
    trace.bp = None;
    let mut log = std::mem::take(&mut trace.log);
    log.reads.clear();
    log.steps.clear();
    log.outside = false;
    log.end = None;
    walker.walk(view, sample, out, Some(&mut log));
    trace.reads.clear();
    trace.reads.extend_from_slice(&log.reads);
    let inputs = walk_inputs(sample.arch, sample.regs, sample.stack_pointer, sample.stack);
    let (Some((pc, sp, bp)), false, Some(_)) = (inputs, log.outside, log.end) else {
        trace.log = log;
        return;
    };
    (trace.pc, trace.sp) = (pc, sp);

    let mut check = std::mem::take(&mut trace.check);
    let mut check_log = std::mem::take(&mut trace.check_log);
    let mut scratch = std::mem::take(&mut trace.scratch);
    scratch.clear();
    scratch.extend_from_slice(sample.stack);
    let mut work = Poisoned {
        stack: scratch,
        sample,
    };

    // bp, poisoned (bit 62 flipped makes any address derived from it
    // non-canonical, so a read there fails), from the first frame on.
    let bp_unused = log.steps.first().is_some_and(|first| {
        let start = Step {
            bp: bp ^ POISON,
            ..*first
        };
        let from = Resume {
            k: 0,
            start,
            poisoned: None,
        };
        same_from(walker, view, &work.view(), &log, from, &mut check_log)
    });
    // Each word read, poisoned alone, from the first frame that reads it.
    let mut unused = std::mem::take(&mut trace.unused);
    unused.clear();
    let mut step = 0usize;
    for r in 0..log.reads.len() {
        while step + 1 < log.steps.len() && log.steps[step + 1].reads_start <= r {
            step += 1;
        }
        let (addr, value) = log.reads[r];
        if log.reads[..r].iter().any(|&(a, _)| a == addr) {
            continue; // tested at its first read
        }
        let becomes_pc = log
            .steps
            .get(step + 1)
            .is_some_and(|s| s.addr.address() == value);
        if becomes_pc {
            continue; // a return address always matters
        }
        work.flip(addr);
        let from = Resume {
            k: step,
            start: log.steps[step],
            poisoned: Some(addr),
        };
        let same = same_from(walker, view, &work.view(), &log, from, &mut check_log);
        work.flip(addr);
        if same {
            unused.push(addr);
        }
    }
    // All of them (and bp) poisoned at once must still give the same
    // walk; otherwise keep every word and bp's verdict alone.
    if !unused.is_empty() {
        for &addr in &unused {
            work.flip(addr);
        }
        let mut poisoned = *sample.regs;
        if bp_unused {
            poisoned.0[x86_64::RBP] = bp ^ POISON;
        }
        let all = StackSample {
            regs: &poisoned,
            ..work.view()
        };
        if !same_walk(walker, view, &all, out, &log, &mut check, &mut check_log) {
            unused.clear();
        }
    }
    trace.reads.retain(|(a, _)| !unused.contains(a));
    trace.bp = (!bp_unused).then_some(bp);
    trace.replayable = true;
    trace.check = check;
    trace.check_log = check_log;
    trace.scratch = work.stack;
    trace.unused = unused;
    trace.log = log;
}

/// A copy of a sample's stack that words can be poisoned in.
struct Poisoned<'s> {
    stack: Vec<u8>,
    sample: &'s StackSample<'s>,
}

impl Poisoned<'_> {
    fn view(&self) -> StackSample<'_> {
        StackSample {
            stack: &self.stack,
            ..self.sample.clone()
        }
    }

    /// Flips [`POISON`] in the word at `addr` (a logged read: in the copy).
    fn flip(&mut self, addr: u64) {
        flip(&mut self.stack, (addr - self.sample.stack_pointer) as usize);
    }
}

/// Where [`same_from`] walks on from: the logged frame `k` in state
/// `start` (the logged one, or with bp poisoned), and the word poisoned in
/// the sample, if any.
#[derive(Debug, Clone, Copy)]
struct Resume {
    k: usize,
    start: Step,
    poisoned: Option<u64>,
}

/// Whether walking `sample` on from `from` gives the logged walk: each
/// frame the logged one with the same sp, each frame's reads at the logged
/// addresses, until the state is the logged one again (sp and bp) and the
/// poisoned word is not read again, or to the same end.
fn same_from(
    walker: &mut Walker,
    view: &ProcessView<'_>,
    sample: &StackSample<'_>,
    log: &ReadLog,
    from: Resume,
    check_log: &mut ReadLog,
) -> bool {
    let Resume { k, start, poisoned } = from;
    let steps = &log.steps;
    let n = steps.len();
    let reads_of = |i: usize| {
        let from = steps[i].reads_start;
        let to = steps.get(i + 1).map_or(log.reads.len(), |s| s.reads_start);
        &log.reads[from..to]
    };
    let same_addresses = |a: &[(u64, u64)], b: &[(u64, u64)]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0)
    };
    let read_again = |i: usize| {
        poisoned.is_some_and(|p| log.reads[steps[i].reads_start..].iter().any(|r| r.0 == p))
    };
    check_log.reads.clear();
    check_log.steps.clear();
    check_log.outside = false;
    let mut verdict: Option<bool> = None;
    let mut i = k;
    let mut step_reads = 0usize;
    let max_frames = walker.max_frames();
    let end = walker.resume_x86_64(view, sample, start, check_log, |addr, regs, reader| {
        let reads = reader.reads_since(step_reads);
        let ok = same_addresses(reads, reads_of(i));
        step_reads += reads.len();
        i += 1;
        if !ok || i >= n || addr != steps[i].addr || regs.sp() != steps[i].sp {
            verdict = Some(false);
            return ControlFlow::Break(WalkEnd::Root);
        }
        // The logged walk refused this frame (the frame limit): so would
        // this one, having walked the same frames.
        let refused = i + 1 == n && i >= max_frames && log.end == Some(WalkEnd::MaxFrames);
        if refused || (regs.bp() == steps[i].bp && !read_again(i)) {
            verdict = Some(true);
            return ControlFlow::Break(WalkEnd::Root);
        }
        ControlFlow::Continue(())
    });
    // A read outside the copy (refused: no process memory here) makes the
    // walk differ, as in `same_walk`.
    if check_log.outside {
        return false;
    }
    if let Some(v) = verdict {
        return v;
    }
    // The walk ended by itself: on the logged walk's last frame, the same
    // way, after the same reads.
    i + 1 == n
        && Some(end) == log.end
        && same_addresses(
            &check_log.reads[step_reads.min(check_log.reads.len())..],
            reads_of(i),
        )
}

/// Whether walking `sample` gives `out` and reads, all from the copy, the
/// addresses `log` lists, in order (no process memory is read).
fn same_walk(
    walker: &mut Walker,
    view: &ProcessView<'_>,
    sample: &StackSample<'_>,
    out: &RawUnwind,
    log: &ReadLog,
    check: &mut RawUnwind,
    check_log: &mut ReadLog,
) -> bool {
    check_log.reads.clear();
    check_log.steps.clear();
    check_log.outside = false;
    let view = ProcessView {
        mappings: view.mappings,
        memory: None,
    };
    walker.walk(&view, sample, check, Some(check_log));
    !check_log.outside
        && check_log.reads.len() == log.reads.len()
        && check_log
            .reads
            .iter()
            .zip(&log.reads)
            .all(|(a, b)| a.0 == b.0)
        && check.pcs == out.pcs
        && check.leaf_is_return == out.leaf_is_return
        && check.error == out.error
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
