//! A worker's per-session memory of what it has unwound: whole stacks by
//! their raw pcs, and pcs by their interned frames.
//!
//! The hot path of a malloc sample is a replay check ([`WalkMemo`]): if
//! the sample's first frame (pc, sp, and bp when it matters) and every stack
//! word an earlier walk from there read are the same, the walk would give
//! the same frames, and the stack id kept with that walk is the answer, at
//! the cost of one compare per word read. Otherwise the copied stack is
//! walked into a reused buffer of pcs ([`ProcessContext::unwind_raw`], or
//! `unwind_raw_traced` to keep the walk for replay), and the whole pc
//! sequence is looked up in `StackCache::stacks` (one hash of ~24 words).
//! A hit gives the worker's *stack id*, which the bookkeeping thread maps
//! to its callsite with one vector index, so neither side walks a frame at
//! a time. Only a new stack goes through the per-pc cache, and only a new
//! pc is looked up in the process's mappings
//! ([`ProcessContext::resolve_pc`]), interned, and queued for
//! symbolization.
//!
//! ```text
//!  record --memo (pc, sp[, bp] + words read)--> id -----------------------> Op::Malloc { stack: id }
//!            | miss                              ^
//!            v                                   | hit (trace kept in memo)
//!          unwind_raw(_traced) -> pcs + [tail] --stacks--> id
//!                                          | miss
//!                                          v
//!                               per pc: pc_cache --miss--> resolve_pc -> intern (+ symbolizer queue)
//!                                          |                   | unmapped: refresh_maps_for, unwind again
//!                                          v                   v          (once), else cut: INVALID_MAP
//!                               frames (outermost first) ------------> Op::Stack { id, frames }
//! ```
//!
//! Stack ids are per session and only ever defined by an [`Op::Stack`] that
//! precedes their first use in the same ordered stream. Id
//! [`SCRATCH_STACK`] is redefined before each use: it carries stacks that
//! must not be cached (cut at an unmapped pc, so that the next sample
//! retries the maps as the unwinder's rate limit allows), and are never kept
//! for replay. When the process's mappings change (a re-read found new
//! ones) or the cache reaches [`MAX_STACKS`], everything (replay memo
//! included) is forgotten and ids start again from 1;
//! redefinitions overwrite the bookkeeping's entries, so its table never
//! outgrows the cache.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use heapprofd_proto::wire::{Arch, MallocHeader, RegisterFile, StackSampleHeader};
use heapprofd_unwinder::{
    Mapping, ProcessContext, RawUnwind, StackSample, UnwindErrorKind, WalkTrace, walk_inputs,
};
use rustc_hash::FxHashMap;

use super::costs::UnwindSplit;
use super::memo::WalkMemo;
use super::symbolize::Symbolizer;
use heapprofd_model::messages::{Op, SCRATCH_STACK};
use heapprofd_model::profile::{FrameId, Interner};

/// Distinct stacks remembered per session before the cache starts over.
pub const MAX_STACKS: usize = 1 << 16;
/// Interned frames remembered for pcs before the pc cache starts over.
const MAX_PC_FRAMES: usize = 1 << 22;

/// Where a sample's walk starts: its registers and the address of its
/// stack copy (a malloc sample's, a stack sample's).
pub trait WalkStart {
    /// How to read the registers.
    fn arch(&self) -> Arch;
    /// The registers.
    fn regs(&self) -> &RegisterFile;
    /// Address of the first stack byte copied.
    fn sp(&self) -> u64;
}

impl WalkStart for MallocHeader {
    fn arch(&self) -> Arch {
        self.arch
    }
    fn regs(&self) -> &RegisterFile {
        &self.regs
    }
    fn sp(&self) -> u64 {
        self.stack_pointer
    }
}

impl WalkStart for StackSampleHeader {
    fn arch(&self) -> Arch {
        self.arch
    }
    fn regs(&self) -> &RegisterFile {
        &self.regs
    }
    fn sp(&self) -> u64 {
        self.stack_pointer
    }
}

/// A cached stack: its id and whether its unwinding ended in an error.
#[derive(Debug, Clone, Copy)]
pub struct StackEntry {
    /// The worker's stack id (see the module docs).
    pub id: u32,
    /// Why the unwind stopped early, if it did.
    pub error: Option<UnwindErrorKind>,
}

