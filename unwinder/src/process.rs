//! Per-process state: the mappings of one profiled process, the framehop
//! walker built from them, counters, and the unwinding API.
//!
//! The walk ([`ProcessContext::unwind_raw`]: addresses only, into a reused
//! buffer, see `unwind`) and the mapping lookups
//! ([`ProcessContext::resolve_pc`]) are separate, so a caller that caches
//! what pcs mean looks up only new ones. When a pc falls in no known mapping,
//! the maps are read again (rate limited,
//! [`ProcessContext::refresh_maps_for`]) and, if they changed (a `dlopen`),
//! the walk is redone once with the new modules
//! ([`ProcessContext::unwind`] does all of it).
//!
//! The maps are parsed when the context is created, so samples of a process
//! that exited before they were unwound still unwind: the stack is in the
//! sample and the unwind tables are in the (cached) files. When a frame's
//! address is in no known mapping the maps are read again (a `dlopen` since
//! the last read). Only a re-read that did not find the address counts
//! against the rate limit: after one, the next waits
//! [`ProcessOptions::reparse_interval`], so garbage addresses cannot make
//! every unwind read the maps, while the first sample from a library loaded
//! after the last read always gets its re-read. A read that finds no
//! mappings at all (the process has exited: its maps read as empty) keeps
//! the mappings known so far.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heapprofd_proto::wire::{Arch, RegisterFile};

use crate::cache::ModuleCache;
use crate::early::EarlyModules;
use crate::elf;
use crate::frame::{Frame, RawUnwind, UnwindErrorKind, UnwindResult};
use crate::mapping::{Mapping, mapping_at};
use crate::maps::{self, MapEntry};
use crate::memory::{MapsSource, ProcessMemory};
use crate::perfmap::{self, PerfMap};
use crate::replay::{self, WalkTrace};
use crate::symbol_frame::SymbolFrame;
use crate::symbols::lock;
use crate::unwind::{ProcessView, StackSample, Walker};

/// Tunables of a [`ProcessContext`].
#[derive(Debug, Clone)]
pub struct ProcessOptions {
    /// Minimum time between a re-read of the maps that did not find the
    /// address it was for and the next re-read (default 500 ms).
    pub reparse_interval: Duration,
    /// Frames walked at most, client frames included (default 512).
    pub max_frames: usize,
    /// Where JIT symbols are read from (default `/tmp/perf-PID.map`).
    pub perf_map_path: Option<PathBuf>,
    /// The user a perf map must belong to (besides root) to be read: the
    /// profiled process's (default `None`: any owner; see [`PerfMap::load`]).
    pub perf_map_owner: Option<u32>,
    /// Open module files through `/proc/PID/map_files` first (default true).
    pub use_map_files: bool,
}

impl Default for ProcessOptions {
    fn default() -> Self {
        ProcessOptions {
            reparse_interval: Duration::from_millis(500),
            max_frames: 512,
            perf_map_path: None,
            perf_map_owner: None,
            use_map_files: true,
        }
    }
}

/// Counters of one process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessStats {
    /// Calls to `unwind` (not counted: [`ProcessContext::unwind_raw`]).
    pub unwinds: u64,
    /// Frames returned (error frames excluded).
    pub frames: u64,
    /// Unwinds that ended in an error, by [`UnwindErrorKind::index`].
    pub errors: [u64; UnwindErrorKind::COUNT],
    /// Times the maps were read again after creation.
    pub map_reparses: u64,
    /// Maps lines that could not be parsed (summed over all reads).
    pub bad_map_lines: u64,
    /// Total time spent in `unwind`.
    pub unwind_time: Duration,
    /// Longest single `unwind`.
    pub max_unwind_time: Duration,
}

impl ProcessStats {
    /// Unwinds that ended with `kind`.
    pub fn errors_of(&self, kind: UnwindErrorKind) -> u64 {
        self.errors[kind.index()]
    }

    /// Unwinds that ended in any error.
    pub fn total_errors(&self) -> u64 {
        self.errors.iter().sum()
    }
}

/// Unwinding and symbolization state of one profiled process.
///
/// `Send`, not `Sync`: each process is unwound by one thread at a time (the
/// module cache behind it is shared).
pub struct ProcessContext {
    pid: u32,
    cache: Arc<ModuleCache>,
    maps_source: Box<dyn MapsSource>,
    memory: Box<dyn ProcessMemory>,
    options: ProcessOptions,
    mappings: Vec<Arc<Mapping>>,
    /// framehop over the modules of `mappings`.
    walker: Walker,
    /// When a re-read of the maps last failed to find the address it was
    /// for (the rate limit runs from there).
    last_fruitless_reparse: Option<Instant>,
    stats: ProcessStats,
    raw_scratch: RawUnwind,
    perf_map: Mutex<Option<(PerfMap, Instant)>>,
}

