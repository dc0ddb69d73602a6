//! The module cache shared by every process the daemon profiles.
//!
//! A [`Module`] is one ELF file's unwind data (and, lazily, its symbols).
//! Modules are keyed by build id, so the same library mapped by many
//! processes is parsed once; files without a build id are keyed by
//! device + inode + size + mtime (from `fstat` of the opened file). Files are
//! opened through `/proc/PID/map_files/<start>-<end>` while the process lives
//! (this works for deleted files and across mount namespaces), falling back
//! to the path in the maps line. The vDSO has no file: its image is read from
//! the process's memory.
//!
//! A module holds its file's bytes (read into memory, see
//! [`crate::elf::FileBytes::map`]) and, once symbolized, its symbol tables
//! and DWARF. Modules that no process maps any more are evicted beyond a
//! [`CacheBudget`] (the rule: [`crate::eviction`]); a module still mapped,
//! or held by a frame waiting to be symbolized (the daemon lets go of
//! it once the frame's name is known), never is. An evicted
//! module that is mapped again is read and parsed again. Each new module
//! checks the budget; [`ModuleCache::trim`] checks it on demand (after a
//! process ends).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::elf::{self, ElfInfo, FileBytes};
use crate::eviction::{self, CacheBudget, Candidate};
use crate::file_key::FileKey;
use crate::maps::MapEntry;
use crate::memory::ProcessMemory;
use crate::sparse::ModuleBytes;
use crate::symbol_frame::SymbolFrame;
use crate::symbol_store::StoreKey;
use crate::symbols::{ModuleSymbolizer, SymbolSources, SymbolizeOptions, lock};

/// Largest vDSO image we read from a process.
const MAX_VDSO_BYTES: u64 = 1 << 20;

/// One ELF image: unwind data now, symbols on demand. Shared across processes.
#[derive(Debug)]
pub struct Module {
    /// Path the module was first loaded from (the maps path, not map_files).
    pub path: PathBuf,
    /// Parsed unwind information.
    pub elf: ElfInfo,
    bytes: ModuleBytes,
    symbolizer: ModuleSymbolizer,
    options: Arc<SymbolizeOptions>,
}

impl Module {
    /// The build id, if the file has one.
    pub fn build_id(&self) -> Option<&[u8]> {
        self.elf.build_id.as_deref()
    }

    /// Symbolizes an ELF virtual address (a frame's `rel_pc`): inline frames,
    /// innermost first, never empty (an unknown function is `function: None`).
    /// Returns an empty slice when symbolization is turned off.
    pub fn symbolize(&self, rel_pc: u64) -> Arc<[SymbolFrame]> {
        if !self.options.enabled {
            return Arc::from(Vec::new());
        }
        self.symbolizer
            .symbolize(&self.path, &self.bytes, rel_pc, &self.options)
    }

    /// Symbolizes `rel_pc` into the cache ahead of need, for a background
    /// thread, and returns the answer: the module's symbol state is checked
    /// out meanwhile, and a [`Self::symbolize`] caller that needs it waits
    /// for it rather than loading a second one (so run this at a priority
    /// that keeps running). `None` when symbolization is off or the state
    /// is out already (someone else is symbolizing this module).
    pub fn warm_symbols(&self, rel_pc: u64) -> Option<Arc<[SymbolFrame]>> {
        if !self.options.enabled {
            return None;
        }
        self.symbolizer
            .warm(&self.path, &self.bytes, rel_pc, &self.options)
    }

    /// Which debug files were used (loads symbols if needed).
    pub fn symbol_sources(&self) -> SymbolSources {
        self.symbolizer
            .sources(&self.path, &self.bytes, &self.options)
    }

    /// Whether its symbol tables and DWARF were loaded (tests).
    #[cfg(test)]
    pub(crate) fn symbols_loaded(&self) -> bool {
        self.symbolizer.state_loaded()
    }

    /// Number of addresses whose symbols are cached.
    pub fn cached_symbol_addresses(&self) -> usize {
        self.symbolizer.cached_addresses()
    }
}

