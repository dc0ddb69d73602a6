//! The symbol store: symbolization answers kept on disk between runs.
//!
//! Symbolizing a module for the first time parses its symbol tables and
//! DWARF: libc with Debian's compressed debug file is 25-55 ms of inflating
//! and parsing, node's symbol table more, in every `record` of every short
//! program. The store keeps each module's answers (rel_pc -> inline chain)
//! in one file per module, so that a later run that asks for the same
//! addresses never loads the module's debug information at all.
//!
//! ```text
//! DIR/<build id>-<hash of path and debug dirs>.sym
//!   magic "HPSYMS01"
//!   module: dev ino size mtime mtime_nsec      the file symbolized (fstat)
//!   build id: u16 len, bytes
//!   observed: u32 n, n x (u16 len, path, u8 present, dev ino size mtime mtime_nsec)
//!   answers: u32 n, n x (u64 rel_pc, u16 frames,
//!            frames x (u8 has fn|file|line, [u32 len, fn], [u32 len, file], [u32 line]))
//!   crc32 of all the above
//! ```
//!
//! An answer depends on the module's bytes and on every debug file the
//! lookup found or looked for (by build id, `.gnu_debuglink`, the dwz
//! file). So a file is used only when the module is the same file (device,
//! inode, size, mtime) and every path the lookup consulted still is what it
//! was, or still absent: installing a debug package, or adding a debug link
//! next to a binary, makes the old answers go unused. Files are read with
//! limits and a checksum, and trusted no further than that: anything that
//! does not parse is ignored (and overwritten by the next save). Saves write
//! a temporary file and rename it; the directory is kept under a byte
//! budget by removing the oldest files, looked over at most every
//! [`TRIM_EVERY`] (a `.trimmed` file's mtime says when it last was): the
//! look lists and stats every file, and a store of 4,151 files (one test
//! suite's worth) cost each `record` 20-40 ms of CPU when it was made at
//! every save.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::byte_cursor::Cursor;
use crate::debuginfo::hex;
use crate::file_key::{FileKey, Observation};
use crate::stored_answers::{AnswerBytes, StoredAnswers, ToWrite};

const MAGIC: &[u8; 8] = b"HPSYMS01";
/// Largest store file read.
const MAX_FILE_BYTES: u64 = 64 << 20;
/// Most answers one file holds.
pub(crate) const MAX_ANSWERS: usize = 1 << 16;
/// Most paths one lookup consults that are kept.
const MAX_OBSERVED: usize = 256;

/// Least time between two looks at the directory's size (see the module
/// docs): what is saved meanwhile can go over the budget until the next.
pub const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// The file whose mtime is the last look at the directory's size.
const TRIMMED: &str = ".trimmed";

/// A directory of stored answers, shared by all modules of a cache.
#[derive(Debug)]
pub struct SymbolStore {
    dir: PathBuf,
    max_bytes: u64,
    trim_every: std::time::Duration,
}

/// Which module a store file is for.
#[derive(Debug, Clone)]
pub(crate) struct StoreKey {
    pub(crate) build_id: Arc<[u8]>,
    pub(crate) module: FileKey,
    pub(crate) path: PathBuf,
}

/// A module's file in the store, found current.
#[derive(Debug)]
pub(crate) struct Stored {
    /// The paths its answers were made with.
    pub(crate) observed: Vec<Observation>,
    pub(crate) answers: StoredAnswers,
}

impl SymbolStore {
    /// A store in `dir` (created when first saved to) holding at most
    /// `max_bytes` of files.
    pub fn new(dir: PathBuf, max_bytes: u64) -> SymbolStore {
        SymbolStore {
            dir,
            max_bytes,
            trim_every: TRIM_EVERY,
        }
    }

    /// The same, looking at the directory's size at most every
    /// `trim_every` (tests).
    #[cfg(test)]
    pub(crate) fn with_trim_every(
        dir: PathBuf,
        max_bytes: u64,
        trim_every: std::time::Duration,
    ) -> SymbolStore {
        SymbolStore {
            dir,
            max_bytes,
            trim_every,
        }
    }

