//! A process whose maps were read and whose files were opened, with its
//! modules not loaded yet: the two halves of making a [`ProcessContext`].
//!
//! [`PendingProcess::read`] is what must happen while the process is sure
//! to exist (the daemon does it while the client waits for its reply): the
//! maps text is read, the file of every executable mapping is opened
//! (through `/proc/PID/map_files`, which is gone with the process) and the
//! vDSO is copied out of its memory. All of it is cheap: a read of the maps,
//! an `open` per file. [`PendingProcess::finish`] then loads the modules
//! (reading and parsing ELF files, see [`crate::sparse`]: milliseconds per
//! library) from the open files, which stay readable after the process
//! exits, so it can run after the client has been answered and has gone on
//! with its program.
//!
//! What is opened is kept in [`crate::early::EarlyModules`].

use std::sync::Arc;

use crate::cache::ModuleCache;
use crate::early::EarlyModules;
use crate::memory::{MapsSource, ProcessMemory};
use crate::process::{ProcessContext, ProcessOptions};

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
            .field("opened", &self.first.as_ref().map(|(_, e)| e.len()))
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
            let via = options.use_map_files.then_some(pid);
            let early = EarlyModules::open(&text, via, &*memory, &cache);
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

    /// The process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Loads the modules from the files opened by [`PendingProcess::read`]
    /// and makes the context, whose mappings are those of that read (a
    /// mapping made since is found by the context's usual re-read).
    pub fn finish(self) -> ProcessContext {
        ProcessContext::with_first_maps(
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
    use crate::memory::NoMemory;

    /// Maps text given once; every later read fails (the process is gone).
    struct Once(Option<String>);

    impl MapsSource for Once {
        fn read_maps(&mut self) -> io::Result<String> {
            self.0.take().ok_or_else(|| io::Error::other("gone"))
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