/// Per-session caches; see the module docs.
#[derive(Debug, Default)]
pub struct StackCache {
    /// Raw pcs of a stack followed by one tail word (see [`tail_word`]) ->
    /// its id.
    stacks: FxHashMap<Box<[u64]>, StackEntry>,
    next_id: u32,
    /// Lookup pc -> range of `pc_frames` (the pc's frames, innermost first).
    pc_cache: FxHashMap<u64, (u32, u32)>,
    pc_frames: Vec<FrameId>,
    /// The reused walk buffer.
    raw: RawUnwind,
    /// Scratch for a new stack's frames.
    frames: Vec<FrameId>,
    /// `ERROR <KIND>` frames by kind.
    error_frames: [Option<FrameId>; UnwindErrorKind::COUNT],
    /// Walks that can be replayed (see [`WalkMemo`]).
    pub memo: WalkMemo<StackEntry>,
    /// The reused trace buffer.
    trace: WalkTrace,
    /// Incremented whenever everything is forgotten (new mappings).
    generation: u64,
    /// Walks, traced walks and new stacks, with their times (the replays
    /// are counted by the session, which times them).
    pub split: UnwindSplit,
}

/// The last word of a stack's key: whether its leaf is a return address
/// and how its walk ended. Keys differ in length or in this word whenever
/// they could mean different stacks.
fn tail_word(raw: &RawUnwind) -> u64 {
    let error = raw.error.map_or(0, |k| k.index() as u64 + 1);
    (error << 1) | u64::from(raw.leaf_is_return)
}

/// What the worker needs from its surroundings to intern a new stack.
#[derive(Debug)]
pub struct InternCtx<'a> {
    /// Shared frame table.
    pub interner: &'a Interner,
    /// Deferred-symbolization queue.
    pub symbolizer: &'a Symbolizer,
    /// Symbolize frames (names, files, lines); otherwise only build id +
    /// rel_pc.
    pub symbolize: bool,
}

impl StackCache {
    /// Unwinds the sample and returns its stack, defining it with an
    /// [`Op::Stack`] pushed to `ops` when it is new.
    pub fn stack_of(
        &mut self,
        process: &mut ProcessContext,
        h: &impl WalkStart,
        stack: &[u8],
        skip: &Range<u64>,
        cx: &InternCtx<'_>,
        ops: &mut Vec<Op>,
    ) -> StackEntry {
        match self.replay(h, stack) {
            Some(e) => e,
            None => self.stack_of_unreplayed(process, h, stack, skip, cx, ops),
        }
    }

    /// The stack of a sample whose walk can be replayed (see
    /// [`StackCache::memo`]), without walking.
    #[inline]
    pub fn replay(&mut self, h: &impl WalkStart, stack: &[u8]) -> Option<StackEntry> {
        let inputs = walk_inputs(h.arch(), h.regs(), h.sp(), stack)?;
        self.memo.lookup(inputs, h.sp(), stack)
    }

    /// [`StackCache::stack_of`] for a sample [`StackCache::replay`] did not
    /// find: walks it (keeping a trace of the walk when the memo is
    /// tracing).
    pub fn stack_of_unreplayed(
        &mut self,
        process: &mut ProcessContext,
        h: &impl WalkStart,
        stack: &[u8],
        skip: &Range<u64>,
        cx: &InternCtx<'_>,
        ops: &mut Vec<Op>,
    ) -> StackEntry {
        let inputs = walk_inputs(h.arch(), h.regs(), h.sp(), stack);
        let traced = inputs.is_some() && self.memo.should_trace();
        self.split.walks += 1;
        // A traced walk costs microseconds: two clock reads are noise.
        let traced_at = traced.then(Instant::now);
        let mut defining = Duration::ZERO;
        if traced {
            let sample = StackSample {
                arch: h.arch(),
                regs: h.regs(),
                stack_pointer: h.sp(),
                stack,
                skip: skip.clone(),
            };
            process.unwind_raw_traced(&sample, &mut self.raw, &mut self.trace);
        } else {
            process.unwind_raw(
                h.arch(),
                h.regs(),
                h.sp(),
                stack,
                skip.clone(),
                &mut self.raw,
            );
        }
        let tail = tail_word(&self.raw);
        self.raw.pcs.push(tail);
        let hit = self.stacks.get(&self.raw.pcs[..]).copied();
        self.raw.pcs.pop();
        let generation = self.generation;
        let entry = match hit {
            Some(e) => e,
            None => {
                let t = Instant::now();
                let e = self.new_stack(process, h, stack, skip, cx, ops);
                defining = t.elapsed();
                self.split.new_stacks += 1;
                self.split.new_stack += defining;
                e
            }
        };
        // A trace is kept only for a cached stack of the walk it traced (not
        // for a sample walked again after new mappings).
        if traced && entry.id != SCRATCH_STACK && generation == self.generation {
            self.memo.insert(&self.trace, entry);
        }
        if let Some(t) = traced_at {
            self.split.traced_walks += 1;
            self.split.traced += t.elapsed().saturating_sub(defining);
        }
        entry
    }

