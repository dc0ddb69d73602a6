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
//! The cache never evicts; a daemon that profiles for a long time with many
//! different binaries keeps their bytes (read into memory, see
//! [`crate::elf::FileBytes::map`]) for its whole life.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::elf::{self, ElfInfo, FileBytes};
use crate::maps::MapEntry;
use crate::memory::ProcessMemory;
use crate::symbols::{ModuleSymbolizer, SymbolFrame, SymbolSources, SymbolizeOptions, lock};

/// Largest vDSO image we read from a process.
const MAX_VDSO_BYTES: u64 = 1 << 20;

/// Identity of a file without a build id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileKey {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// `st_size`.
    pub size: u64,
    /// `st_mtime` seconds.
    pub mtime: i64,
    /// `st_mtime` nanoseconds.
    pub mtime_nsec: i64,
}

/// One ELF image: unwind data now, symbols on demand. Shared across processes.
#[derive(Debug)]
pub struct Module {
    /// Path the module was first loaded from (the maps path, not map_files).
    pub path: PathBuf,
    /// Parsed unwind information.
    pub elf: ElfInfo,
    bytes: Arc<FileBytes>,
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

    /// Symbolizes `rel_pc` into the cache without ever making a
    /// [`Self::symbolize`] caller wait on this thread: for a background
    /// thread at low priority that warms the cache ahead of need.
    pub fn warm_symbols(&self, rel_pc: u64) {
        if self.options.enabled {
            self.symbolizer
                .warm(&self.path, &self.bytes, rel_pc, &self.options);
        }
    }

    /// Which debug files were used (loads symbols if needed).
    pub fn symbol_sources(&self) -> SymbolSources {
        self.symbolizer
            .sources(&self.path, &self.bytes, &self.options)
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
}

#[derive(Default)]
struct Inner {
    by_build_id: HashMap<Arc<[u8]>, Arc<Module>>,
    by_file: HashMap<FileKey, Arc<Module>>,
    stats: CacheStats,
}

/// Thread-safe cache of [`Module`]s; share it with `Arc` between processes
/// and threads.
pub struct ModuleCache {
    inner: Mutex<Inner>,
    options: Arc<SymbolizeOptions>,
}

impl std::fmt::Debug for ModuleCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleCache")
            .field("stats", &self.stats())
            .field("options", &self.options)
            .finish()
    }
}

impl Default for ModuleCache {
    fn default() -> Self {
        Self::new(SymbolizeOptions::default())
    }
}

impl ModuleCache {
    /// An empty cache.
    pub fn new(options: SymbolizeOptions) -> Self {
        ModuleCache {
            inner: Mutex::new(Inner::default()),
            options: Arc::new(options),
        }
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
        let inner = lock(&self.inner);
        let mut n = inner.by_build_id.len();
        n += inner
            .by_file
            .values()
            .filter(|m| m.build_id().is_none())
            .count();
        n
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The module of a file-backed mapping of process `pid` (`None`: the
    /// process may be gone, the path is then used).
    pub fn module_for_mapping(&self, pid: Option<u32>, entry: &MapEntry) -> Option<Arc<Module>> {
        // The inode check guards against a reused pid whose new process
        // happens to have a mapping at the same range.
        let from_map_files = pid
            .and_then(|pid| {
                let link = format!("/proc/{pid}/map_files/{}", entry.map_files_name());
                elf::open_nonblocking(Path::new(&link)).ok()
            })
            .filter(|f| f.metadata().is_ok_and(|m| m.ino() == entry.inode));
        let file = match from_map_files {
            Some(f) => f,
            None => match elf::open_nonblocking(Path::new(&entry.path)) {
                Ok(f) => f,
                Err(_) => {
                    lock(&self.inner).stats.failures += 1;
                    return None;
                }
            },
        };
        self.module_for_file(&file, Path::new(&entry.path))
    }

    /// The module of an open file (`path` is what symbolization reports and
    /// where `.gnu_debuglink` targets are looked for).
    pub fn module_for_file(&self, file: &File, path: &Path) -> Option<Arc<Module>> {
        let meta = file.metadata().ok()?;
        let key = FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        };
        {
            let mut inner = lock(&self.inner);
            if let Some(m) = inner.by_file.get(&key).cloned() {
                inner.stats.hits += 1;
                return Some(m);
            }
        }
        if !meta.is_file() {
            lock(&self.inner).stats.failures += 1;
            return None;
        }
        let loaded = FileBytes::map(file)
            .ok()
            .map(Arc::new)
            .and_then(|bytes| Some((elf::parse_elf(&bytes).ok()?, bytes)));
        let Some((info, bytes)) = loaded else {
            lock(&self.inner).stats.failures += 1;
            return None;
        };
        Some(self.insert(Some(key), info, bytes, path))
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
        let bytes = Arc::new(FileBytes::Owned(buf));
        let Ok(info) = elf::parse_elf(&bytes) else {
            lock(&self.inner).stats.failures += 1;
            return None;
        };
        Some(self.insert(None, info, bytes, Path::new("[vdso]")))
    }

    fn insert(
        &self,
        key: Option<FileKey>,
        info: ElfInfo,
        bytes: Arc<FileBytes>,
        path: &Path,
    ) -> Arc<Module> {
        let mut inner = lock(&self.inner);
        if let Some(id) = &info.build_id
            && let Some(m) = inner.by_build_id.get(id).cloned()
        {
            inner.stats.hits += 1;
            if let Some(key) = key {
                inner.by_file.insert(key, Arc::clone(&m));
            }
            return m;
        }
        let module = Arc::new(Module {
            path: path.to_path_buf(),
            elf: info,
            bytes,
            symbolizer: ModuleSymbolizer::new(),
            options: Arc::clone(&self.options),
        });
        inner.stats.modules_loaded += 1;
        if let Some(id) = &module.elf.build_id {
            inner
                .by_build_id
                .insert(Arc::clone(id), Arc::clone(&module));
        }
        if let Some(key) = key {
            inner.by_file.insert(key, Arc::clone(&module));
        }
        module
    }
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

    #[test]
    fn cache_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<ModuleCache>();
        check::<Module>();
    }
}
