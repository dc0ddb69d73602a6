//! Unwinding one sample: registers + the copied stack → frames.
//!
//! Memory view: reads inside `[stack_pointer, stack_pointer + stack.len())`
//! are served from the copy; reads below `stack_pointer` inside the stack's
//! mapping are refused (that memory has changed since the sample); every
//! other read is a `pread` of the process memory. Return addresses are
//! looked up at `address - 1` (the call instruction), the first frame at its
//! pc.
//!
//! The walk ([`ProcessContext::unwind_raw`]: addresses only, into a reused
//! buffer) and the mapping lookups ([`ProcessContext::resolve_pc`]) are
//! separate, so a caller that caches what pcs mean looks up only new ones.
//! When a pc falls in no known mapping, the maps are read again (rate
//! limited, [`ProcessContext::refresh_maps_for`]) and, if they changed (a
//! `dlopen`), the walk is redone once with the new modules.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use framehop::aarch64::{PtrAuthMask, UnwindRegsAarch64};
use framehop::x86_64::UnwindRegsX86_64;
use framehop::{FrameAddress, Unwinder};
use heapprofd_proto::wire::{Arch, RegisterFile, aarch64, x86_64};

use crate::memory::ProcessMemory;
use crate::process::{ArchUnwinder, Mapping, ProcessContext};
use crate::replay::ReadLog;

/// Why an unwind stopped before the root of the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnwindErrorKind {
    /// A stack (or memory) read the unwind rules asked for failed: the copy
    /// was too short or the process memory was unreadable.
    MemoryInvalid,
    /// A frame's address is in no mapping of the process (after a re-read
    /// of the maps): a corrupt stack or garbage return address.
    InvalidMap,
    /// The code had no unwind information and the frame-pointer guess led
    /// nowhere (or the CFI gave an impossible result).
    UnwindInfo,
    /// More than the frame limit.
    MaxFramesExceeded,
    /// pc or sp are zero, or sp is outside the copied stack.
    InvalidRegisters,
}

impl UnwindErrorKind {
    /// Number of kinds.
    pub const COUNT: usize = 5;
    /// All kinds, in [`UnwindErrorKind::index`] order.
    pub const ALL: [UnwindErrorKind; Self::COUNT] = [
        Self::MemoryInvalid,
        Self::InvalidMap,
        Self::UnwindInfo,
        Self::MaxFramesExceeded,
        Self::InvalidRegisters,
    ];

    /// Dense index for counters.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Upper-case name, as used in the `ERROR <KIND>` frame (libunwindstack
    /// and Perfetto spell the first four the same way).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MemoryInvalid => "MEMORY_INVALID",
            Self::InvalidMap => "INVALID_MAP",
            Self::UnwindInfo => "UNWIND_INFO",
            Self::MaxFramesExceeded => "MAX_FRAMES_EXCEEDED",
            Self::InvalidRegisters => "INVALID_REGISTERS",
        }
    }
}

impl std::fmt::Display for UnwindErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One frame of an unwound stack.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Absolute pc: the interrupted pc for the first frame of the walk, a
    /// return address for the others. 0 for the error frame.
    pub pc: u64,
    /// Address to symbolize: `pc` for the first frame of the walk,
    /// `pc - 1` for return addresses.
    pub lookup_pc: u64,
    /// ELF virtual address of `lookup_pc` in its module (what offline
    /// symbolizers and Perfetto's `Frame.rel_pc` take).
    pub rel_pc: u64,
    /// The mapping `pc` falls in (`None` only for the error frame).
    pub mapping: Option<Arc<Mapping>>,
    /// Set on the synthetic last frame of a stack that ended in an error.
    pub error: Option<UnwindErrorKind>,
}

impl Frame {
    fn error(kind: UnwindErrorKind) -> Frame {
        Frame {
            pc: 0,
            lookup_pc: 0,
            rel_pc: 0,
            mapping: None,
            error: Some(kind),
        }
    }
}

/// The result of [`ProcessContext::unwind`].
#[derive(Debug, Clone, Default)]
pub struct UnwindResult {
    /// Leaf first. When `error` is set, the last element is the synthetic
    /// error frame (`Frame::error` set).
    pub frames: Vec<Frame>,
    /// Why the walk stopped early, if it did.
    pub error: Option<UnwindErrorKind>,
}

