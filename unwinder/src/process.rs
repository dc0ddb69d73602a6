//! Per-process state: the mappings of one profiled process, the framehop
//! unwinder built from them, and counters.
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

use framehop::Unwinder;
use framehop::aarch64::{CacheAarch64, UnwinderAarch64};
use framehop::x86_64::{CacheX86_64, UnwinderX86_64};

use crate::cache::{Module, ModuleCache};
use crate::elf::{self, SectionBytes};
use crate::maps::{self, MapEntry};
use crate::memory::{MapsSource, ProcessMemory};
use crate::perfmap::{self, PerfMap};
use crate::symbols::{SymbolFrame, lock};
use crate::unwind::{Frame, RawUnwind, UnwindErrorKind};

/// One mapping of the process, with what a Perfetto `Mapping` needs.
#[derive(Debug, Clone)]
pub struct Mapping {
    /// First address (AVMA).
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset of `start` (Perfetto `exact_offset`).
    pub offset: u64,
    /// File offset of the first mapping of the same file (Perfetto
    /// `start_offset`; 0 except for libraries inside an archive such as an APK).
    pub start_offset: u64,
    /// Executable mapping.
    pub exec: bool,
    /// Path or pseudo-name from the maps line (empty for anonymous memory).
    pub path: String,
    /// `p_vaddr - p_offset` of the executable `PT_LOAD` (Perfetto `load_bias`).
    pub load_bias: u64,
    /// Build id bytes (raw, not hex), when the module has one.
    pub build_id: Option<Arc<[u8]>>,
    /// The parsed ELF, for executable file-backed mappings (and the vDSO).
    pub module: Option<Arc<Module>>,
    /// `avma - svma` for this mapping of the module.
    pub avma_bias: u64,
    /// Device and inode from the maps line.
    pub dev_inode: (u32, u32, u64),
}

impl Mapping {
    /// ELF virtual address of an address in this mapping (a frame's
    /// `rel_pc`); without a parsed ELF, the file offset of the address.
    #[inline]
    pub fn rel_pc(&self, avma: u64) -> u64 {
        avma.wrapping_sub(self.avma_bias)
    }

    /// Whether framehop has DWARF CFI for this mapping.
    pub fn has_unwind_info(&self) -> bool {
        self.module.as_ref().is_some_and(|m| m.elf.unwind.has_cfi())
    }

    fn same_as(&self, e: &MapEntry) -> bool {
        self.start == e.start
            && self.end == e.end
            && self.offset == e.offset
            && self.exec == e.exec
            && self.dev_inode == (e.dev_major, e.dev_minor, e.inode)
            && self.path == e.path
    }
}

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
    /// Open module files through `/proc/PID/map_files` first (default true).
    pub use_map_files: bool,
}

impl Default for ProcessOptions {
    fn default() -> Self {
        ProcessOptions {
            reparse_interval: Duration::from_millis(500),
            max_frames: 512,
            perf_map_path: None,
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

pub(crate) enum ArchUnwinder {
    X86_64(UnwinderX86_64<SectionBytes>),
    Aarch64(UnwinderAarch64<SectionBytes>),
}

/// Unwinding and symbolization state of one profiled process.
///
/// `Send`, not `Sync`: each process is unwound by one thread at a time (the
/// module cache behind it is shared).
pub struct ProcessContext {
    pub(crate) pid: u32,
    pub(crate) cache: Arc<ModuleCache>,
    maps_source: Box<dyn MapsSource>,
    pub(crate) memory: Box<dyn ProcessMemory>,
    pub(crate) options: ProcessOptions,
    pub(crate) mappings: Vec<Arc<Mapping>>,
    modules: Vec<framehop::Module<SectionBytes>>,
    pub(crate) unwinder: Option<ArchUnwinder>,
    pub(crate) cache_x86_64: Option<Box<CacheX86_64>>,
    pub(crate) cache_aarch64: Option<Box<CacheAarch64>>,
    /// When a re-read of the maps last failed to find the address it was
    /// for (the rate limit runs from there).
    last_fruitless_reparse: Option<Instant>,
    pub(crate) stats: ProcessStats,
    pub(crate) raw_scratch: RawUnwind,
    /// Highest end of an executable mapping (aarch64 pointer-auth mask).
    pub(crate) max_code: u64,
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
        let mut ctx = ProcessContext {
            pid,
            cache,
            maps_source: maps,
            memory,
            options,
            mappings: Vec::new(),
            modules: Vec::new(),
            unwinder: None,
            cache_x86_64: None,
            cache_aarch64: None,
            last_fruitless_reparse: None,
            stats: ProcessStats::default(),
            raw_scratch: RawUnwind::default(),
            max_code: 0,
            perf_map: Mutex::new(None),
        };
        ctx.read_maps();
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
        match (&self.cache_x86_64, &self.cache_aarch64) {
            (Some(c), _) => Some(c.stats()),
            (None, Some(c)) => Some(c.stats()),
            (None, None) => None,
        }
    }

    /// The module cache this process uses.
    pub fn module_cache(&self) -> &Arc<ModuleCache> {
        &self.cache
    }

    /// The mapping containing `addr`.
    pub fn mapping_for(&self, addr: u64) -> Option<&Arc<Mapping>> {
        let i = maps::find_entry(&self.mappings, addr, |m| (m.start, m.end))?;
        self.mappings.get(i)
    }

    /// Whether the rate limit allows a re-read of the maps now: no re-read
    /// failed to find its address within the last
    /// [`ProcessOptions::reparse_interval`].
    pub(crate) fn may_reparse(&self) -> bool {
        self.last_fruitless_reparse
            .is_none_or(|t| t.elapsed() >= self.options.reparse_interval)
    }

    /// Re-reads the maps; returns whether the set of mappings changed.
    pub(crate) fn reparse(&mut self) -> bool {
        self.stats.map_reparses += 1;
        self.read_maps()
    }

    /// After [`ProcessContext::reparse`]: whether the re-read found the
    /// address it was done for; if not, the rate limit starts.
    pub(crate) fn reparse_result(&mut self, found: bool) {
        if !found {
            self.last_fruitless_reparse = Some(Instant::now());
        }
    }

    /// Reads and applies the maps; returns whether anything changed.
    fn read_maps(&mut self) -> bool {
        let Ok(text) = self.maps_source.read_maps() else {
            return false;
        };
        let parsed = maps::parse_maps(&text);
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
                None => Arc::new(self.make_mapping(&entries, i)),
            };
            new.push(m);
        }
        self.mappings = new;
        self.max_code = self
            .mappings
            .iter()
            .filter(|m| m.exec)
            .map(|m| m.end)
            .max()
            .unwrap_or(0);
        self.modules = self
            .mappings
            .iter()
            .filter_map(|m| framehop_module(m))
            .collect();
        self.unwinder = None;
        true
    }

    fn make_mapping(&self, entries: &[MapEntry], i: usize) -> Mapping {
        let e = &entries[i];
        let module = if !e.exec {
            None
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

    /// The framehop unwinder for `arch`, built on first use.
    pub(crate) fn ensure_unwinder(&mut self, arch: heapprofd_proto::wire::Arch) {
        use heapprofd_proto::wire::Arch;
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
            let map = PerfMap::load(&path).unwrap_or_default();
            *guard = Some((map, Instant::now()));
        }
        guard
            .as_ref()
            .and_then(|(m, _)| m.lookup(pc))
            .map(str::to_owned)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_is_send() {
        fn check<T: Send>() {}
        check::<ProcessContext>();
        fn check_sync<T: Send + Sync>() {}
        check_sync::<Mapping>();
    }
}