    /// `$XDG_CACHE_HOME/heapprofd-rs/symbols`, else `~/.cache/...`.
    pub fn default_dir() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| {
                let home = PathBuf::from(std::env::var_os("HOME")?);
                home.is_absolute().then(|| home.join(".cache"))
            })?;
        Some(base.join("heapprofd-rs").join("symbols"))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file_for(&self, key: &StoreKey, debug_dirs: &[PathBuf]) -> PathBuf {
        // FNV-1a over the things that pick the debug files to look for.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |b: &[u8]| {
            for &x in b.iter().chain(&[0xff]) {
                h = (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
            }
        };
        eat(key.path.as_os_str().as_encoded_bytes());
        for d in debug_dirs {
            eat(d.as_os_str().as_encoded_bytes());
        }
        self.dir
            .join(format!("{}-{h:016x}.sym", hex(&key.build_id)))
    }

    /// The stored answers for `key`, if a file holds them and everything it
    /// was made from is unchanged.
    pub(crate) fn load(&self, key: &StoreKey, debug_dirs: &[PathBuf]) -> Option<Stored> {
        self.check_dir().ok()?;
        let path = self.file_for(key, debug_dirs);
        let f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(&path)
            .ok()?;
        let meta = f.metadata().ok()?;
        if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
            return None;
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        f.take(MAX_FILE_BYTES).read_to_end(&mut bytes).ok()?;
        let file = decode(bytes)?;
        if file.module != key.module || *file.build_id != *key.build_id {
            return None;
        }
        if file
            .observed
            .iter()
            .any(|o| Observation::now(&o.path) != *o)
        {
            return None;
        }
        Some(Stored {
            observed: file.observed,
            answers: file.answers,
        })
    }

    /// Saves `answers` for `key`, made with the debug files `observed`;
    /// then keeps the directory within its budget.
    pub(crate) fn save<A: AnswerBytes>(
        &self,
        key: &StoreKey,
        debug_dirs: &[PathBuf],
        observed: &[Observation],
        answers: impl Iterator<Item = A>,
    ) -> io::Result<()> {
        let bytes = encode(key, observed, answers);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        self.check_dir()?;
        let path = self.file_for(key, debug_dirs);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&tmp)?;
        let written = f.write_all(&bytes).and_then(|()| fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written?;
        if self.trim_due() {
            self.trim();
        }
        Ok(())
    }

    /// Whether the directory's size was last looked at `trim_every` ago or
    /// longer (or never); if so, marks it looked at now.
    fn trim_due(&self) -> bool {
        let marker = self.dir.join(TRIMMED);
        let recent = fs::symlink_metadata(&marker).is_ok_and(|m| {
            m.file_type().is_file()
                && m.modified()
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age < self.trim_every)
        });
        if recent {
            return false;
        }
        // Not markable (a link, a directory): looked at every time, as if
        // there were no marker.
        let _ = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&marker)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        true
    }

    /// The directory must be a directory (not a link to one) of this
    /// user: a daemon run by root never reads names from, writes into or
    /// removes files of a directory someone else controls.
    fn check_dir(&self) -> io::Result<()> {
        let m = fs::symlink_metadata(&self.dir)?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if m.file_type().is_dir() && m.uid() == me {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "not a directory of this user",
            ))
        }
    }

    /// Removes the oldest of the store's own files (by their names) while
    /// they hold more than its budget; nothing else in the directory is
    /// touched.
    fn trim(&self) {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(i64, u64, PathBuf)> = dir
            .filter_map(Result::ok)
            .filter(|e| is_store_file(&e.file_name()))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                m.is_file().then(|| (m.mtime(), m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        // Oldest first; names compared as bytes (comparing paths by their
        // components was most of the sort).
        files.sort_unstable_by(|a, b| {
            (a.0, a.1, a.2.as_os_str().as_bytes()).cmp(&(b.0, b.1, b.2.as_os_str().as_bytes()))
        });
        for (_, len, path) in files {
            if total <= self.max_bytes {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total = total.saturating_sub(len);
            }
        }
    }
}

/// Whether `name` is one the store writes: `<hex>-<16 hex>.sym`, or its
/// temporary `<hex>-<16 hex>.tmp<pid>`.
fn is_store_file(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    let Some((stem, ext)) = name.rsplit_once('.') else {
        return false;
    };
    let hex = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_hexdigit());
    let ext_ok = ext == "sym"
        || ext
            .strip_prefix("tmp")
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
    ext_ok
        && stem
            .split_once('-')
            .is_some_and(|(id, h)| hex(id) && h.len() == 16 && hex(h))
}

