//! Finding the separate debug information of a module.
//!
//! Order, as gdb and samply do it:
//! 1. `<debug dir>/.build-id/xx/rest.debug` for the module's build id (the
//!    candidate's own build id must match);
//! 2. `.gnu_debuglink`: `<dir>/<name>`, `<dir>/.debug/<name>`,
//!    `<debug dir>/<dir>/<name>` (and, for a module found offline, under
//!    each debug dir at the directory it was mapped from), each accepted
//!    only if the CRC32 of the whole candidate equals the one stored in the
//!    link (the others are reported as refused);
//! 3. the module itself, when it carries `.debug_info`.
//!
//! A debug file's `.gnu_debugaltlink` (dwz) names a supplementary file,
//! looked up by its path (relative to the debug file's directory when not
//! absolute) and by `<debug dir>/.build-id/` of its build id, and accepted
//! only when its build id matches. `.gnu_debugdata` (MiniDebugInfo) is an xz
//! stream holding an ELF with a `.symtab`; see [`mini_debug_info`].

use std::cell::RefCell;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::{Object, ObjectSection};

use crate::elf::FileBytes;
use crate::file_key::{FileKey, Observation};

/// Largest MiniDebugInfo payload we decompress.
const MAX_MINI_DEBUG_INFO: usize = 256 << 20;

/// A debug file found for a module.
#[derive(Debug, Clone)]
pub struct DebugFile {
    /// Where it was found.
    pub path: PathBuf,
    /// Its bytes.
    pub bytes: Arc<FileBytes>,
}

/// Hex of a build id, lower case.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// `<dir>/.build-id/xx/rest.debug` for a build id.
pub fn build_id_path(debug_dir: &Path, build_id: &[u8]) -> Option<PathBuf> {
    let (first, rest) = build_id.split_first()?;
    if rest.is_empty() {
        return None;
    }
    Some(
        debug_dir
            .join(".build-id")
            .join(format!("{first:02x}"))
            .join(format!("{}.debug", hex(rest))),
    )
}

thread_local! {
    /// The paths [`map_file`] looked at, while [`consulted_during`] records.
    static CONSULTED: RefCell<Option<Vec<Observation>>> = const { RefCell::new(None) };
}

/// Runs `f` and returns with its result every path it looked for a debug
/// file at, and what was there (what its answers depend on besides the
/// module itself: see [`crate::symbol_store`]).
pub(crate) fn consulted_during<T>(f: impl FnOnce() -> T) -> (T, Vec<Observation>) {
    let outer = CONSULTED.with(|c| c.replace(Some(Vec::new())));
    let value = f();
    let seen = CONSULTED.with(|c| c.replace(outer)).unwrap_or_default();
    (value, seen)
}

fn map_file(path: &Path) -> Option<Arc<FileBytes>> {
    let f = crate::elf::open_nonblocking(path).ok();
    let meta = f
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .filter(std::fs::Metadata::is_file);
    CONSULTED.with(|c| {
        if let Some(seen) = c.borrow_mut().as_mut() {
            seen.push(Observation {
                path: path.to_path_buf(),
                file: meta.as_ref().map(FileKey::of),
            });
        }
    });
    meta?;
    FileBytes::map(&f?).ok().map(Arc::new)
}

fn build_id_of(bytes: &[u8]) -> Option<Vec<u8>> {
    let f = object::File::parse(bytes).ok()?;
    f.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// Looks a file up by build id under the debug directories.
pub fn find_by_build_id(debug_dirs: &[PathBuf], build_id: &[u8]) -> Option<DebugFile> {
    for dir in debug_dirs {
        let Some(path) = build_id_path(dir, build_id) else {
            continue;
        };
        let Some(bytes) = map_file(&path) else {
            continue;
        };
        if build_id_of(&bytes).as_deref() == Some(build_id) {
            return Some(DebugFile { path, bytes });
        }
    }
    None
}

/// What following a `.gnu_debuglink` found.
#[derive(Debug, Default)]
pub struct Debuglink {
    /// The first candidate whose CRC32 is the link's.
    pub found: Option<DebugFile>,
    /// Candidates that exist but whose CRC32 is not the link's (another
    /// build's debug file): refused.
    pub refused: Vec<PathBuf>,
}

/// The places a `.gnu_debuglink` target `name` is looked for, in order, as
/// gdb does: beside the module, in `.debug/` beside it, then under each
/// debug directory at the module's directory. `mapped_path` is where the
/// module was mapped when that is not where its file was found (offline
/// symbolization: a device path); its directory is tried under the debug
/// directories too.
pub fn debuglink_candidates(
    debug_dirs: &[PathBuf],
    module_path: &Path,
    mapped_path: Option<&Path>,
    name: &str,
) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let Some(dir) = module_path.parent() else {
        return v;
    };
    v.push(dir.join(name));
    v.push(dir.join(".debug").join(name));
    let mut dirs = vec![dir];
    if let Some(m) = mapped_path.and_then(Path::parent)
        && m != dir
    {
        dirs.push(m);
    }
    for d in debug_dirs {
        for m in &dirs {
            let rel = m.strip_prefix("/").unwrap_or(m);
            v.push(d.join(rel).join(name));
        }
    }
    v.retain(|p| p != module_path);
    v.dedup();
    v
}

