//! The identity of a file on disk, and what was found at a path.
//!
//! A [`FileKey`] (device, inode, size, mtime) tells one file from another
//! without reading it: the module cache keys files without a build id by
//! it, and the symbol store checks by it that what an answer was made from
//! is still there ([`Observation`]).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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

impl FileKey {
    /// No file (a placeholder in encodings).
    pub(crate) const NONE: FileKey = FileKey {
        dev: 0,
        ino: 0,
        size: 0,
        mtime: 0,
        mtime_nsec: 0,
    };

    /// The identity of the file `meta` describes.
    pub(crate) fn of(meta: &fs::Metadata) -> FileKey {
        FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

/// A path a module's lookup consulted, and what was there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Observation {
    pub(crate) path: PathBuf,
    /// The file found there, `None` if nothing (or not a regular file).
    pub(crate) file: Option<FileKey>,
}

impl Observation {
    /// What is at `path` now.
    pub(crate) fn now(path: &Path) -> Observation {
        let file = fs::metadata(path)
            .ok()
            .filter(fs::Metadata::is_file)
            .map(|m| FileKey::of(&m));
        Observation {
            path: path.to_path_buf(),
            file,
        }
    }
}
