//! What was opened for the executable mappings of one read of a process's
//! maps, before their modules are loaded (see [`crate::pending`]): the
//! mapped files, open (they stay readable after the process exits, while
//! `/proc/PID/map_files` goes with it), and the vDSO's module, copied out
//! of the process's memory.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use crate::cache::{Module, ModuleCache, open_mapped_file};
use crate::maps::{self, MapEntry};
use crate::memory::ProcessMemory;

/// What was opened for an executable mapping when the maps were read.
#[derive(Debug)]
pub(crate) enum Opened {
    /// The mapped file (its module not loaded yet).
    File(File),
    /// The vDSO's module (made from the process's memory, which is gone
    /// with the process); `None` if it could not be read.
    Vdso(Option<Arc<Module>>),
}

impl Opened {
    /// The module of the mapping `entry` this was opened for.
    pub(crate) fn load(self, cache: &ModuleCache, entry: &MapEntry) -> Option<Arc<Module>> {
        match self {
            Opened::File(f) => cache.module_for_file(&f, Path::new(&entry.path)),
            Opened::Vdso(m) => m,
        }
    }
}

/// The files opened for the executable mappings of one read of the maps,
/// by the mapping's (start, inode).
#[derive(Debug, Default)]
pub(crate) struct EarlyModules {
    by_mapping: HashMap<(u64, u64), Opened>,
}

impl EarlyModules {
    /// Opens what the executable mappings of maps `text` need: the file of
    /// each file mapping (through `/proc/PID/map_files` when `via` names the
    /// process) and the vDSO's module, read from `memory`.
    pub(crate) fn open(
        text: &str,
        via: Option<u32>,
        memory: &dyn ProcessMemory,
        cache: &ModuleCache,
    ) -> Self {
        let mut early = EarlyModules::default();
        for e in maps::parse_maps(text).entries.iter().filter(|e| e.exec) {
            let opened = if e.is_vdso() {
                Opened::Vdso(cache.module_for_vdso(memory, e))
            } else if e.is_file() {
                match open_mapped_file(via, e) {
                    Some(f) => Opened::File(f),
                    None => continue,
                }
            } else {
                continue;
            };
            early.by_mapping.insert((e.start, e.inode), opened);
        }
        early
    }

    /// How many mappings have something opened.
    pub(crate) fn len(&self) -> usize {
        self.by_mapping.len()
    }

    /// What was opened for `entry`, taken out (each is used once).
    pub(crate) fn take(&mut self, entry: &MapEntry) -> Option<Opened> {
        self.by_mapping.remove(&(entry.start, entry.inode))
    }
}
