//! Walking one sample: registers + the copied stack → return addresses,
//! with framehop over the process's modules.
//!
//! Memory view: reads inside `[stack_pointer, stack_pointer + stack.len())`
//! are served from the copy; reads below `stack_pointer` inside the stack's
//! mapping are refused (that memory has changed since the sample); every
//! other read is a `pread` of the process memory. Leading frames in the
//! client library's text range are dropped; at most `max_frames` frames are
//! walked, client frames included.
//!
//! [`Walker`] owns what the walk needs beyond one sample and the process's
//! mappings and memory (it is given those as a [`ProcessView`]): the
//! framehop unwinder built from the mappings' modules and its rule cache.
//! It looks pcs up in no mapping and records nothing but, on request, the
//! stack words it read (a [`ReadLog`], for `replay`).

use std::ops::{ControlFlow, Range};
use std::sync::Arc;

use framehop::aarch64::{CacheAarch64, PtrAuthMask, UnwindRegsAarch64, UnwinderAarch64};
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{FrameAddress, Unwinder};
use heapprofd_proto::wire::{Arch, RegisterFile, aarch64, x86_64};

use crate::elf::SectionBytes;
use crate::frame::{RawUnwind, UnwindErrorKind};
use crate::mapping::{Mapping, mapping_at};
use crate::memory::ProcessMemory;

/// One captured sample, as the unwinding functions take it.
#[derive(Debug, Clone)]
pub struct StackSample<'a> {
    /// How to read `regs`.
    pub arch: Arch,
    /// The captured registers (DWARF numbering, see
    /// [`heapprofd_proto::wire::RegisterFile`]).
    pub regs: &'a RegisterFile,
    /// Address of the first byte of `stack`.
    pub stack_pointer: u64,
    /// The copied stack `[stack_pointer, stack_pointer + stack.len())`.
    pub stack: &'a [u8],
    /// Text range of the client library: leading frames inside it are
    /// dropped (an empty range drops nothing).
    pub skip: Range<u64>,
}

/// What a walk reads of the process besides the sample.
pub(crate) struct ProcessView<'a> {
    /// The known mappings, sorted by address.
    pub(crate) mappings: &'a [Arc<Mapping>],
    /// The process's memory (reads outside the stack copy); `None` makes
    /// such reads fail (the replay checks, which only ever compare walks
    /// that never read outside the copy).
    pub(crate) memory: Option<&'a dyn ProcessMemory>,
}

/// The reads of one walk (crate-internal: filled by the walk's reader).
#[derive(Debug, Clone, Default)]
pub(crate) struct ReadLog {
    /// (address, value) of each read served from the stack copy, in order.
    pub(crate) reads: Vec<(u64, u64)>,
    /// Some read was not served from the copy.
    pub(crate) outside: bool,
    /// The state each frame was unwound from, in walking order (x86_64
    /// walks only; client frames included).
    pub(crate) steps: Vec<Step>,
    /// How the walk ended.
    pub(crate) end: Option<WalkEnd>,
}

/// One frame of an x86_64 walk: its address and the registers it is
/// unwound from, and where its reads start in [`ReadLog::reads`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) addr: FrameAddress,
    pub(crate) sp: u64,
    pub(crate) bp: u64,
    pub(crate) reads_start: usize,
}

/// Highest user-space address plus one on every x86_64 or aarch64 paging
/// mode: reads at or above it (a poisoned or garbage pointer) fail without
/// asking the process's memory.
const USER_ADDRESS_LIMIT: u64 = 1 << 56;

/// Serves a walk's reads: the stack copy, then the process's memory (see
/// the module docs).
pub(crate) struct StackReader<'s, 'l> {
    stack_pointer: u64,
    stack: &'s [u8],
    /// The stack's own mapping: reads below the copy there are refused.
    stack_map: Range<u64>,
    memory: Option<&'s dyn ProcessMemory>,
    log: Option<&'l mut ReadLog>,
}

impl StackReader<'_, '_> {
    #[inline]
    fn read(&mut self, addr: u64) -> Result<u64, ()> {
        if let Some(off) = addr.checked_sub(self.stack_pointer)
            && let Ok(off) = usize::try_from(off)
            && let Some(b) = off.checked_add(8).and_then(|e| self.stack.get(off..e))
        {
            let mut w = [0u8; 8];
            w.copy_from_slice(b);
            let v = u64::from_le_bytes(w);
            if let Some(log) = self.log.as_deref_mut() {
                log.reads.push((addr, v));
            }
            return Ok(v);
        }
        if let Some(log) = self.log.as_deref_mut() {
            log.outside = true;
        }
        if (addr < self.stack_pointer && self.stack_map.contains(&addr))
            || addr >= USER_ADDRESS_LIMIT
        {
            return Err(());
        }
        match self.memory {
            Some(m) => m.read_u64(addr).map_err(|_| ()),
            None => Err(()),
        }
    }