    #[cold]
    #[inline(never)]
    fn new_stack(
        &mut self,
        process: &mut ProcessContext,
        h: &impl WalkStart,
        stack: &[u8],
        skip: &Range<u64>,
        cx: &InternCtx<'_>,
        ops: &mut Vec<Op>,
    ) -> StackEntry {
        let mut refreshed = false;
        let (error, cacheable) = 'resolve: loop {
            self.frames.clear();
            for i in 0..self.raw.pcs.len() {
                let lookup_pc = self.raw.lookup_pc(i);
                if let Some(&(start, len)) = self.pc_cache.get(&lookup_pc) {
                    let (start, len) = (start as usize, len as usize);
                    self.frames
                        .extend_from_slice(&self.pc_frames[start..start + len]);
                    continue;
                }
                let pc = self.raw.pcs[i];
                let Some((mapping, rel_pc)) = process.resolve_pc(pc, lookup_pc) else {
                    if !refreshed && process.refresh_maps_for(pc) {
                        // New mappings: what pcs meant may have changed.
                        refreshed = true;
                        self.clear();
                        process.unwind_raw(
                            h.arch(),
                            h.regs(),
                            h.sp(),
                            stack,
                            skip.clone(),
                            &mut self.raw,
                        );
                        continue 'resolve;
                    }
                    // Cut here, as the unwinder's `unwind` does; not cached,
                    // so a later sample can retry the maps.
                    self.raw.pcs.truncate(i);
                    break 'resolve (Some(UnwindErrorKind::InvalidMap), false);
                };
                let start = self.pc_frames.len();
                intern_pc(
                    process,
                    pc,
                    lookup_pc,
                    mapping,
                    rel_pc,
                    cx,
                    &mut self.pc_frames,
                );
                let len = self.pc_frames.len() - start;
                self.pc_cache.insert(lookup_pc, (start as u32, len as u32));
                self.frames
                    .extend_from_slice(&self.pc_frames[start..start + len]);
            }
            break (self.raw.error, true);
        };
        if let Some(kind) = error {
            let f = self.error_frame(kind, cx.interner);
            self.frames.push(f);
        }
        // Leaf first from the unwinder (inline chains innermost first); the
        // callsite tree wants the outermost caller first.
        self.frames.reverse();
        let frames: Box<[FrameId]> = self.frames.as_slice().into();
        if !cacheable {
            ops.push(Op::Stack {
                id: SCRATCH_STACK,
                frames,
            });
            return StackEntry {
                id: SCRATCH_STACK,
                error,
            };
        }
        if self.stacks.len() >= MAX_STACKS {
            self.stacks.clear();
            self.next_id = 0;
            self.memo.clear();
        }
        if self.pc_frames.len() >= MAX_PC_FRAMES {
            self.pc_cache.clear();
            self.pc_frames.clear();
        }
        self.next_id += 1;
        let entry = StackEntry {
            id: self.next_id,
            error,
        };
        let tail = tail_word(&self.raw);
        self.raw.pcs.push(tail);
        self.stacks.insert(self.raw.pcs.as_slice().into(), entry);
        self.raw.pcs.pop();
        ops.push(Op::Stack {
            id: entry.id,
            frames,
        });
        entry
    }

    /// Forgets every stack and pc (the process's mappings changed).
    pub fn clear(&mut self) {
        self.generation += 1;
        self.memo.clear();
        self.stacks.clear();
        self.next_id = 0;
        self.pc_cache.clear();
        self.pc_frames.clear();
    }

    fn error_frame(&mut self, kind: UnwindErrorKind, interner: &Interner) -> FrameId {
        *self.error_frames[kind.index()]
            .get_or_insert_with(|| interner.intern_error_frame(kind.as_str()))
    }

    /// Distinct stacks cached now.
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    /// Whether no stack is cached.
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }
}