/// Follows a `.gnu_debuglink` (name, crc) for the module at `module_path`
/// (see [`debuglink_candidates`]); a candidate is accepted only if the
/// CRC32 of its whole file is the link's.
pub fn find_by_debuglink(
    debug_dirs: &[PathBuf],
    module_path: &Path,
    mapped_path: Option<&Path>,
    name: &[u8],
    crc: u32,
) -> Debuglink {
    let mut out = Debuglink::default();
    let Ok(name) = std::str::from_utf8(name) else {
        return out;
    };
    if name.is_empty() || name.contains('/') {
        return out;
    }
    for path in debuglink_candidates(debug_dirs, module_path, mapped_path, name) {
        let Some(bytes) = map_file(&path) else {
            continue;
        };
        if crc32fast::hash(&bytes) == crc {
            out.found = Some(DebugFile { path, bytes });
            return out;
        }
        out.refused.push(path);
    }
    out
}

/// Finds the dwz supplementary file named by a debug file's `.gnu_debugaltlink`.
pub fn find_altlink(
    debug_dirs: &[PathBuf],
    debug_file_path: &Path,
    alt_path: &[u8],
    alt_build_id: &[u8],
) -> Option<DebugFile> {
    if let Ok(p) = std::str::from_utf8(alt_path) {
        let p = Path::new(p);
        let path = if p.is_absolute() {
            p.to_path_buf()
        } else {
            debug_file_path.parent()?.join(p)
        };
        if let Some(bytes) = map_file(&path)
            && build_id_of(&bytes).as_deref() == Some(alt_build_id)
        {
            return Some(DebugFile { path, bytes });
        }
    }
    find_by_build_id(debug_dirs, alt_build_id)
}

/// Whether an ELF file has DWARF debug info.
pub fn has_dwarf(file: &object::File<'_>) -> bool {
    file.section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0 && s.kind() != object::SectionKind::UninitializedData)
}

/// The decompressed ELF image inside `.gnu_debugdata`, if any.
pub fn mini_debug_info(file: &object::File<'_>) -> Option<Vec<u8>> {
    let section = file.section_by_name(".gnu_debugdata")?;
    let data = section.data().ok()?;
    let mut out = LimitedVec(Vec::new());
    lzma_rs::xz_decompress(&mut io::Cursor::new(data), &mut out).ok()?;
    Some(out.0)
}

/// A `Write` into a `Vec` that refuses to grow past [`MAX_MINI_DEBUG_INFO`].
struct LimitedVec(Vec<u8>);

impl Write for LimitedVec {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0.len().saturating_add(buf.len()) > MAX_MINI_DEBUG_INFO {
            return Err(io::Error::other("MiniDebugInfo too large"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_paths() {
        let p = build_id_path(Path::new("/usr/lib/debug"), &[0x93, 0xac, 0x61]).unwrap();
        assert_eq!(p, Path::new("/usr/lib/debug/.build-id/93/ac61.debug"));
        assert!(build_id_path(Path::new("/x"), &[]).is_none());
        assert!(build_id_path(Path::new("/x"), &[1]).is_none());
    }

    #[test]
    fn debuglink_rejects_bad_names_and_crc() {
        let dirs = vec![PathBuf::from("/usr/lib/debug")];
        let find =
            |module: &Path, name: &[u8], crc| find_by_debuglink(&dirs, module, None, name, crc);
        assert!(find(Path::new("/bin/ls"), b"", 0).found.is_none());
        assert!(find(Path::new("/bin/ls"), b"../etc/x", 0).found.is_none());
        assert!(find(Path::new("/bin/ls"), b"\xff", 0).found.is_none());
        // A real file with the wrong CRC is not accepted, and is named.
        let tmp = std::env::temp_dir().join(format!("hp-dl-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(tmp.join("x.debug"), b"not it").unwrap();
        let module = tmp.join("x");
        let wrong = find(&module, b"x.debug", 1);
        assert!(wrong.found.is_none());
        assert_eq!(wrong.refused, [tmp.join("x.debug")]);
        let crc = crc32fast::hash(b"not it");
        let found = find(&module, b"x.debug", crc);
        assert_eq!(found.found.unwrap().path, tmp.join("x.debug"));
        assert!(found.refused.is_empty());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn debuglink_places_in_order() {
        let dirs = [PathBuf::from("/sym"), PathBuf::from("/usr/lib/debug")];
        let c = debuglink_candidates(
            &dirs,
            Path::new("/sym/bin/app"),
            Some(Path::new("/system/bin/app")),
            "app.debug",
        );
        let want = [
            "/sym/bin/app.debug",
            "/sym/bin/.debug/app.debug",
            "/sym/sym/bin/app.debug",
            "/sym/system/bin/app.debug",
            "/usr/lib/debug/sym/bin/app.debug",
            "/usr/lib/debug/system/bin/app.debug",
        ];
        assert_eq!(c, want.map(PathBuf::from));
        // Not mapped elsewhere: gdb's three places.
        let c = debuglink_candidates(&dirs[1..], Path::new("/usr/bin/ls"), None, "ls.debug");
        let want = [
            "/usr/bin/ls.debug",
            "/usr/bin/.debug/ls.debug",
            "/usr/lib/debug/usr/bin/ls.debug",
        ];
        assert_eq!(c, want.map(PathBuf::from));
    }
}
