//! Progress of reading a long trace, on a terminal: a reader that passes
//! the file's bytes through and, once reading has taken a while, keeps one
//! status line up to date on standard error (`reading t.pftrace: 45% (56
//! of 125 MB)`), cleared when it is done. Nothing is written when standard
//! error is not a terminal, so scripts and tests see no difference.

use std::io::{self, IsTerminal, Read, Write};
use std::time::{Duration, Instant};

/// Reading that takes less than this shows nothing.
const QUIET_FOR: Duration = Duration::from_secs(2);
/// How often the line is rewritten.
const EVERY: Duration = Duration::from_millis(500);

/// A [`Read`] that reports how far it got (see the module docs).
pub struct Progress<R, W: Write> {
    inner: R,
    read: u64,
    total: u64,
    label: String,
    out: Option<W>,
    started: Instant,
    last: Option<Instant>,
}

impl<R, W: Write> std::fmt::Debug for Progress<R, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("read", &self.read)
            .field("total", &self.total)
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl<R: Read> Progress<R, io::Stderr> {
    /// Reads `inner`, `total` bytes long, reporting on standard error when
    /// it is a terminal.
    pub fn on_terminal(inner: R, total: u64, label: &str) -> Self {
        let err = io::stderr();
        let out = err.is_terminal().then_some(err);
        Progress::new(inner, total, label, out)
    }
}

impl<R: Read, W: Write> Progress<R, W> {
    /// Reads `inner`, `total` bytes long, reporting to `out` if any.
    pub fn new(inner: R, total: u64, label: &str, out: Option<W>) -> Self {
        Progress {
            inner,
            read: 0,
            total,
            label: label.to_owned(),
            out,
            started: Instant::now(),
            last: None,
        }
    }

    /// The status line for `read` of `total` bytes.
    fn line(&self) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        let pct = (self.read.saturating_mul(100))
            .checked_div(self.total)
            .unwrap_or(0)
            .min(100);
        format!(
            "reading {}: {pct}% ({:.0} of {:.0} MB)",
            self.label,
            mb(self.read),
            mb(self.total)
        )
    }

    fn show(&mut self, now: Instant) {
        if now.duration_since(self.started) < QUIET_FOR
            || self.last.is_some_and(|t| now.duration_since(t) < EVERY)
        {
            return;
        }
        self.last = Some(now);
        let line = self.line();
        if let Some(out) = self.out.as_mut() {
            // A status line: failing to show it is no reason to stop.
            let _ = write!(out, "\r{line}\x1b[K");
            let _ = out.flush();
        }
    }
}

impl<R: Read, W: Write> Read for Progress<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read = self.read.saturating_add(n as u64);
        if self.out.is_some() {
            self.show(Instant::now());
        }
        Ok(n)
    }
}

impl<R, W: Write> Drop for Progress<R, W> {
    /// Clears the line, if one was shown.
    fn drop(&mut self) {
        if self.last.is_some()
            && let Some(out) = self.out.as_mut()
        {
            let _ = write!(out, "\r\x1b[K");
            let _ = out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_pass_through_unchanged_and_a_quick_read_shows_nothing() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let mut shown = Vec::new();
        let mut got = Vec::new();
        {
            let mut p = Progress::new(&data[..], data.len() as u64, "t", Some(&mut shown));
            p.read_to_end(&mut got).unwrap();
            assert_eq!(p.read, data.len() as u64);
        }
        assert_eq!(got, data);
        assert!(shown.is_empty(), "{}", String::from_utf8_lossy(&shown));
    }

    #[test]
    fn a_slow_read_shows_a_line_and_clears_it() {
        let data = vec![1u8; 1000];
        let mut shown = Vec::new();
        {
            let mut p = Progress::new(&data[..], 4000, "t.pftrace", Some(&mut shown));
            p.started -= QUIET_FOR;
            let mut buf = [0u8; 100];
            p.read_exact(&mut buf).unwrap();
            assert_eq!(p.line(), "reading t.pftrace: 2% (0 of 0 MB)");
        }
        let s = String::from_utf8(shown).unwrap();
        assert!(s.starts_with("\rreading t.pftrace: 2%"), "{s:?}");
        assert!(s.ends_with("\r\x1b[K"), "{s:?}");
    }

    #[test]
    fn an_empty_or_growing_file_never_divides_by_zero_or_passes_100() {
        let p = Progress::new(&b""[..], 0, "x", None::<Vec<u8>>);
        assert!(p.line().contains(" 0%"));
        let mut q = Progress::new(&b""[..], 10, "x", None::<Vec<u8>>);
        q.read = 50;
        assert!(q.line().contains(" 100%"));
    }
}
