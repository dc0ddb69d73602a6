//! The one-line live status of `record` on a terminal (stderr): elapsed
//! time, processes, samples per second, live sampled bytes, unwind errors,
//! dropped records.
//!
//! A line redrawn with `\r` mixes with anything else written to the same
//! terminal (`...dropped 0program output line 1`), and `record` cannot
//! know when the profiled program writes. So the line is drawn only when
//! nothing else writes there: `record -- CMD` shares its terminal with
//! CMD (CMD inherits stdout and stderr), so it shows no live line, only
//! the summary at the end; `record --pid` shows it unless the target's
//! stdout or stderr is that same terminal ([`terminal_shared_with`]).

use std::io::{IsTerminal, Write};
use std::os::unix::fs::MetadataExt;
use std::time::Instant;

use heapprofd_report::human_bytes;

use super::{Counters, Counters as C};

/// Whether a live status line may be drawn on stderr, given whether
/// something else writes to that terminal (see the module docs).
pub fn status_line_allowed(stderr_is_terminal: bool, terminal_shared: bool) -> bool {
    stderr_is_terminal && !terminal_shared
}

/// Whether our stderr is a terminal that process `pid` also writes to
/// (its fd 1 or 2 is the same character device).
pub fn terminal_shared_with(pid: u32) -> bool {
    if !std::io::stderr().is_terminal() {
        return false;
    }
    let Ok(ours) = std::fs::metadata("/proc/self/fd/2") else {
        return true;
    };
    [1, 2].iter().any(|fd| {
        std::fs::metadata(format!("/proc/{pid}/fd/{fd}"))
            .is_ok_and(|m| m.rdev() == ours.rdev() && m.dev() == ours.dev())
    })
}

/// The one-line live status on a terminal (stderr); nothing when not a terminal.
#[derive(Debug)]
pub struct StatusLine {
    enabled: bool,
    shown: bool,
    last_samples: u64,
    last_time: Option<Instant>,
}

impl StatusLine {
    pub fn new(enabled: bool) -> Self {
        StatusLine {
            enabled,
            shown: false,
            last_samples: 0,
            last_time: None,
        }
    }

    pub fn update(&mut self, c: &Counters, started: Instant) {
        if !self.enabled {
            return;
        }
        let samples = C::get(&c.samples);
        let now = Instant::now();
        let rate = match self.last_time {
            Some(t) => {
                (samples - self.last_samples) as f64 / now.duration_since(t).as_secs_f64().max(1e-3)
            }
            None => 0.0,
        };
        self.last_samples = samples;
        self.last_time = Some(now);
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K[heapprofd-rs {:>5.1}s] {} processes | {:.0} samples/s | live sampled {} | unwind errors {} | dropped {}",
            started.elapsed().as_secs_f64(),
            C::get(&c.sessions),
            rate,
            human_bytes(C::get(&c.live_bytes)),
            C::get(&c.unwind_errors),
            C::get(&c.dropped),
        );
        let _ = err.flush();
        self.shown = true;
    }

    pub fn clear(&mut self) {
        if self.shown {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
            self.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_status_line_on_a_shared_terminal() {
        assert!(!status_line_allowed(true, true));
        assert!(!status_line_allowed(false, false));
        assert!(status_line_allowed(true, false));
        // Not a terminal (the test's stderr is captured): nothing shared.
        if !std::io::stderr().is_terminal() {
            assert!(!terminal_shared_with(std::process::id()));
        }
    }
}
