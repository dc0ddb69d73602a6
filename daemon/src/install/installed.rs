//! Whether the client is installed system-wide, for `record -- CMD`: when
//! the install is there `record` preloads the installed library itself,
//! which the dynamic linker then loads once, rather than a second copy
//! beside it (a second copy stays inert, `client/src/originals.rs`, so the
//! installed one would do the work anyway, with a different build's tag
//! perhaps).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use super::build_tag::{self, Tag};
use super::layout::{Layout, PRELOAD};
use super::preload;

/// The installed library if the real system's preload file names it; an
/// error if that library is of another build.
pub fn preloaded_library() -> Result<Option<PathBuf>> {
    let entry = Layout::library_entry();
    let Ok(content) = std::fs::read(PRELOAD) else {
        return Ok(None);
    };
    if !preload::names(&content, entry.as_bytes()) || !Path::new(&entry).is_file() {
        return Ok(None);
    }
    match build_tag::read(Path::new(&entry))? {
        Tag::Same => Ok(Some(PathBuf::from(entry))),
        tag => bail!(
            "the client installed system-wide ({entry}, in {PRELOAD}) has {tag}: every \
             program loads it, and a second copy cannot be added; reinstall with \
             `heapprofd-rs install --force`"
        ),
    }
}
