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

use std::ops::Range;
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
    /// The process's memory (reads outside the stack copy).
    pub(crate) memory: &'a dyn ProcessMemory,
}

/// The reads of one walk (crate-internal: filled by the walk's memory
/// closure).
#[derive(Debug, Clone, Default)]
pub(crate) struct ReadLog {
    /// (address, value) of each read served from the stack copy, in order.
    pub(crate) reads: Vec<(u64, u64)>,
    /// Some read was not served from the copy.
    pub(crate) outside: bool,
}

enum ArchUnwinder {
    X86_64(UnwinderX86_64<SectionBytes>),
    Aarch64(UnwinderAarch64<SectionBytes>),
}

/// The framehop state of one process: its modules, the unwinder for the
/// architecture walked so far (built on first use), and the rule caches.
pub(crate) struct Walker {
    max_frames: usize,
    modules: Vec<framehop::Module<SectionBytes>>,
    unwinder: Option<ArchUnwinder>,
    cache_x86_64: Option<Box<CacheX86_64>>,
    cache_aarch64: Option<Box<CacheAarch64>>,
    /// Highest end of an executable mapping (aarch64 pointer-auth mask).
    max_code: u64,
}

/// How a walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WalkEnd {
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
            cache_x86_64: None,
            cache_aarch64: None,
            max_code: 0,
        }
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
        match (&self.cache_x86_64, &self.cache_aarch64) {
            (Some(c), _) => Some(c.stats()),
            (None, Some(c)) => Some(c.stats()),
            (None, None) => None,
        }
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
                self.cache_x86_64
                    .get_or_insert_with(|| Box::new(CacheX86_64::new()));
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
    /// sets `out.error`; with a `log`, every stack read is appended to it.
    pub(crate) fn walk(
        &mut self,
        view: &ProcessView<'_>,
        sample: &StackSample<'_>,
        out: &mut RawUnwind,
        log: Option<&mut ReadLog>,
    ) {
        out.pcs.clear();
        out.leaf_is_return = false;
        let (end, last) = self.walk_frames(view, sample, out, log);
        out.error = match end {
            WalkEnd::Root => None,
            WalkEnd::MaxFrames => Some(UnwindErrorKind::MaxFramesExceeded),
            WalkEnd::InvalidRegisters => Some(UnwindErrorKind::InvalidRegisters),
            WalkEnd::Framehop(e) => Some(classify(view, e, last)),
        };
    }

    /// Walks the stack into `out` (client frames dropped). Returns how the
    /// walk ended and the last address walked.
    fn walk_frames(
        &mut self,
        view: &ProcessView<'_>,
        sample: &StackSample<'_>,
        out: &mut RawUnwind,
        mut log: Option<&mut ReadLog>,
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
        // The stack's own mapping: reads below the copy there are refused.
        let stack_map = mapping_at(view.mappings, stack_pointer)
            .map_or(stack_pointer..stack_pointer, |m| m.start..m.end);
        self.ensure_unwinder(arch);
        let max_code = self.max_code;
        let memory = view.memory;
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
            skip: sample.skip.clone(),
            skipping: true,
            walked: 0,
            last: None,
            max: self.max_frames,
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