impl UnwindResult {
    /// The real frames (without the synthetic error frame).
    pub fn real_frames(&self) -> &[Frame] {
        match self.frames.last() {
            Some(f) if f.error.is_some() => &self.frames[..self.frames.len() - 1],
            _ => &self.frames,
        }
    }
}

/// The addresses of one unwound sample, without mappings: what
/// [`ProcessContext::unwind_raw`] fills in.
///
/// Reuse one value for many samples: its vector keeps its capacity, so the
/// hot path allocates nothing.
#[derive(Debug, Clone, Default)]
pub struct RawUnwind {
    /// Absolute pcs, leaf first, leading client-library frames dropped.
    pub pcs: Vec<u64>,
    /// Whether `pcs[0]` is a return address (looked up at `pc - 1`): true
    /// unless the first frame of the walk (the interrupted pc) was kept.
    /// Every later entry is a return address.
    pub leaf_is_return: bool,
    /// Why the walk stopped early: a framehop error (classified), the frame
    /// limit, or bad registers. Never [`UnwindErrorKind::InvalidMap`]: the
    /// walk does not look pcs up in the mappings (see
    /// [`ProcessContext::resolve_pc`]).
    pub error: Option<UnwindErrorKind>,
}

impl RawUnwind {
    /// The address to symbolize of frame `i`: its pc for the interrupted
    /// pc, `pc - 1` (the call instruction) for return addresses.
    #[inline]
    pub fn lookup_pc(&self, i: usize) -> u64 {
        let pc = self.pcs[i];
        if i == 0 && !self.leaf_is_return {
            pc
        } else {
            pc.wrapping_sub(1)
        }
    }
}

/// How a walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WalkEnd {
    Root,
    Framehop(framehop::Error),
    MaxFrames,
    InvalidRegisters,
}

impl ProcessContext {
    /// Unwinds one sample.
    ///
    /// * `regs`: the captured registers (DWARF numbering, see
    ///   [`heapprofd_proto::wire::RegisterFile`]);
    /// * `stack_pointer`, `stack`: the copied stack `[sp, sp + len)`;
    /// * `skip`: text range of the client library. Leading frames whose pc is
    ///   inside it (the malloc hook and its helpers) are dropped, so the
    ///   first frame is the user's call site: the function that called
    ///   `malloc`/`new` (C++ `operator new` in libstdc++ stays as a frame).
    ///   An empty range drops nothing.
    ///
    /// Built on [`ProcessContext::unwind_raw`] and
    /// [`ProcessContext::resolve_pc`]: the stack is cut at the first pc in no
    /// known mapping (after one rate-limited re-read of the maps, see
    /// [`ProcessContext::refresh_maps_for`], and then a second walk if they
    /// changed), which ends it in [`UnwindErrorKind::InvalidMap`].
    pub fn unwind(
        &mut self,
        arch: Arch,
        regs: &RegisterFile,
        stack_pointer: u64,
        stack: &[u8],
        skip: Range<u64>,
    ) -> UnwindResult {
        let t0 = Instant::now();
        let mut raw = std::mem::take(&mut self.raw_scratch);
        self.unwind_raw(arch, regs, stack_pointer, stack, skip.clone(), &mut raw);
        let first_unmapped = |ctx: &Self, raw: &RawUnwind| {
            (0..raw.pcs.len()).find(|&i| ctx.resolve_pc(raw.pcs[i], raw.lookup_pc(i)).is_none())
        };
        let mut unmapped = first_unmapped(self, &raw);
        if let Some(i) = unmapped
            && self.refresh_maps_for(raw.pcs[i])
        {
            self.unwind_raw(arch, regs, stack_pointer, stack, skip, &mut raw);
            unmapped = first_unmapped(self, &raw);
        }
        let mut error = raw.error;
        if let Some(i) = unmapped {
            raw.pcs.truncate(i);
            error = Some(UnwindErrorKind::InvalidMap);
        }
        let mut frames = Vec::with_capacity(raw.pcs.len() + 1);
        for (i, &pc) in raw.pcs.iter().enumerate() {
            let lookup_pc = raw.lookup_pc(i);
            let (mapping, rel_pc) = match self.resolve_pc(pc, lookup_pc) {
                Some((m, rel_pc)) => (Some(Arc::clone(m)), rel_pc),
                None => (None, lookup_pc),
            };
            frames.push(Frame {
                pc,
                lookup_pc,
                rel_pc,
                mapping,
                error: None,
            });
        }
        self.raw_scratch = raw;
        self.stats.unwinds += 1;
        self.stats.frames += frames.len() as u64;
        if let Some(kind) = error {
            self.stats.errors[kind.index()] += 1;
            frames.push(Frame::error(kind));
        }
        let dt = t0.elapsed();
        self.stats.unwind_time += dt;
        self.stats.max_unwind_time = self.stats.max_unwind_time.max(dt);
        UnwindResult { frames, error }
    }