/// A store file, decoded.
struct StoreFile {
    module: FileKey,
    build_id: Vec<u8>,
    observed: Vec<Observation>,
    answers: StoredAnswers,
}

fn put_key(out: &mut Vec<u8>, k: &FileKey) {
    for v in [k.dev, k.ino, k.size, k.mtime as u64, k.mtime_nsec as u64] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn encode<A: AnswerBytes>(
    key: &StoreKey,
    observed: &[Observation],
    answers: impl Iterator<Item = A>,
) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    put_key(&mut out, &key.module);
    let id = &key.build_id[..key.build_id.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(id.len() as u16).to_le_bytes());
    out.extend_from_slice(id);
    let observed: Vec<&Observation> = observed
        .iter()
        .filter(|o| o.path.as_os_str().len() <= u16::MAX as usize)
        .take(MAX_OBSERVED)
        .collect();
    out.extend_from_slice(&(observed.len() as u32).to_le_bytes());
    for o in observed {
        let p = o.path.as_os_str().as_encoded_bytes();
        out.extend_from_slice(&(p.len() as u16).to_le_bytes());
        out.extend_from_slice(p);
        out.push(u8::from(o.file.is_some()));
        put_key(&mut out, &o.file.unwrap_or(FileKey::NONE));
    }
    let count_at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut count = 0u32;
    for answer in answers.take(MAX_ANSWERS) {
        count += 1;
        answer.append_to(&mut out);
    }
    out[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// For the `symbol_store` fuzz target: `body` with its checksum made right
/// is decoded as a store file (the checksum would turn nearly every input
/// away before the parser), and what decodes must encode back to a file
/// that decodes the same. Panics only if that round trip fails.
#[doc(hidden)]
pub fn fuzz_decode(body: &[u8]) {
    let mut bytes = body.to_vec();
    bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    let Some(f) = decode(bytes) else { return };
    let key = StoreKey {
        build_id: f.build_id.clone().into(),
        module: f.module,
        path: PathBuf::new(),
    };
    let again = encode(&key, &f.observed, f.answers.iter());
    let g = decode(again).expect("a decoded store file encodes to one that decodes");
    assert_eq!(
        (g.module, &g.build_id, &g.observed, &g.answers),
        (f.module, &f.build_id, &f.observed, &f.answers),
        "store file round trip"
    );
    // A save that keeps the answers read copies their bytes: the same file.
    let kept = f.answers.kept().map(|(pc, b)| ToWrite::Kept(pc, b));
    let h = decode(encode(&key, &f.observed, kept)).expect("kept answers encode to a file");
    assert_eq!(&h.answers, &f.answers, "kept answers round trip");
}

/// A file's identity as a store file holds it.
fn read_key(c: &mut Cursor<'_>) -> Option<FileKey> {
    Some(FileKey {
        dev: c.u64()?,
        ino: c.u64()?,
        size: c.u64()?,
        mtime: c.u64()? as i64,
        mtime_nsec: c.u64()? as i64,
    })
}

/// A store file's bytes, parsed; `None` unless all of it is right.
fn decode(bytes: Vec<u8>) -> Option<StoreFile> {
    let (body, crc) = bytes.split_at(bytes.len().checked_sub(4)?);
    if crc32fast::hash(body).to_le_bytes() != crc {
        return None;
    }
    let mut c = Cursor::new(body, 0);
    if c.take(MAGIC.len())? != MAGIC {
        return None;
    }
    let module = read_key(&mut c)?;
    let n = c.u16()? as usize;
    let build_id = c.take(n)?.to_vec();
    let n = c.u32()? as usize;
    if n > MAX_OBSERVED {
        return None;
    }
    let mut observed = Vec::with_capacity(n);
    for _ in 0..n {
        let len = c.u16()? as usize;
        let path = PathBuf::from(OsStr::from_bytes(c.take(len)?));
        let present = c.u8()? != 0;
        let key = read_key(&mut c)?;
        observed.push(Observation {
            path,
            file: present.then_some(key),
        });
    }
    let n = c.u32()? as usize;
    if n > MAX_ANSWERS {
        return None;
    }
    let (start, end) = (c.pos, body.len());
    let answers = StoredAnswers::parse(bytes, start, end, n)?;
    Some(StoreFile {
        module,
        build_id,
        observed,
        answers,
    })
}

#[cfg(test)]
#[path = "symbol_store_tests.rs"]
mod tests;