/// Interns one pc's frames (innermost first) into `out`. Frames in a module
/// are interned bare (mapping + rel_pc) and queued for deferred
/// symbolization (see [`Symbolizer`]); code outside any file (JIT) is named
/// from the process's perf map right away, which is cheap.
fn intern_pc(
    process: &ProcessContext,
    pc: u64,
    lookup_pc: u64,
    mapping: &Arc<Mapping>,
    rel_pc: u64,
    cx: &InternCtx<'_>,
    out: &mut Vec<FrameId>,
) {
    let interner = cx.interner;
    let mapping_id = Some(super::mapping::intern_mapping(interner, mapping));
    let bare = interner.intern_frame(mapping_id, rel_pc, None, None, None);
    if cx.symbolize {
        if mapping.module.is_some() {
            cx.symbolizer.request(bare, mapping, rel_pc);
        } else {
            let frame = heapprofd_unwinder::Frame {
                pc,
                lookup_pc,
                rel_pc,
                mapping: Some(Arc::clone(mapping)),
                error: None,
            };
            let chain = process.symbolize_frame(&frame);
            if !chain.is_empty() {
                out.extend(chain.iter().map(|f| {
                    interner.intern_frame(
                        mapping_id,
                        rel_pc,
                        f.function.as_deref(),
                        f.file.as_deref(),
                        f.line,
                    )
                }));
                return;
            }
        }
    }
    out.push(bare);
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use heapprofd_proto::wire::{Arch, RegisterFile};
    use heapprofd_unwinder::{ModuleCache, NoMemory, ProcessOptions, StaticMaps};

    use super::*;

    fn process(reparse_interval: Duration) -> ProcessContext {
        ProcessContext::with_options(
            std::process::id(),
            Box::new(StaticMaps(
                std::fs::read_to_string("/proc/self/maps").unwrap(),
            )),
            Box::new(NoMemory),
            Arc::new(ModuleCache::default()),
            ProcessOptions {
                reparse_interval,
                ..Default::default()
            },
        )
    }

    /// A sample whose only frame is `pc` (an empty stack: the walk keeps
    /// the first frame and stops with MEMORY_INVALID or UNWIND_INFO).
    pub(crate) fn header(pc: u64) -> MallocHeader {
        let mut regs = RegisterFile::default();
        regs.0[heapprofd_proto::wire::x86_64::RIP] = pc;
        regs.0[heapprofd_proto::wire::x86_64::RSP] = 0x7000_0000;
        MallocHeader {
            flags: 0,
            sequence: 1,
            alloc_size: 8,
            sample_size: 8,
            address: 0x10,
            timestamp_ns: 0,
            context_id: 0,
            tid: 1,
            heap_id: 0,
            arch: Arch::X86_64,
            stack_pointer: 0x7000_0000,
            stack_len: 0,
            stack_reused: 0,
            regs,
        }
    }

    fn code_pc() -> u64 {
        code_pc as *const () as usize as u64 + 4
    }

    #[test]
    fn a_known_stack_is_defined_once_then_hit() {
        let interner = Interner::new();
        let symbolizer = Symbolizer::new();
        let cx = InternCtx {
            interner: &interner,
            symbolizer: &symbolizer,
            symbolize: false,
        };
        let mut p = process(Duration::from_secs(3600));
        let mut cache = StackCache::default();
        let mut ops = Vec::new();
        let h = header(code_pc());
        let a = cache.stack_of(&mut p, &h, &[], &(0..0), &cx, &mut ops);
        assert_ne!(a.id, SCRATCH_STACK);
        assert!(a.error.is_some(), "an empty stack copy ends in an error");
        assert_eq!(ops.len(), 1);
        let Op::Stack { id, frames } = &ops[0] else {
            panic!("{ops:?}")
        };
        assert_eq!(*id, a.id);
        assert_eq!(frames.len(), 2, "the frame and the error frame: {frames:?}");
        let b = cache.stack_of(&mut p, &h, &[], &(0..0), &cx, &mut ops);
        assert_eq!(b.id, a.id);
        assert_eq!(ops.len(), 1, "a hit defines nothing");
        assert_eq!(cache.len(), 1);
        // Skipping the only frame is another stack.
        let pc = code_pc();
        let c = cache.stack_of(&mut p, &h, &[], &(pc..pc + 1), &cx, &mut ops);
        assert_ne!(c.id, a.id);
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn an_unmapped_pc_is_cut_and_never_cached() {
        let interner = Interner::new();
        let symbolizer = Symbolizer::new();
        let cx = InternCtx {
            interner: &interner,
            symbolizer: &symbolizer,
            symbolize: true,
        };
        let mut p = process(Duration::ZERO);
        let mut cache = StackCache::default();
        let mut ops = Vec::new();
        let h = header(0x10);
        for round in 1..=2 {
            let e = cache.stack_of(&mut p, &h, &[], &(0..0), &cx, &mut ops);
            assert_eq!(e.id, SCRATCH_STACK);
            assert_eq!(e.error, Some(UnwindErrorKind::InvalidMap));
            let Some(Op::Stack { id, frames }) = ops.last() else {
                panic!("{ops:?}")
            };
            assert_eq!((*id, frames.len()), (SCRATCH_STACK, 1));
            // Each sample retries the maps (no rate limit here).
            assert_eq!(p.stats().map_reparses, round);
        }
        assert!(cache.is_empty());
        let name = interner.read().function_name(match &ops[0] {
            Op::Stack { frames, .. } => frames[0],
            _ => unreachable!(),
        });
        assert_eq!(name.as_deref(), Some("ERROR INVALID_MAP"));
    }
}
