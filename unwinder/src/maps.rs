//! Parsing of `/proc/PID/maps` text.
//!
//! Each line is `start-end perms offset dev inode [path]`; the path may
//! contain spaces and may end in ` (deleted)`. Parsing never panics: a line
//! that does not have this shape is skipped (and counted), because the text
//! comes from a descriptor the profiled process handed us.

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    /// First address of the mapping (AVMA).
    pub start: u64,
    /// One past the last address of the mapping.
    pub end: u64,
    /// Readable (`r`).
    pub read: bool,
    /// Writable (`w`).
    pub write: bool,
    /// Executable (`x`).
    pub exec: bool,
    /// Offset into the mapped file of the byte at `start`.
    pub offset: u64,
    /// Device major number.
    pub dev_major: u32,
    /// Device minor number.
    pub dev_minor: u32,
    /// Inode of the mapped file, 0 for anonymous mappings.
    pub inode: u64,
    /// The path or pseudo-name (`[vdso]`, `[stack]`, …), empty for anonymous
    /// mappings. A trailing ` (deleted)` is removed and reported in `deleted`.
    pub path: String,
    /// The kernel marked the file as deleted.
    pub deleted: bool,
}

impl MapEntry {
    /// Whether `addr` falls inside the mapping.
    #[inline]
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// Whether the mapping is backed by a regular file (a path starting with `/`).
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/') && self.inode != 0
    }

    /// Whether this is the kernel's vDSO.
    pub fn is_vdso(&self) -> bool {
        self.path == "[vdso]"
    }

    /// The `/proc/PID/map_files/` entry name for this mapping.
    pub fn map_files_name(&self) -> String {
        format!("{:x}-{:x}", self.start, self.end)
    }
}

/// Result of parsing a whole maps text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedMaps {
    /// The mappings, sorted by start address, without overlaps.
    pub entries: Vec<MapEntry>,
    /// Lines that could not be parsed (or overlapped an earlier mapping).
    pub bad_lines: usize,
}

/// Parses the text of a maps file.
pub fn parse_maps(text: &str) -> ParsedMaps {
    let mut out = ParsedMaps::default();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(line) {
            Some(e) => out.entries.push(e),
            None => out.bad_lines += 1,
        }
    }
    out.entries.sort_by_key(|e| e.start);
    // Drop overlapping entries so lookups by binary search are well defined.
    let mut kept: Vec<MapEntry> = Vec::with_capacity(out.entries.len());
    for e in out.entries.drain(..) {
        match kept.last() {
            Some(prev) if e.start < prev.end => out.bad_lines += 1,
            _ => kept.push(e),
        }
    }
    out.entries = kept;
    out
}

/// Parses one maps line; `None` when it is malformed.
pub fn parse_line(line: &str) -> Option<MapEntry> {
    let mut rest = line;
    let range = next_field(&mut rest)?;
    let perms = next_field(&mut rest)?;
    let offset = next_field(&mut rest)?;
    let dev = next_field(&mut rest)?;
    let inode = next_field(&mut rest)?;
    let path = rest.trim_start();

    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    if end <= start {
        return None;
    }
    let p = perms.as_bytes();
    if p.len() < 3 {
        return None;
    }
    let offset = u64::from_str_radix(offset, 16).ok()?;
    let (major, minor) = dev.split_once(':')?;
    let dev_major = u32::from_str_radix(major, 16).ok()?;
    let dev_minor = u32::from_str_radix(minor, 16).ok()?;
    let inode = inode.parse::<u64>().ok()?;
    let (path, deleted) = match path.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    };
    Some(MapEntry {
        start,
        end,
        read: p[0] == b'r',
        write: p[1] == b'w',
        exec: p[2] == b'x',
        offset,
        dev_major,
        dev_minor,
        inode,
        path: path.to_owned(),
        deleted,
    })
}