    /// The reads logged since position `from`.
    pub(crate) fn reads_since(&self, from: usize) -> &[(u64, u64)] {
        self.log
            .as_deref()
            .map_or(&[], |l| &l.reads[from.min(l.reads.len())..])
    }
}

enum ArchUnwinder {
    X86_64(UnwinderX86_64<SectionBytes>),
    Aarch64(UnwinderAarch64<SectionBytes>),
}

/// framehop's rule caches per walker: framehop's cache is direct-mapped
/// with 509 slots, which a big program's code thrashes (gcc's cc1: every
/// miss re-parses CFI); a frame picks one of these
/// by the address bits above the slot index, so together they act as one
/// direct-mapped cache of `509 * RULE_CACHES` slots.
const RULE_CACHES: usize = 32;

/// The rule cache for a frame looked up at `lookup`.
#[inline]
fn rule_cache_index(lookup: u64) -> usize {
    ((lookup / 509) % RULE_CACHES as u64) as usize
}

/// The framehop state of one process: its modules, the unwinder for the
/// architecture walked so far (built on first use), and the rule caches.
pub(crate) struct Walker {
    max_frames: usize,
    modules: Vec<framehop::Module<SectionBytes>>,
    unwinder: Option<ArchUnwinder>,
    caches_x86_64: Vec<CacheX86_64>,
    cache_aarch64: Option<Box<CacheAarch64>>,
    /// Highest end of an executable mapping (aarch64 pointer-auth mask).
    max_code: u64,
}

/// How a walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WalkEnd {
    Root,
    Framehop(framehop::Error),
    MaxFrames,
    InvalidRegisters,
}

impl Walker {
    /// A walker with no modules that walks at most `max_frames` frames.
    pub(crate) fn new(max_frames: usize) -> Self {
        Walker {
            max_frames,
            modules: Vec::new(),
            unwinder: None,
            caches_x86_64: Vec::new(),
            cache_aarch64: None,
            max_code: 0,
        }
    }

    /// Frames walked at most.
    pub(crate) fn max_frames(&self) -> usize {
        self.max_frames
    }

    /// Takes the modules of a new set of mappings (the unwinder is rebuilt
    /// at the next walk; the rule caches are kept).
    pub(crate) fn set_mappings(&mut self, mappings: &[Arc<Mapping>]) {
        self.max_code = mappings
            .iter()
            .filter(|m| m.exec)
            .map(|m| m.end)
            .max()
            .unwrap_or(0);
        self.modules = mappings.iter().filter_map(|m| framehop_module(m)).collect();
        self.unwinder = None;
    }

    /// framehop's rule-cache counters of the architecture walked so far.
    pub(crate) fn rule_cache_stats(&self) -> Option<framehop::CacheStats> {
        if !self.caches_x86_64.is_empty() {
            let mut sum = framehop::CacheStats::new();
            for c in &self.caches_x86_64 {
                let s = c.stats();
                sum.hit_count += s.hit_count;
                sum.miss_empty_slot_count += s.miss_empty_slot_count;
                sum.miss_wrong_modules_count += s.miss_wrong_modules_count;
                sum.miss_wrong_address_count += s.miss_wrong_address_count;
            }
            return Some(sum);
        }
        self.cache_aarch64.as_ref().map(|c| c.stats())
    }

    /// The framehop unwinder for `arch`, built on first use.
    fn ensure_unwinder(&mut self, arch: Arch) {
        let ok = matches!(
            (&self.unwinder, arch),
            (Some(ArchUnwinder::X86_64(_)), Arch::X86_64)
                | (Some(ArchUnwinder::Aarch64(_)), Arch::Aarch64)
        );
        if ok {
            return;
        }
        self.unwinder = Some(match arch {
            Arch::X86_64 => {
                let mut u = UnwinderX86_64::new();
                for m in &self.modules {
                    u.add_module(m.clone());
                }
                if self.caches_x86_64.is_empty() {
                    self.caches_x86_64 = (0..RULE_CACHES).map(|_| CacheX86_64::new()).collect();
                }
                ArchUnwinder::X86_64(u)
            }
            Arch::Aarch64 => {
                let mut u = UnwinderAarch64::new();
                for m in &self.modules {
                    u.add_module(m.clone());
                }
                self.cache_aarch64
                    .get_or_insert_with(|| Box::new(CacheAarch64::new()));
                ArchUnwinder::Aarch64(u)
            }
        });
    }

