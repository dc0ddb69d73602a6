//! Allocation-free reading of `/proc/self/maps`: the main thread's stack.
//!
//! glibc's `pthread_getattr_np` finds the main thread's stack by reading
//! `/proc/self/maps` with stdio, which allocates. The client instead reads
//! the `[stack]` line once, in the constructor, with raw `open`/`read` into
//! fixed buffers (as heapprofd does at client creation).

/// Parses the `start-end` range at the beginning of a maps line.
pub fn parse_range(line: &[u8]) -> Option<(u64, u64)> {
    let dash = line.iter().position(|&b| b == b'-')?;
    let rest = line.get(dash + 1..)?;
    let space = rest.iter().position(|&b| b == b' ')?;
    let start = parse_hex(line.get(..dash)?)?;
    let end = parse_hex(rest.get(..space)?)?;
    (start < end).then_some((start, end))
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | d as u64;
    }
    Some(v)
}

/// Longest line kept; longer lines (long paths) are skipped, which is fine:
/// the line we look for is short.
const LINE_MAX: usize = 256;

/// Feeds bytes of a maps file and remembers the range of the `[stack]` line.
#[derive(Debug)]
pub struct StackFinder {
    line: [u8; LINE_MAX],
    len: usize,
    too_long: bool,
    /// The `[stack]` range, once seen.
    pub found: Option<(u64, u64)>,
}

impl Default for StackFinder {
    fn default() -> Self {
        StackFinder {
            line: [0; LINE_MAX],
            len: 0,
            too_long: false,
            found: None,
        }
    }
}

impl StackFinder {
    /// Consumes a chunk of the file.
    pub fn feed(&mut self, chunk: &[u8]) {
        for &b in chunk {
            if b == b'\n' {
                self.end_line();
            } else if let Some(slot) = self.line.get_mut(self.len) {
                *slot = b;
                self.len += 1;
            } else {
                self.too_long = true;
            }
        }
    }

    /// Ends the input (a last line without a newline).
    pub fn finish(&mut self) {
        if self.len > 0 {
            self.end_line();
        }
    }

    fn end_line(&mut self) {
        let line = self.line.get(..self.len).unwrap_or(&[]);
        if !self.too_long && self.found.is_none() && line.ends_with(b" [stack]") {
            self.found = parse_range(line);
        }
        self.len = 0;
        self.too_long = false;
    }
}

/// Reads `/proc/self/maps` with raw system calls (no allocation), handing
/// each chunk read to `f` until it returns false or the file ends. False if
/// the file could not be opened.
pub fn read_self_maps(buf: &mut [u8], mut f: impl FnMut(&[u8]) -> bool) -> bool {
    // SAFETY: open with a valid NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    loop {
        // SAFETY: reading into the caller's buffer, within its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && crate::errno::get() == libc::EINTR {
            continue;
        }
        if n <= 0 || !f(buf.get(..n as usize).unwrap_or(&[])) {
            break;
        }
    }
    // SAFETY: closing the descriptor we opened.
    unsafe { libc::close(fd) };
    true
}

/// The main thread's stack mapping, from `/proc/self/maps`.
pub fn main_stack() -> Option<(u64, u64)> {
    let mut finder = StackFinder::default();
    let opened = read_self_maps(&mut [0u8; 1024], |chunk| {
        finder.feed(chunk);
        finder.found.is_none()
    });
    if !opened {
        return None;
    }
    finder.finish();
    finder.found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_stack_line_across_chunks() {
        let maps = b"55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 123 /usr/bin/x\n\
7f00aa000000-7f00aa100000 rw-p 00000000 00:00 0 \n\
7ffd5a1e0000-7ffd5a201000 rw-p 00000000 00:00 0                          [stack]\n\
7ffd5a3f1000-7ffd5a3f5000 r--p 00000000 00:00 0                          [vvar]\n";
        for chunk in [1usize, 7, 64, 4096] {
            let mut f = StackFinder::default();
            for c in maps.chunks(chunk) {
                f.feed(c);
            }
            f.finish();
            assert_eq!(
                f.found,
                Some((0x7ffd5a1e0000, 0x7ffd5a201000)),
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn long_lines_and_garbage_are_skipped() {
        let mut f = StackFinder::default();
        let long = format!("1000-2000 r--p 0 0:0 0 /{} [stack]\n", "a".repeat(600));
        f.feed(long.as_bytes());
        f.feed(b"zz-2000 rw-p 0 0:0 0 [stack]\n");
        f.feed(b"3000-4000 rw-p 0 0:0 0 [stack]");
        f.finish();
        assert_eq!(f.found, Some((0x3000, 0x4000)));
        assert_eq!(parse_range(b"2000-1000 x"), None);
        assert_eq!(parse_range(b"12345678901234567-1 x"), None);
    }

    #[test]
    fn this_process_has_a_stack() {
        let (lo, hi) = main_stack().expect("[stack] in /proc/self/maps");
        assert!(lo < hi);
    }
}