    /// Unwinds one sample into `out`, addresses only: the hot path of a
    /// profiler that caches what each pc means.
    ///
    /// Same walk as [`ProcessContext::unwind`] (same arguments, client
    /// frames dropped by address range, at most
    /// [`ProcessOptions::max_frames`](crate::ProcessOptions::max_frames)
    /// frames walked, framehop errors classified), but no pc is looked up
    /// in the mappings, nothing is allocated once `out` has grown, and
    /// [`ProcessStats`](crate::ProcessStats) are not touched. The caller
    /// resolves the pcs it has not seen with [`ProcessContext::resolve_pc`];
    /// when one is in no known mapping it should call
    /// [`ProcessContext::refresh_maps_for`] and, if that returns true, forget
    /// what it cached and unwind the sample again; a pc still unmapped cuts
    /// the stack there with [`UnwindErrorKind::InvalidMap`].
    pub fn unwind_raw(
        &mut self,
        arch: Arch,
        regs: &RegisterFile,
        stack_pointer: u64,
        stack: &[u8],
        skip: Range<u64>,
        out: &mut RawUnwind,
    ) {
        out.pcs.clear();
        out.leaf_is_return = false;
        let (end, last) = self.walk(arch, regs, stack_pointer, stack, skip, out, None);
        out.error = self.walk_error(end, last);
    }

    /// The error of a walk that ended with `end`.
    pub(crate) fn walk_error(&self, end: WalkEnd, last: Option<u64>) -> Option<UnwindErrorKind> {
        match end {
            WalkEnd::Root => None,
            WalkEnd::MaxFrames => Some(UnwindErrorKind::MaxFramesExceeded),
            WalkEnd::InvalidRegisters => Some(UnwindErrorKind::InvalidRegisters),
            WalkEnd::Framehop(e) => Some(self.classify(e, last)),
        }
    }

    /// The mapping of a frame and the frame's `rel_pc` (ELF virtual address
    /// of `lookup_pc`), or `None` when `pc` is in no known mapping. One
    /// binary search over the mappings; no allocation.
    #[inline]
    pub fn resolve_pc(&self, pc: u64, lookup_pc: u64) -> Option<(&Arc<Mapping>, u64)> {
        let m = self.mapping_for(pc)?;
        Some((m, m.rel_pc(lookup_pc)))
    }

    /// `pc` is in no known mapping: re-reads the maps (a `dlopen` since the
    /// last read) unless a re-read that did not find its address happened
    /// within [`ProcessOptions::reparse_interval`](crate::ProcessOptions).
    /// Returns whether the mappings changed: then every cached meaning of a
    /// pc may be stale and the sample should be unwound again. A re-read
    /// after which `pc` is still unmapped starts the rate limit.
    pub fn refresh_maps_for(&mut self, pc: u64) -> bool {
        if !self.may_reparse() {
            return false;
        }
        let changed = self.reparse();
        let found = changed && self.mapping_for(pc).is_some();
        self.reparse_result(found);
        changed
    }

    /// The error of a walk that framehop stopped; `last` is the last
    /// address walked (client frames included).
    fn classify(&self, e: framehop::Error, last: Option<u64>) -> UnwindErrorKind {
        let last_has_cfi = last
            .and_then(|pc| self.mapping_for(pc))
            .is_some_and(|m| m.has_unwind_info());
        match e {
            framehop::Error::CouldNotReadStack(_) if last_has_cfi => UnwindErrorKind::MemoryInvalid,
            framehop::Error::CouldNotReadStack(_) => UnwindErrorKind::UnwindInfo,
            framehop::Error::IntegerOverflow
            | framehop::Error::DidNotAdvance
            | framehop::Error::FramepointerUnwindingMovedBackwards
            | framehop::Error::ReturnAddressIsNull => UnwindErrorKind::UnwindInfo,
        }
    }

