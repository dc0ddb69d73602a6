//! JIT symbol maps: `/tmp/perf-PID.map`.
//!
//! Written by JITs for perf (node `--perf-basic-prof`, the JVM's perf map
//! agents, LuaJIT, …). One function per line: `START SIZE name`, with START
//! and SIZE in hex (an optional `0x` prefix is accepted). Later lines win
//! where ranges overlap (code is reused after a function is collected).
//!
//! `/tmp` is writable by every user, so anyone can put something at
//! another process's perf map path: a FIFO (an `open` that blocks until a
//! writer comes, forever), a symlink to a device or to someone's file, a
//! huge file. [`PerfMap::load`] opens without blocking (`O_NONBLOCK`) and
//! without following a symlink (`O_NOFOLLOW`), then takes only a regular
//! file owned by the profiled process's user (or root), as perf does, and
//! reads at most [`MAX_PERF_MAP_BYTES`] of it.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A parsed perf map.
#[derive(Debug, Default, Clone)]
pub struct PerfMap {
    // (start, end, name) sorted by start, non-overlapping.
    entries: Vec<(u64, u64, String)>,
}

/// Path of the perf map for a pid.
pub fn perf_map_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{pid}.map"))
}

/// Largest perf map we read (the rest is ignored): 64 MiB, some 600,000
/// JIT functions.
pub const MAX_PERF_MAP_BYTES: u64 = 64 << 20;

fn hex(s: &str) -> Option<u64> {
    let s = s.strip_prefix("0x").unwrap_or(s);
    u64::from_str_radix(s, 16).ok()
}

impl PerfMap {
    /// Parses perf map text; malformed lines are skipped.
    pub fn parse(text: &str) -> PerfMap {
        let mut raw: Vec<(u64, u64, &str, usize)> = Vec::new();
        for (line_no, line) in text.lines().enumerate() {
            let mut parts = line.splitn(3, ' ');
            let (Some(start), Some(size), Some(name)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Some(start), Some(size)) = (hex(start), hex(size)) else {
                continue;
            };
            let Some(end) = start.checked_add(size).filter(|_| size > 0) else {
                continue;
            };
            raw.push((start, end, name.trim(), line_no));
        }
        // Later lines override earlier ones: insert newest first, keep only
        // ranges that do not overlap anything newer.
        raw.sort_by_key(|r| std::cmp::Reverse(r.3));
        let mut kept: Vec<(u64, u64, String)> = Vec::with_capacity(raw.len());
        let mut sorted_kept: Vec<(u64, u64)> = Vec::new();
        for (start, end, name, _) in raw {
            let i = sorted_kept.partition_point(|r| r.0 < start);
            let overlaps_prev = i > 0 && sorted_kept[i - 1].1 > start;
            let overlaps_next = i < sorted_kept.len() && sorted_kept[i].0 < end;
            if overlaps_prev || overlaps_next {
                continue;
            }
            sorted_kept.insert(i, (start, end));
            kept.push((start, end, name.to_owned()));
        }
        kept.sort_by_key(|e| e.0);
        PerfMap { entries: kept }
    }

    /// Reads and parses the perf map at `path` if it is a regular file
    /// (not a symlink, FIFO or device) owned by `owner` (the profiled
    /// process's user) or root; `owner` `None` takes any owner. Never
    /// blocks in `open`; reads at most [`MAX_PERF_MAP_BYTES`].
    pub fn load(path: &Path, owner: Option<u32>) -> io::Result<PerfMap> {
        let mut bytes = Vec::new();
        open_checked(path, owner)?
            .take(MAX_PERF_MAP_BYTES)
            .read_to_end(&mut bytes)?;
        Ok(PerfMap::parse(&String::from_utf8_lossy(&bytes)))
    }

    /// The name of the JIT function containing the absolute address `pc`.
    pub fn lookup(&self, pc: u64) -> Option<&str> {
        let i = self.entries.partition_point(|e| e.0 <= pc).checked_sub(1)?;
        let (start, end, name) = &self.entries[i];
        (*start <= pc && pc < *end).then_some(name.as_str())
    }

    /// Number of functions.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Opens `path` for reading the way [`PerfMap::load`] describes.
fn open_checked(path: &Path, owner: Option<u32>) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    }
    if let Some(uid) = owner
        && meta.uid() != uid
        && meta.uid() != 0
    {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to uid {}, not to the profiled process's uid {uid} (nor root)",
                path.display(),
                meta.uid()
            ),
        ));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_of_the_owner_are_read() {
        let dir = std::env::temp_dir().join(format!("hp-perfmap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::fs::metadata(&dir).unwrap().uid();
        let good = dir.join("perf-1.map");
        std::fs::write(&good, "1000 10 f\n").unwrap();
        assert_eq!(PerfMap::load(&good, Some(me)).unwrap().len(), 1);
        assert_eq!(PerfMap::load(&good, None).unwrap().len(), 1);
        // Another owner (unless it is root's, which perf accepts too).
        if me != 0 {
            assert!(PerfMap::load(&good, Some(me + 1)).is_err());
        } else {
            assert!(PerfMap::load(&good, Some(12345)).is_ok());
        }
        // A symlink, even to a good file: not followed.
        let link = dir.join("perf-2.map");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let e = PerfMap::load(&link, Some(me)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        // A FIFO nobody writes to: refused at once, not an open that
        // blocks forever.
        let fifo = dir.join("perf-3.map");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = PerfMap::load(&fifo, Some(me)).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // A device.
        assert!(PerfMap::load(Path::new("/dev/zero"), None).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parses_and_looks_up() {
        let m = PerfMap::parse(
            "7f0000001000 40 LazyCompile:~foo /a.js:1\n\
             0x7f0000002000 0x10 Builtin:Bar\n\
             bogus line\n\
             zz 10 x\n\
             10 0 zero-size\n\
             ffffffffffffffff 10 overflow\n\
             7f0000001020 8 newer-inside-foo\n",
        );
        assert_eq!(m.len(), 2);
        // The newer, overlapping entry wins; the older range is dropped whole.
        assert_eq!(m.lookup(0x7f0000001000), None);
        assert_eq!(m.lookup(0x7f0000001024), Some("newer-inside-foo"));
        assert_eq!(m.lookup(0x7f000000200f), Some("Builtin:Bar"));
        assert_eq!(m.lookup(0x7f0000002010), None);
        assert_eq!(m.lookup(0), None);
    }
}
