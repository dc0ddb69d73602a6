//! JIT symbol maps: `/tmp/perf-PID.map`.
//!
//! Written by JITs for perf (node `--perf-basic-prof`, the JVM's perf map
//! agents, LuaJIT, …). One function per line: `START SIZE name`, with START
//! and SIZE in hex (an optional `0x` prefix is accepted). Later lines win
//! where ranges overlap (code is reused after a function is collected).

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

/// Largest perf map we read.
const MAX_PERF_MAP_BYTES: u64 = 256 << 20;

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

    /// Reads and parses a perf map file.
    pub fn load(path: &Path) -> std::io::Result<PerfMap> {
        use std::io::Read;
        let mut bytes = Vec::new();
        std::fs::File::open(path)?
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

#[cfg(test)]
mod tests {
    use super::*;

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
