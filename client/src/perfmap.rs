//! JIT code ranges from the process's perf map (`/tmp/perf-PID.map`, the
//! format JITs write for `perf`: one `START SIZE NAME` line per function,
//! hexadecimal, with or without `0x`), read when the in-process walk's
//! tables are built (`walktables`), never during a walk.

/// The sorted `[start, end)` ranges of this process's perf map; empty
/// without one. Allocates (the tables' builder holds the guard).
pub(crate) fn jit_ranges() -> Vec<(u64, u64)> {
    let mut path = [0u8; 48];
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let mut w = Writer {
        buf: &mut path,
        len: 0,
    };
    w.put(b"/tmp/perf-");
    w.put_decimal(pid);
    w.put(b".map\0");
    read_ranges(&path)
}

/// The sorted ranges of the perf map at `path` (NUL-terminated).
fn read_ranges(path: &[u8]) -> Vec<(u64, u64)> {
    let mut ranges = Vec::new();
    if !path.contains(&0) {
        return ranges;
    }
    // SAFETY: open with a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return ranges;
    }
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // SAFETY: reading into our buffer, within its length.
        let n = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
        if n <= 0 || data.len() > (64 << 20) {
            break;
        }
        data.extend_from_slice(chunk.get(..n as usize).unwrap_or(&[]));
    }
    // SAFETY: closing the descriptor we opened.
    unsafe { libc::close(fd) };
    parse(&data, &mut ranges);
    ranges.sort_unstable();
    ranges
}

/// Appends the ranges of a perf map's text to `out`; bad lines are skipped.
fn parse(text: &[u8], out: &mut Vec<(u64, u64)>) {
    for line in text.split(|&b| b == b'\n') {
        let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
        let (Some(start), Some(size)) = (fields.next(), fields.next()) else {
            continue;
        };
        if let (Some(s), Some(n)) = (hex(start), hex(size))
            && let Some(e) = s.checked_add(n)
            && n > 0
        {
            out.push((s, e));
        }
    }
}

fn hex(f: &[u8]) -> Option<u64> {
    let f = f.strip_prefix(b"0x").unwrap_or(f);
    if f.is_empty() || f.len() > 16 {
        return None;
    }
    f.iter().try_fold(0u64, |v, &c| {
        let d = (c as char).to_digit(16)?;
        Some(v << 4 | u64::from(d))
    })
}

/// A byte writer over a fixed buffer (the path, no allocation).
struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Writer<'_> {
    fn put(&mut self, s: &[u8]) {
        for &b in s {
            if let Some(slot) = self.buf.get_mut(self.len) {
                *slot = b;
                self.len += 1;
            }
        }
    }
    fn put_decimal(&mut self, mut v: u32) {
        let mut digits = [0u8; 10];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.put(&digits[i..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_a_perf_map_become_ranges() {
        let mut r = Vec::new();
        parse(
            b"7f0000001000 40 LazyCompile:foo\n0x7f0000002000 0x10 bar baz\nbad line\n1 0 empty\n",
            &mut r,
        );
        assert_eq!(
            r,
            vec![
                (0x7f00_0000_1000, 0x7f00_0000_1040),
                (0x7f00_0000_2000, 0x7f00_0000_2010)
            ]
        );
    }

    #[test]
    fn a_map_file_is_read_sorted_and_a_missing_one_is_empty() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("heapprofd-perfmap-test-{}.map", std::process::id()));
        std::fs::write(&path, "7f0000002000 40 b\n7f0000001000 10 a\n").unwrap();
        let mut c = path.to_string_lossy().into_owned().into_bytes();
        c.push(0);
        let r = read_ranges(&c);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            r,
            vec![
                (0x7f00_0000_1000, 0x7f00_0000_1010),
                (0x7f00_0000_2000, 0x7f00_0000_2040)
            ]
        );
        assert!(read_ranges(&c).is_empty());
    }
}