    /// Walks the stack into `out` (client frames dropped). Returns how the
    /// walk ended and the last address walked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn walk(
        &mut self,
        arch: Arch,
        regs: &RegisterFile,
        stack_pointer: u64,
        stack: &[u8],
        skip: Range<u64>,
        out: &mut RawUnwind,
        mut log: Option<&mut ReadLog>,
    ) -> (WalkEnd, Option<u64>) {
        let r = &regs.0;
        let (sp, pc) = match arch {
            Arch::X86_64 => (r[x86_64::RSP], r[x86_64::RIP]),
            Arch::Aarch64 => (r[aarch64::SP], r[aarch64::PC]),
        };
        let stack_end = stack_pointer.saturating_add(stack.len() as u64);
        if pc == 0 || sp == 0 || (!stack.is_empty() && !(stack_pointer..=stack_end).contains(&sp)) {
            return (WalkEnd::InvalidRegisters, None);
        }
        // The stack's own mapping: reads below the copy there are refused.
        let stack_map = self
            .mapping_for(stack_pointer)
            .map_or(stack_pointer..stack_pointer, |m| m.start..m.end);
        self.ensure_unwinder(arch);
        let max_code = self.max_code;
        let memory: &dyn ProcessMemory = &*self.memory;
        let mut read = |addr: u64| -> Result<u64, ()> {
            if let Some(off) = addr.checked_sub(stack_pointer)
                && let Ok(off) = usize::try_from(off)
                && let Some(b) = off.checked_add(8).and_then(|e| stack.get(off..e))
            {
                let mut w = [0u8; 8];
                w.copy_from_slice(b);
                let v = u64::from_le_bytes(w);
                if let Some(log) = log.as_deref_mut() {
                    log.reads.push((addr, v));
                }
                return Ok(v);
            }
            if let Some(log) = log.as_deref_mut() {
                log.outside = true;
            }
            if addr < stack_pointer && stack_map.contains(&addr) {
                return Err(());
            }
            memory.read_u64(addr).map_err(|_| ())
        };
        let mut sink = Sink {
            out,
            skip,
            skipping: true,
            walked: 0,
            last: None,
            max: self.options.max_frames,
        };
        let end = match (&self.unwinder, arch) {
            (Some(ArchUnwinder::X86_64(u)), Arch::X86_64) => {
                let Some(cache) = self.cache_x86_64.as_deref_mut() else {
                    return (WalkEnd::InvalidRegisters, None);
                };
                let regs = UnwindRegsX86_64::new(pc, sp, r[x86_64::RBP]);
                let mut it = u.iter_frames(pc, regs, cache, &mut read);
                collect(|| it.next(), &mut sink)
            }
            (Some(ArchUnwinder::Aarch64(u)), Arch::Aarch64) => {
                let Some(cache) = self.cache_aarch64.as_deref_mut() else {
                    return (WalkEnd::InvalidRegisters, None);
                };
                // Pointer-authentication bits are above the highest code
                // address of the process (JIT code included).
                let mask = match max_code {
                    0 => PtrAuthMask::new_no_strip(),
                    a => PtrAuthMask::from_max_known_address(a.max(u.max_known_code_address())),
                };
                let regs = UnwindRegsAarch64::new_with_ptr_auth_mask(
                    mask,
                    r[aarch64::LR],
                    sp,
                    r[aarch64::FP],
                );
                let mut it = u.iter_frames(pc, regs, cache, &mut read);
                collect(|| it.next(), &mut sink)
            }
            _ => WalkEnd::InvalidRegisters,
        };
        (end, sink.last)
    }
}

/// Where a walk's frames go: client frames dropped, the frame limit counted
/// over every frame walked.
struct Sink<'a> {
    out: &'a mut RawUnwind,
    skip: Range<u64>,
    skipping: bool,
    walked: usize,
    last: Option<u64>,
    max: usize,
}

fn collect(
    mut next: impl FnMut() -> Result<Option<FrameAddress>, framehop::Error>,
    sink: &mut Sink<'_>,
) -> WalkEnd {
    loop {
        match next() {
            Ok(Some(fa)) => {
                if sink.walked >= sink.max {
                    return WalkEnd::MaxFrames;
                }
                let pc = fa.address();
                sink.walked += 1;
                sink.last = Some(pc);
                if sink.skipping {
                    if sink.skip.contains(&pc) {
                        continue;
                    }
                    sink.skipping = false;
                    sink.out.leaf_is_return = fa.is_return_address();
                }
                sink.out.pcs.push(pc);
            }
            Ok(None) | Err(framehop::Error::ReturnAddressIsNull) => return WalkEnd::Root,
            Err(e) => return WalkEnd::Framehop(e),
        }
    }
}