    /// Walks `sample` into `out` (cleared first; client frames dropped) and
    /// sets `out.error`; with a `log`, every stack read
    /// and (x86_64) every frame's state is appended to it.
    pub(crate) fn walk(
        &mut self,
        view: &ProcessView<'_>,
        sample: &StackSample<'_>,
        out: &mut RawUnwind,
        log: Option<&mut ReadLog>,
    ) {
        out.pcs.clear();
        out.leaf_is_return = false;
        let mut log = log;
        let (end, last) = self.walk_frames(view, sample, out, log.as_deref_mut());
        if let Some(log) = log {
            log.end = Some(end);
        }
        out.error = end_error(view, end, last);
    }

    /// The reader of a walk over `sample`.
    fn reader<'s, 'l>(
        view: &ProcessView<'s>,
        sample: &StackSample<'s>,
        log: Option<&'l mut ReadLog>,
    ) -> StackReader<'s, 'l> {
        let stack_pointer = sample.stack_pointer;
        StackReader {
            stack_pointer,
            stack: sample.stack,
            stack_map: mapping_at(view.mappings, stack_pointer)
                .map_or(stack_pointer..stack_pointer, |m| m.start..m.end),
            memory: view.memory,
            log,
        }
    }

    /// Walks the stack into `out` (client frames dropped). Returns how the
    /// walk ended and the last address walked.
    fn walk_frames(
        &mut self,
        view: &ProcessView<'_>,
        sample: &StackSample<'_>,
        out: &mut RawUnwind,
        log: Option<&mut ReadLog>,
    ) -> (WalkEnd, Option<u64>) {
        let (arch, stack_pointer, stack) = (sample.arch, sample.stack_pointer, sample.stack);
        let r = &sample.regs.0;
        let (sp, pc) = match arch {
            Arch::X86_64 => (r[x86_64::RSP], r[x86_64::RIP]),
            Arch::Aarch64 => (r[aarch64::SP], r[aarch64::PC]),
        };
        let stack_end = stack_pointer.saturating_add(stack.len() as u64);
        if pc == 0 || sp == 0 || (!stack.is_empty() && !(stack_pointer..=stack_end).contains(&sp)) {
            return (WalkEnd::InvalidRegisters, None);
        }
        self.ensure_unwinder(arch);
        let max_code = self.max_code;
        let mut reader = Self::reader(view, sample, log);
        let mut sink = Sink {
            out,
            skip: sample.skip.clone(),
            skipping: true,
            walked: 0,
            last: None,
            max: self.max_frames,
        };
        let end = match (&self.unwinder, arch) {
            (Some(ArchUnwinder::X86_64(u)), Arch::X86_64) => {
                let regs = UnwindRegsX86_64::new(pc, sp, r[x86_64::RBP]);
                let start = FrameAddress::from_instruction_pointer(pc);
                run_x86_64(
                    u,
                    &mut self.caches_x86_64,
                    start,
                    regs,
                    &mut reader,
                    |addr, regs, reader| {
                        if let Some(log) = reader.log.as_deref_mut() {
                            log.steps.push(Step {
                                addr,
                                sp: regs.sp(),
                                bp: regs.bp(),
                                reads_start: log.reads.len(),
                            });
                        }
                        sink.frame(addr)
                    },
                )
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
                let mut read = |a| reader.read(a);
                let mut it = u.iter_frames(pc, regs, cache, &mut read);
                loop {
                    match it.next() {
                        Ok(Some(fa)) => {
                            if let ControlFlow::Break(e) = sink.frame(fa) {
                                break e;
                            }
                        }
                        Ok(None) | Err(framehop::Error::ReturnAddressIsNull) => {
                            break WalkEnd::Root;
                        }
                        Err(e) => break WalkEnd::Framehop(e),
                    }
                }
            }
            _ => WalkEnd::InvalidRegisters,
        };
        (end, sink.last)
    }