impl std::fmt::Debug for ProcessContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessContext")
            .field("pid", &self.pid)
            .field("mappings", &self.mappings.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Drop for ProcessContext {
    /// Lets go of the process's modules and gives the cache the chance to
    /// evict those nothing else holds (see [`crate::CacheBudget`]).
    fn drop(&mut self) {
        self.mappings.clear();
        self.walker.set_mappings(&[]);
        self.cache.trim();
    }
}

impl ProcessContext {
    /// Creates the context and parses the maps now.
    ///
    /// `maps` and `memory` are, in production, [`crate::FdMaps`] and
    /// [`crate::FdMemory`] over the descriptors the client sent.
    pub fn new(
        pid: u32,
        maps: Box<dyn MapsSource>,
        memory: Box<dyn ProcessMemory>,
        cache: Arc<ModuleCache>,
    ) -> Self {
        Self::with_options(pid, maps, memory, cache, ProcessOptions::default())
    }

    /// [`ProcessContext::new`] with explicit options.
    pub fn with_options(
        pid: u32,
        maps: Box<dyn MapsSource>,
        memory: Box<dyn ProcessMemory>,
        cache: Arc<ModuleCache>,
        options: ProcessOptions,
    ) -> Self {
        Self::with_first_maps(pid, maps, memory, cache, options, None)
    }

    /// The context, its mappings made from `first` (maps text read earlier
    /// and what was opened for it then: [`crate::PendingProcess`]), or from
    /// the maps read now.
    pub(crate) fn with_first_maps(
        pid: u32,
        maps: Box<dyn MapsSource>,
        memory: Box<dyn ProcessMemory>,
        cache: Arc<ModuleCache>,
        options: ProcessOptions,
        first: Option<(String, EarlyModules)>,
    ) -> Self {
        let mut ctx = ProcessContext {
            pid,
            cache,
            maps_source: maps,
            memory,
            walker: Walker::new(options.max_frames),
            options,
            mappings: Vec::new(),
            last_fruitless_reparse: None,
            stats: ProcessStats::default(),
            raw_scratch: RawUnwind::default(),
            perf_map: Mutex::new(None),
        };
        if let Some((text, mut early)) = first {
            ctx.apply_maps(&text, &mut early);
        } else {
            ctx.read_maps();
        }
        ctx
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Counters.
    pub fn stats(&self) -> &ProcessStats {
        &self.stats
    }

    /// The known mappings, sorted by address.
    pub fn mappings(&self) -> &[Arc<Mapping>] {
        &self.mappings
    }

    /// framehop's rule-cache counters (hits, and misses by cause) of the
    /// architecture unwound so far, for diagnostics: a miss parses CFI.
    pub fn rule_cache_stats(&self) -> Option<framehop::CacheStats> {
        self.walker.rule_cache_stats()
    }

    /// The module cache this process uses.
    pub fn module_cache(&self) -> &Arc<ModuleCache> {
        &self.cache
    }

    /// The mapping containing `addr`.
    pub fn mapping_for(&self, addr: u64) -> Option<&Arc<Mapping>> {
        mapping_at(&self.mappings, addr)
    }

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
        let sample = StackSample {
            arch,
            regs,
            stack_pointer,
            stack,
            skip,
        };
        let view = ProcessView {
            mappings: &self.mappings,
            memory: Some(&*self.memory),
        };
        self.walker.walk(&view, &sample, out, None);
    }

    /// [`ProcessContext::unwind_raw`] (the sample's arguments as one
    /// [`StackSample`]) that also records in `trace` what the walk depended on, so that later samples with the same inputs can be
    /// recognised ([`walk_inputs`](crate::walk_inputs),
    /// [`stack_matches`](crate::stack_matches)) and given the same result
    /// without a walk. When the walk is replayable this costs one more walk
    /// per distinct word read plus two (the relevance checks, see the
    /// `replay` module): a few microseconds, paid once per kept trace.
    pub fn unwind_raw_traced(
        &mut self,
        sample: &StackSample<'_>,
        out: &mut RawUnwind,
        trace: &mut WalkTrace,
    ) {
        let view = ProcessView {
            mappings: &self.mappings,
            memory: Some(&*self.memory),
        };
        replay::walk_traced(&mut self.walker, &view, sample, out, trace);
    }

    /// The mapping of a frame and the frame's `rel_pc` (ELF virtual address
    /// of `lookup_pc`), or `None` when `pc` is in no known *executable*
    /// mapping. One binary search over the mappings; no allocation.
    ///
    /// A pc in a mapping we know as not executable means our copy of the
    /// maps is stale: read while the dynamic loader was mapping a library
    /// (it maps the whole file read-only first, then its segments over it),
    /// so the library's code showed as a read-only file mapping without
    /// unwind tables. Treated as unmapped, it gets the re-read of the maps
    /// an unmapped pc gets, and a stack cut there is not cached (a churning
    /// `dlopen`/`dlclose` program had every sample of one library instance
    /// cut at its leaf, `ERROR UNWIND_INFO`, about one run in fifteen).
    #[inline]
    pub fn resolve_pc(&self, pc: u64, lookup_pc: u64) -> Option<(&Arc<Mapping>, u64)> {
        let m = self.code_mapping_for(pc)?;
        Some((m, m.rel_pc(lookup_pc)))
    }

    /// The executable mapping containing `pc` (see [`ProcessContext::resolve_pc`]).
    #[inline]
    fn code_mapping_for(&self, pc: u64) -> Option<&Arc<Mapping>> {
        self.mapping_for(pc).filter(|m| m.exec)
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
        let found = changed && self.code_mapping_for(pc).is_some();
        self.reparse_result(found);
        changed
    }

    /// The process unloaded an object (its client said so): re-reads the
    /// maps now, whatever the rate limit, and lifts it. Returns whether the
    /// mappings changed (then every cached meaning of a pc may be stale:
    /// another object may be loaded where the unloaded one was).
    pub fn objects_unloaded(&mut self) -> bool {
        self.last_fruitless_reparse = None;
        self.reparse()
    }

    /// Whether the rate limit allows a re-read of the maps now: no re-read
    /// failed to find its address within the last
    /// [`ProcessOptions::reparse_interval`].
    fn may_reparse(&self) -> bool {
        self.last_fruitless_reparse
            .is_none_or(|t| t.elapsed() >= self.options.reparse_interval)
    }

    /// Re-reads the maps; returns whether the set of mappings changed.
    fn reparse(&mut self) -> bool {
        self.stats.map_reparses += 1;
        self.read_maps()
    }

    /// After [`ProcessContext::reparse`]: whether the re-read found the
    /// address it was done for; if not, the rate limit starts.
    fn reparse_result(&mut self, found: bool) {
        if !found {
            self.last_fruitless_reparse = Some(Instant::now());
        }
    }

    /// Reads and applies the maps; returns whether anything changed.
    fn read_maps(&mut self) -> bool {
        let Ok(text) = self.maps_source.read_maps() else {
            return false;
        };
        self.apply_maps(&text, &mut EarlyModules::default())
    }

    /// Applies maps text read now or earlier (`early`: what was opened
    /// for its mappings when it was read); returns whether anything changed.
    fn apply_maps(&mut self, text: &str, early: &mut EarlyModules) -> bool {
        let parsed = maps::parse_maps(text);
        self.stats.bad_map_lines += parsed.bad_lines as u64;
        let entries = parsed.entries;
        if entries.is_empty() && !self.mappings.is_empty() {
            // A live process always has mappings: it has exited (its maps
            // read as empty). Keep what we knew for its last samples.
            return false;
        }
        let unchanged = entries.len() == self.mappings.len()
            && entries
                .iter()
                .zip(&self.mappings)
                .all(|(e, m)| m.same_as(e));
        if unchanged {
            return false;
        }
        let old = std::mem::take(&mut self.mappings);
        let mut new = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let reused = maps::find_entry(&old, e.start, |m| (m.start, m.end))
                .map(|j| &old[j])
                .filter(|m| m.same_as(e));
            let m = match reused {
                Some(m) => Arc::clone(m),
                None => Arc::new(self.make_mapping(&entries, i, early)),
            };
            new.push(m);
        }
        self.mappings = new;
        self.walker.set_mappings(&self.mappings);
        // The modules of mappings that went (an unloaded library) may be
        // unused now.
        drop(old);
        self.cache.trim();
        true
    }

    fn make_mapping(&self, entries: &[MapEntry], i: usize, early: &mut EarlyModules) -> Mapping {
        let e = &entries[i];
        let module = if !e.exec {
            None
        } else if let Some(opened) = early.take(e) {
            opened.load(&self.cache, e)
        } else if e.is_vdso() {
            self.cache.module_for_vdso(&*self.memory, e)
        } else if e.is_file() {
            let pid = self.options.use_map_files.then_some(self.pid);
            self.cache.module_for_mapping(pid, e)
        } else {
            None
        };
        // The first mapping of the same file decides start_offset.
        let start_offset = entries[..i]
            .iter()
            .find(|p| e.inode != 0 && p.inode == e.inode && p.path == e.path)
            .map_or(e.offset, |p| p.offset);
        let naive_bias = e.start.wrapping_sub(e.offset);
        let (avma_bias, load_bias, build_id) = match &module {
            Some(m) => (
                elf::compute_bias(&m.elf.segments, e.start, e.end, e.offset, e.exec)
                    .unwrap_or(naive_bias),
                m.elf.load_bias,
                m.elf.build_id.clone(),
            ),
            None => (naive_bias, 0, None),
        };
        Mapping {
            start: e.start,
            end: e.end,
            offset: e.offset,
            start_offset,
            exec: e.exec,
            path: e.path.clone(),
            load_bias,
            build_id,
            module,
            avma_bias,
            dev_inode: (e.dev_major, e.dev_minor, e.inode),
        }
    }

    /// Names a frame: its module's symbols, the JIT perf map for code with
    /// no file, or `ERROR <KIND>` for the synthetic error frame. Inline
    /// frames innermost first; never empty unless symbolization is off.
    pub fn symbolize_frame(&self, frame: &Frame) -> Arc<[SymbolFrame]> {
        if let Some(kind) = frame.error {
            return Arc::from(vec![SymbolFrame {
                function: Some(format!("ERROR {}", kind.as_str())),
                file: None,
                line: None,
            }]);
        }
        if let Some(module) = frame.mapping.as_ref().and_then(|m| m.module.as_ref()) {
            return module.symbolize(frame.rel_pc);
        }
        if !self.cache.symbolize_options().enabled {
            return Arc::from(Vec::new());
        }
        let function = self.jit_name(frame.lookup_pc);
        Arc::from(vec![SymbolFrame {
            function,
            file: None,
            line: None,
        }])
    }

    fn jit_name(&self, pc: u64) -> Option<String> {
        let path = self
            .options
            .perf_map_path
            .clone()
            .unwrap_or_else(|| perfmap::perf_map_path(self.pid));
        let mut guard = lock(&self.perf_map);
        let stale = match &*guard {
            None => true,
            Some((map, loaded)) => {
                map.lookup(pc).is_none() && loaded.elapsed() >= self.options.reparse_interval
            }
        };
        if stale {
            let map = PerfMap::load(&path, self.options.perf_map_owner).unwrap_or_default();
            *guard = Some((map, Instant::now()));
        }
        guard
            .as_ref()
            .and_then(|(m, _)| m.lookup(pc))
            .map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Maps text that changes from one read to the next (the last stays).
    struct ChangingMaps(Vec<String>);

    impl MapsSource for ChangingMaps {
        fn read_maps(&mut self) -> std::io::Result<String> {
            Ok(if self.0.len() > 1 {
                self.0.remove(0)
            } else {
                self.0[0].clone()
            })
        }
    }

    /// A pc in a library's range that the maps, read while the loader was
    /// mapping it, showed read-only: unmapped for unwinding until the maps
    /// are read again, then resolved.
    #[test]
    fn a_pc_in_a_mapping_read_as_not_executable_waits_for_a_re_read() {
        let lib = "/usr/bin/true";
        let line =
            |perms: &str| format!("7f0000000000-7f0000004000 {perms} 00000000 08:01 4242 {lib}\n");
        let maps = ChangingMaps(vec![line("r--p"), line("r-xp")]);
        let mut ctx = ProcessContext::new(
            1,
            Box::new(maps),
            Box::new(crate::memory::SnapshotMemory::new()),
            Arc::new(ModuleCache::default()),
        );
        let pc = 0x7f00_0000_1000;
        assert!(ctx.mapping_for(pc).is_some_and(|m| !m.exec));
        assert!(ctx.resolve_pc(pc, pc).is_none());
        assert!(ctx.refresh_maps_for(pc), "the re-read changed the maps");
        let (m, _) = ctx.resolve_pc(pc, pc).expect("executable now");
        assert!(m.exec);
        assert_eq!(m.path, lib);
    }

    #[test]
    fn context_is_send() {
        fn check<T: Send>() {}
        check::<ProcessContext>();
        fn check_sync<T: Send + Sync>() {}
        check_sync::<Mapping>();
    }
}
