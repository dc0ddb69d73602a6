//! A process whose maps were read and whose files were opened, with its
//! modules not loaded yet: the two halves of making a [`ProcessContext`].
//!
//! [`PendingProcess::read`] is what must happen while the process is sure
//! to exist (the daemon does it while the client waits for its reply): the
//! maps text is read, the file of every executable mapping is opened
//! (through `/proc/PID/map_files`, which is gone with the process) and the
//! vDSO is copied out of its memory. All of it is cheap: a read of the maps,
//! an `open` per file. [`PendingProcess::finish`] then loads the modules
//! (reading and parsing whole ELF files: milliseconds per library) from the
//! open files, which stay readable after the process exits, so it can run
//! after the client has been answered and has gone on with its program.
//!
//! [`ProcessContext::with_options`] is `read` then `finish`.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use crate::cache::{Module, ModuleCache, open_mapped_file};
use crate::maps::{self, MapEntry};
use crate::memory::{MapsSource, ProcessMemory};
use crate::process::{ProcessContext, ProcessOptions};

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
    /// What was opened for `entry`, taken out (each is used once).
    pub(crate) fn take(&mut self, entry: &MapEntry) -> Option<Opened> {
        self.by_mapping.remove(&(entry.start, entry.inode))
    }
}

/// A process between reading its maps and loading its modules (see the
/// module docs).
pub struct PendingProcess {
    pid: u32,
    maps: Box<dyn MapsSource>,
    memory: Box<dyn ProcessMemory>,
    cache: Arc<ModuleCache>,
    options: ProcessOptions,
    /// The maps text and what was opened for it; `None` if the maps could
    /// not be read (`finish` then reads them itself).
    first: Option<(String, EarlyModules)>,
}

impl std::fmt::Debug for PendingProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingProcess")
            .field("pid", &self.pid)
            .field(
                "opened",
                &self.first.as_ref().map(|(_, e)| e.by_mapping.len()),
            )
            .finish_non_exhaustive()
    }
}

impl PendingProcess {
    /// Reads the maps of process `pid` and opens what its executable
    /// mappings need (files already in `cache` are opened too: which
    /// module a file is can only be told from the open file).
    pub fn read(
        pid: u32,
        mut maps: Box<dyn MapsSource>,
        memory: Box<dyn ProcessMemory>,
        cache: Arc<ModuleCache>,
        options: ProcessOptions,
    ) -> Self {
        let first = maps.read_maps().ok().map(|text| {
            let mut early = EarlyModules::default();
            let via = options.use_map_files.then_some(pid);
            for e in maps::parse_maps(&text).entries.iter().filter(|e| e.exec) {
                let opened = if e.is_vdso() {
                    Opened::Vdso(cache.module_for_vdso(&*memory, e))
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
            (text, early)
        });
        PendingProcess {
            pid,
            maps,
            memory,
            cache,
            options,
            first,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Loads the modules from the files opened by [`PendingProcess::read`]
    /// and makes the context, whose mappings are those of that read (a
    /// mapping made since is found by the context's usual re-read).
    pub fn finish(self) -> ProcessContext {
        ProcessContext::from_pending(
            self.pid,
            self.maps,
            self.memory,
            self.cache,
            self.options,
            self.first,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;
    use crate::memory::ProcessMemory;

    /// Maps text given once; every later read fails (the process is gone).
    struct Once(Option<String>);

    impl MapsSource for Once {
        fn read_maps(&mut self) -> io::Result<String> {
            self.0.take().ok_or_else(|| io::Error::other("gone"))
        }
    }

    struct NoMemory;

    impl ProcessMemory for NoMemory {
        fn read_exact_at(&self, _addr: u64, _buf: &mut [u8]) -> io::Result<()> {
            Err(io::Error::other("gone"))
        }
    }

    /// The file of an executable mapping, opened when the maps were read,
    /// is what the module is loaded from after it was removed from its path:
    /// a process that exits before `finish` still gets its modules.
    #[test]
    fn modules_load_from_files_opened_before_they_went() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let exe = std::env::current_exe().expect("current exe");
        let copy = dir.path().join("copy-of-test-binary");
        std::fs::copy(&exe, &copy).expect("copy");
        let ino = std::fs::metadata(&copy).expect("metadata").ino();
        let text = format!("10000-20000 r-xp 00000000 08:01 {ino} {}\n", copy.display());
        let cache = Arc::new(ModuleCache::new(Default::default()));
        let options = ProcessOptions {
            use_map_files: false,
            ..ProcessOptions::default()
        };
        let pending = PendingProcess::read(
            1,
            Box::new(Once(Some(text))),
            Box::new(NoMemory),
            Arc::clone(&cache),
            options,
        );
        std::fs::remove_file(&copy).expect("remove");
        let ctx = pending.finish();
        assert_eq!(ctx.mappings().len(), 1);
        let module = ctx.mappings()[0].module.as_ref().expect("module loaded");
        assert_eq!(module.path, copy);
    }

    /// Maps that cannot be read at first are read by `finish`.
    #[test]
    fn unreadable_maps_are_read_again_when_finished() {
        struct Second(u32);
        impl MapsSource for Second {
            fn read_maps(&mut self) -> io::Result<String> {
                self.0 += 1;
                if self.0 == 1 {
                    return Err(io::Error::other("not yet"));
                }
                Ok("10000-20000 rw-p 00000000 00:00 0 [heap]\n".to_string())
            }
        }
        let pending = PendingProcess::read(
            1,
            Box::new(Second(0)),
            Box::new(NoMemory),
            Arc::new(ModuleCache::new(Default::default())),
            ProcessOptions::default(),
        );
        assert_eq!(pending.finish().mappings().len(), 1);
    }
}