/// Counters of the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Files parsed (cache misses).
    pub modules_loaded: u64,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Files that could not be opened or parsed.
    pub failures: u64,
    /// Modules evicted (see [`CacheBudget`]).
    pub evicted: u64,
}

/// One cached module and what eviction needs to know of it.
struct Entry {
    module: Arc<Module>,
    /// Keys of `Inner::by_file` that lead here.
    file_keys: Vec<FileKey>,
    /// `Inner::clock` at its last lookup.
    last_used: u64,
    /// Bytes of its file.
    bytes: u64,
}

impl Entry {
    /// Whether anything besides the cache holds the module. Exact under the
    /// cache's lock: a new holder can only clone from an existing one, or
    /// get it from the cache.
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.module) > 1
    }
}

#[derive(Default)]
struct Inner {
    /// Every cached module by its serial number: the one `Arc` the cache
    /// holds of each.
    modules: HashMap<u64, Entry>,
    by_build_id: HashMap<Arc<[u8]>, u64>,
    by_file: HashMap<FileKey, u64>,
    next_serial: u64,
    /// Lookups so far (the LRU's clock).
    clock: u64,
    stats: CacheStats,
}

impl Inner {
    /// The module of serial `serial`, marked as just used.
    fn touch(&mut self, serial: u64) -> Option<Arc<Module>> {
        self.clock += 1;
        let e = self.modules.get_mut(&serial)?;
        e.last_used = self.clock;
        self.stats.hits += 1;
        Some(Arc::clone(&e.module))
    }

    /// Evicts what the budget does not let the cache keep; the modules
    /// evicted.
    #[must_use]
    fn trim(&mut self, budget: CacheBudget) -> Vec<Arc<Module>> {
        let mut evicted = Vec::new();
        let all = self
            .modules
            .iter()
            .map(|(&key, e)| Candidate {
                key,
                last_used: e.last_used,
                bytes: e.bytes,
                in_use: e.in_use(),
            })
            .collect();
        for serial in eviction::victims(all, budget) {
            let Some(e) = self.modules.remove(&serial) else {
                continue;
            };
            // An index may lead to a newer copy (two threads that parsed
            // the same file at once): only the ones leading here go.
            if let Some(id) = e.module.build_id()
                && self.by_build_id.get(id) == Some(&serial)
            {
                self.by_build_id.remove(id);
            }
            for k in &e.file_keys {
                if self.by_file.get(k) == Some(&serial) {
                    self.by_file.remove(k);
                }
            }
            self.stats.evicted += 1;
            evicted.push(e.module);
        }
        evicted
    }
}

/// Thread-safe cache of [`Module`]s; share it with `Arc` between processes
/// and threads.
pub struct ModuleCache {
    inner: Mutex<Inner>,
    options: Arc<SymbolizeOptions>,
    budget: CacheBudget,
}

impl std::fmt::Debug for ModuleCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleCache")
            .field("stats", &self.stats())
            .field("options", &self.options)
            .field("budget", &self.budget)
            .finish()
    }
}

impl Default for ModuleCache {
    fn default() -> Self {
        Self::new(SymbolizeOptions::default())
    }
}

impl ModuleCache {
    /// An empty cache with the default [`CacheBudget`].
    pub fn new(options: SymbolizeOptions) -> Self {
        Self::with_budget(options, CacheBudget::default())
    }

    /// An empty cache that keeps unused modules within `budget`.
    pub fn with_budget(options: SymbolizeOptions, budget: CacheBudget) -> Self {
        ModuleCache {
            inner: Mutex::new(Inner::default()),
            options: Arc::new(options),
            budget,
        }
    }