    /// Walks an x86_64 sample on from the state of one of its frames
    /// (`start`, as a logged walk of the same sample recorded it), with
    /// the reads logged into `log` and no process memory; `on_frame` sees
    /// every frame after `start` with its registers and decides whether to
    /// go on. Returns how the walk ended (`on_frame`'s break included).
    pub(crate) fn resume_x86_64(
        &mut self,
        view: &ProcessView<'_>,
        sample: &StackSample<'_>,
        start: Step,
        log: &mut ReadLog,
        mut on_frame: impl FnMut(
            FrameAddress,
            &UnwindRegsX86_64,
            &StackReader<'_, '_>,
        ) -> ControlFlow<WalkEnd>,
    ) -> WalkEnd {
        self.ensure_unwinder(Arch::X86_64);
        let Some(ArchUnwinder::X86_64(u)) = &self.unwinder else {
            return WalkEnd::InvalidRegisters;
        };
        let view = ProcessView {
            mappings: view.mappings,
            memory: None,
        };
        let mut reader = Self::reader(&view, sample, Some(log));
        let regs = UnwindRegsX86_64::new(start.addr.address(), start.sp, start.bp);
        let mut first = true;
        run_x86_64(
            u,
            &mut self.caches_x86_64,
            start.addr,
            regs,
            &mut reader,
            |addr, regs, reader| {
                if std::mem::take(&mut first) {
                    return ControlFlow::Continue(());
                }
                on_frame(addr, regs, reader)
            },
        )
    }
}

/// The x86_64 walk: `on_frame` sees each frame (the start first) with the
/// registers it is unwound from, then the frame is unwound with the rule
/// cache its lookup address picks.
#[inline]
fn run_x86_64<'s, 'l>(
    u: &UnwinderX86_64<SectionBytes>,
    caches: &mut [CacheX86_64],
    start: FrameAddress,
    mut regs: UnwindRegsX86_64,
    reader: &mut StackReader<'s, 'l>,
    mut on_frame: impl FnMut(
        FrameAddress,
        &UnwindRegsX86_64,
        &mut StackReader<'s, 'l>,
    ) -> ControlFlow<WalkEnd>,
) -> WalkEnd {
    let mut addr = start;
    loop {
        if let ControlFlow::Break(e) = on_frame(addr, &regs, reader) {
            return e;
        }
        let cache = &mut caches[rule_cache_index(addr.address_for_lookup())];
        match u.unwind_frame(addr, &mut regs, cache, &mut |a| reader.read(a)) {
            Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                Some(a) => addr = a,
                None => return WalkEnd::Root,
            },
            Ok(None) | Err(framehop::Error::ReturnAddressIsNull) => return WalkEnd::Root,
            Err(e) => return WalkEnd::Framehop(e),
        }
    }
}

/// The error kind of a walk's end (`last`: the last address walked).
pub(crate) fn end_error(
    view: &ProcessView<'_>,
    end: WalkEnd,
    last: Option<u64>,
) -> Option<UnwindErrorKind> {
    match end {
        WalkEnd::Root => None,
        WalkEnd::MaxFrames => Some(UnwindErrorKind::MaxFramesExceeded),
        WalkEnd::InvalidRegisters => Some(UnwindErrorKind::InvalidRegisters),
        WalkEnd::Framehop(e) => Some(classify(view, e, last)),
    }
}

/// The error of a walk that framehop stopped; `last` is the last address
/// walked (client frames included).
fn classify(view: &ProcessView<'_>, e: framehop::Error, last: Option<u64>) -> UnwindErrorKind {
    let last_has_cfi = last
        .and_then(|pc| mapping_at(view.mappings, pc))
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

impl Sink<'_> {
    /// One more frame: the frame limit, then the client frames dropped.
    #[inline]
    fn frame(&mut self, fa: FrameAddress) -> ControlFlow<WalkEnd> {
        if self.walked >= self.max {
            return ControlFlow::Break(WalkEnd::MaxFrames);
        }
        let pc = fa.address();
        self.walked += 1;
        self.last = Some(pc);
        if self.skipping {
            if self.skip.contains(&pc) {
                return ControlFlow::Continue(());
            }
            self.skipping = false;
            self.out.leaf_is_return = fa.is_return_address();
        }
        self.out.pcs.push(pc);
        ControlFlow::Continue(())
    }
}

/// framehop's module for an executable mapping with CFI.
fn framehop_module(m: &Mapping) -> Option<framehop::Module<SectionBytes>> {
    let module = m.module.as_ref()?;
    if !m.exec || !module.elf.unwind.has_cfi() {
        return None;
    }
    let base_svma = module.elf.base_svma;
    let base_avma = base_svma.wrapping_add(m.avma_bias);
    if base_avma > m.start {
        return None; // inconsistent headers; fall back to frame pointers
    }
    let range: Range<u64> = m.start..m.end;
    Some(framehop::Module::new(
        m.path.clone(),
        range,
        base_avma,
        module.elf.unwind.to_framehop(base_svma),
    ))
}