fn next_field<'a>(rest: &mut &'a str) -> Option<&'a str> {
    let s = rest.trim_start_matches(' ');
    if s.is_empty() {
        return None;
    }
    let end = s.find(' ').unwrap_or(s.len());
    let (field, tail) = s.split_at(end);
    *rest = tail;
    Some(field)
}

/// Index of the entry containing `addr` in a sorted, non-overlapping list.
pub fn find_entry<T>(entries: &[T], addr: u64, range: impl Fn(&T) -> (u64, u64)) -> Option<usize> {
    let i = entries.partition_point(|e| range(e).0 <= addr);
    let i = i.checked_sub(1)?;
    let (start, end) = range(&entries[i]);
    (start <= addr && addr < end).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c8a00000-55d0c8a01000 r--p 00000000 fe:01 1234   /usr/bin/my prog
55d0c8a01000-55d0c8a02000 r-xp 00001000 fe:01 1234   /usr/bin/my prog
7f1e2c000000-7f1e2c021000 rw-p 00000000 00:00 0
7f1e2d000000-7f1e2d1a0000 r-xp 00026000 08:02 99 /lib/libc.so.6 (deleted)
7ffc1a0e0000-7ffc1a101000 rw-p 00000000 00:00 0                          [stack]
7ffc1a1f6000-7ffc1a1f8000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn parses_real_shapes() {
        let m = parse_maps(MAPS);
        assert_eq!(m.bad_lines, 0);
        assert_eq!(m.entries.len(), 7);
        let e = &m.entries[1];
        assert_eq!(
            (e.start, e.end, e.offset),
            (0x55d0c8a01000, 0x55d0c8a02000, 0x1000)
        );
        assert!(e.read && !e.write && e.exec);
        assert_eq!(e.path, "/usr/bin/my prog");
        assert_eq!((e.dev_major, e.dev_minor, e.inode), (0xfe, 1, 1234));
        assert!(e.is_file());
        assert_eq!(e.map_files_name(), "55d0c8a01000-55d0c8a02000");
        let anon = &m.entries[2];
        assert_eq!(anon.path, "");
        assert!(!anon.is_file());
        let libc = &m.entries[3];
        assert!(libc.deleted);
        assert_eq!(libc.path, "/lib/libc.so.6");
        assert!(m.entries[5].is_vdso());
        assert_eq!(m.entries[6].end, 0xffffffffff601000);
    }

    #[test]
    fn hostile_lines_are_skipped() {
        let text = "garbage\n\
                    1000-0500 r-xp 0 00:00 0\n\
                    zz-1000 r-xp 0 00:00 0\n\
                    1000-2000 r 0 00:00 0\n\
                    1000-2000 r-xp 0 0000 0\n\
                    1000-2000 r-xp 0 00:00 -1\n\
                    1000-2000 r-xp 0 00:00\n\
                    1000-3000 r-xp 0 00:00 0 /a\n\
                    2000-4000 r-xp 0 00:00 0 /overlap\n\
                    \u{1F600}-\u{1F600}\n";
        let m = parse_maps(text);
        assert_eq!(m.entries.len(), 1);
        assert_eq!(m.entries[0].path, "/a");
        assert_eq!(m.bad_lines, 9);
    }

    #[test]
    fn find_entry_binary_search() {
        let m = parse_maps(MAPS);
        let r = |e: &MapEntry| (e.start, e.end);
        assert_eq!(find_entry(&m.entries, 0x55d0c8a01234, r), Some(1));
        assert_eq!(find_entry(&m.entries, 0x55d0c8a00000, r), Some(0));
        assert_eq!(find_entry(&m.entries, 0x55d0c8a02000, r), None);
        assert_eq!(find_entry(&m.entries, 0, r), None);
        assert_eq!(find_entry(&m.entries, u64::MAX, r), None);
        assert_eq!(find_entry::<MapEntry>(&[], 5, r), None);
    }
}