    /// Writes every module's answers found since its file in the symbol
    /// store was read (see [`crate::SymbolStore`]): the number of files
    /// written, and the first error. Nothing without a store.
    pub fn persist_symbols(&self) -> (usize, Option<std::io::Error>) {
        let modules: Vec<Arc<Module>> = lock(&self.inner)
            .modules
            .values()
            .map(|e| Arc::clone(&e.module))
            .collect();
        let (mut written, mut first_error) = (0, None);
        for m in modules {
            match m.symbolizer.persist(&self.options) {
                Ok(true) => written += 1,
                Ok(false) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        (written, first_error)
    }

    /// Evicts the unused modules the budget does not let the cache keep
    /// (see [`CacheBudget`]); a module in use is never evicted.
    pub fn trim(&self) {
        let evicted = lock(&self.inner).trim(self.budget);
        self.persist_evicted(evicted);
    }

    /// The new answers of modules the cache let go of go to the symbol
    /// store now (they were written only when `record` finished, by which
    /// time an evicted module had taken them with it). Best effort, with
    /// the cache's lock released: a failure only loses them, as before.
    fn persist_evicted(&self, evicted: Vec<Arc<Module>>) {
        for m in evicted {
            let _ = m.symbolizer.persist(&self.options);
        }
    }

    /// Bytes of the files of the modules held (in use or not).
    pub fn resident_bytes(&self) -> u64 {
        lock(&self.inner).modules.values().map(|e| e.bytes).sum()
    }

    /// The symbolization settings.
    pub fn symbolize_options(&self) -> &SymbolizeOptions {
        &self.options
    }

    /// Cache counters.
    pub fn stats(&self) -> CacheStats {
        lock(&self.inner).stats
    }

    /// Number of distinct modules held.
    pub fn len(&self) -> usize {
        lock(&self.inner).modules.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The module of a file-backed mapping of process `pid` (`None`: the
    /// process may be gone, the path is then used).
    pub fn module_for_mapping(&self, pid: Option<u32>, entry: &MapEntry) -> Option<Arc<Module>> {
        let Some(file) = open_mapped_file(pid, entry) else {
            lock(&self.inner).stats.failures += 1;
            return None;
        };
        self.module_for_file(&file, Path::new(&entry.path))
    }

    /// The module of an open file (`path` is what symbolization reports and
    /// where `.gnu_debuglink` targets are looked for).
    pub fn module_for_file(&self, file: &File, path: &Path) -> Option<Arc<Module>> {
        self.module_for_file_mapped(file, path, None)
    }

    /// The module of an open file found at `path` for a mapping of
    /// `mapped_path` elsewhere (offline symbolization: the binary of a
    /// device's `/system/lib64/libc.so` found in a symbol directory); a
    /// `.gnu_debuglink` target is looked for under the debug directories
    /// at both places. A module of the same build id already cached is
    /// returned as it is.
    pub fn module_for_file_mapped_at(
        &self,
        file: &File,
        path: &Path,
        mapped_path: &Path,
    ) -> Option<Arc<Module>> {
        self.module_for_file_mapped(file, path, Some(mapped_path))
    }

    fn module_for_file_mapped(
        &self,
        file: &File,
        path: &Path,
        mapped_path: Option<&Path>,
    ) -> Option<Arc<Module>> {
        let meta = file.metadata().ok()?;
        let key = FileKey::of(&meta);
        {
            let mut inner = lock(&self.inner);
            if let Some(serial) = inner.by_file.get(&key).copied()
                && let Some(m) = inner.touch(serial)
            {
                return Some(m);
            }
        }
        if !meta.is_file() {
            lock(&self.inner).stats.failures += 1;
            return None;
        }
        let loaded = ModuleBytes::read(file)
            .ok()
            .and_then(|bytes| Some((elf::parse_elf(bytes.unwind()).ok()?, bytes)));
        let Some((info, bytes)) = loaded else {
            lock(&self.inner).stats.failures += 1;
            return None;
        };
        Some(self.insert(Some(key), info, bytes, path, mapped_path))
    }

    /// The vDSO module of a process, read from its memory.
    pub fn module_for_vdso(
        &self,
        memory: &dyn ProcessMemory,
        entry: &MapEntry,
    ) -> Option<Arc<Module>> {
        let len = entry.end.checked_sub(entry.start)?;
        if len == 0 || len > MAX_VDSO_BYTES {
            return None;
        }
        let mut buf = vec![0u8; usize::try_from(len).ok()?];
        if memory.read_exact_at(entry.start, &mut buf).is_err() {
            lock(&self.inner).stats.failures += 1;
            return None;
        }
        let bytes = ModuleBytes::complete(Arc::new(FileBytes::Owned(buf)));
        let Ok(info) = elf::parse_elf(bytes.unwind()) else {
            lock(&self.inner).stats.failures += 1;
            return None;
        };
        Some(self.insert(None, info, bytes, Path::new("[vdso]"), None))
    }

    fn insert(
        &self,
        key: Option<FileKey>,
        info: ElfInfo,
        bytes: ModuleBytes,
        path: &Path,
        mapped_path: Option<&Path>,
    ) -> Arc<Module> {
        let mut inner = lock(&self.inner);
        if let Some(id) = &info.build_id
            && let Some(serial) = inner.by_build_id.get(id).copied()
            && let Some(m) = inner.touch(serial)
        {
            if let Some(key) = key
                && let Some(e) = inner.modules.get_mut(&serial)
            {
                e.file_keys.push(key);
                inner.by_file.insert(key, serial);
            }
            return m;
        }
        let size = bytes.len() as u64;
        // Only a file with a build id and an identity of its own has
        // answers in the store.
        let store_key = match (&self.options.store, &info.build_id, key) {
            (Some(_), Some(id), Some(module)) => Some(StoreKey {
                build_id: Arc::clone(id),
                module,
                path: path.to_path_buf(),
            }),
            _ => None,
        };
        let module = Arc::new(Module {
            path: path.to_path_buf(),
            elf: info,
            bytes,
            symbolizer: ModuleSymbolizer::new(mapped_path.map(Path::to_path_buf), store_key),
            options: Arc::clone(&self.options),
        });
        inner.stats.modules_loaded += 1;
        if module.build_id().is_none() && key.is_none() {
            // Nothing could ever find it again (a vDSO without a build id).
            return module;
        }
        let serial = inner.next_serial;
        inner.next_serial += 1;
        if let Some(id) = &module.elf.build_id {
            inner.by_build_id.insert(Arc::clone(id), serial);
        }
        if let Some(key) = key {
            inner.by_file.insert(key, serial);
        }
        inner.clock += 1;
        let last_used = inner.clock;
        inner.modules.insert(
            serial,
            Entry {
                module: Arc::clone(&module),
                file_keys: key.into_iter().collect(),
                last_used,
                bytes: size,
            },
        );
        let evicted = inner.trim(self.budget);
        drop(inner);
        self.persist_evicted(evicted);
        module
    }
}

/// Opens the file of a file-backed mapping of process `pid`: through
/// `/proc/PID/map_files` first (the file the process mapped, even if its
/// path was replaced or is in another mount namespace), else by its path
/// (`pid` `None`: the process may be gone). The inode check guards against
/// a reused pid whose new process has a mapping at the same range.
pub(crate) fn open_mapped_file(pid: Option<u32>, entry: &MapEntry) -> Option<File> {
    let from_map_files = pid
        .and_then(|pid| {
            let link = format!("/proc/{pid}/map_files/{}", entry.map_files_name());
            elf::open_nonblocking(Path::new(&link)).ok()
        })
        .filter(|f| f.metadata().is_ok_and(|m| m.ino() == entry.inode));
    from_map_files.or_else(|| elf::open_nonblocking(Path::new(&entry.path)).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_file_parsed_once() {
        let cache = ModuleCache::default();
        let f = File::open("/proc/self/exe").unwrap();
        let a = cache
            .module_for_file(&f, Path::new("/proc/self/exe"))
            .unwrap();
        let b = cache
            .module_for_file(&f, Path::new("/proc/self/exe"))
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(cache.stats().modules_loaded, 1);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn truncated_and_non_elf_files_fail_cleanly() {
        let dir = std::env::temp_dir().join(format!("hp-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = std::fs::read("/proc/self/exe").unwrap();
        for (name, bytes) in [
            ("trunc64", &exe[..64]),
            ("trunc4k", &exe[..4096]),
            ("empty", &exe[..0]),
            ("text", &b"hello"[..]),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            let cache = ModuleCache::default();
            let f = File::open(&p).unwrap();
            assert!(cache.module_for_file(&f, &p).is_none(), "{name}");
            assert_eq!(cache.stats().failures, 1);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn evicting_cache() -> ModuleCache {
        ModuleCache::with_budget(
            SymbolizeOptions::default(),
            CacheBudget {
                max_unused_modules: 0,
                max_unused_bytes: 0,
            },
        )
    }

    fn load(cache: &ModuleCache, path: &str) -> Arc<Module> {
        let f = File::open(path).unwrap();
        cache.module_for_file(&f, Path::new(path)).unwrap()
    }

    /// A function of this file, as a rel_pc of the test binary.
    fn own_rel_pc(m: &Module) -> u64 {
        let maps = crate::maps::parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let pc = own_rel_pc as *const () as usize as u64;
        let e = maps
            .entries
            .iter()
            .find(|e| e.exec && (e.start..e.end).contains(&pc))
            .unwrap();
        let bias = elf::compute_bias(&m.elf.segments, e.start, e.end, e.offset, e.exec).unwrap();
        pc - bias
    }

    #[test]
    fn a_module_in_use_is_never_evicted() {
        let cache = evicting_cache();
        let held = load(&cache, "/proc/self/exe");
        cache.trim();
        assert_eq!((cache.len(), cache.stats().evicted), (1, 0));
        // Still the same module: found again, not parsed again.
        let again = load(&cache, "/proc/self/exe");
        assert!(Arc::ptr_eq(&held, &again));
        assert_eq!(cache.stats().modules_loaded, 1);
        // Loading another module checks the budget: the held one stays.
        drop(again);
        drop(load(&cache, "/proc/self/exe"));
        assert_eq!(cache.len(), 1);
        assert!(cache.resident_bytes() > 0);
    }

    #[test]
    fn an_evicted_module_is_loaded_again_when_mapped_again() {
        let cache = evicting_cache();
        let m = load(&cache, "/proc/self/exe");
        let rel_pc = own_rel_pc(&m);
        let before = m.symbolize(rel_pc);
        assert!(
            before[0]
                .function
                .as_deref()
                .is_some_and(|f| f.contains("own_rel_pc")),
            "{before:?}"
        );
        drop(m);
        cache.trim();
        assert_eq!((cache.len(), cache.stats().evicted), (0, 1));
        assert_eq!(cache.resident_bytes(), 0);
        let m = load(&cache, "/proc/self/exe");
        assert_eq!(cache.stats().modules_loaded, 2, "read and parsed again");
        assert_eq!(m.cached_symbol_addresses(), 0, "a fresh symbol cache");
        assert_eq!(m.symbolize(rel_pc), before);
        assert_eq!(m.elf.build_id, load(&cache, "/proc/self/exe").elf.build_id);
    }

    #[test]
    fn unused_modules_are_kept_within_the_budget_least_recently_used_out() {
        let one_module = CacheBudget {
            max_unused_modules: 1,
            max_unused_bytes: u64::MAX,
        };
        let cache = ModuleCache::with_budget(SymbolizeOptions::default(), one_module);
        let exe = load(&cache, "/proc/self/exe");
        let exe_id = exe.build_id().map(<[u8]>::to_vec);
        drop(exe);
        // Unused, but within the budget: kept and found again.
        cache.trim();
        drop(load(&cache, "/proc/self/exe"));
        assert_eq!(cache.stats().modules_loaded, 1);
        // A second unused module: the least recently used one goes.
        let other = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5).map(str::to_owned))
            .find(|p| p.contains("libc.so"))
            .unwrap();
        drop(load(&cache, &other));
        cache.trim();
        assert_eq!((cache.len(), cache.stats().evicted), (1, 1));
        let kept = load(&cache, &other);
        assert_ne!(kept.build_id().map(<[u8]>::to_vec), exe_id);
        assert_eq!(cache.stats().modules_loaded, 2, "libc was kept");
    }

    #[test]
    fn cache_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<ModuleCache>();
        check::<Module>();
    }
}
