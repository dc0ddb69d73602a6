//! The one-line live status of `record` on a terminal (stderr): elapsed
//! time, processes, samples per second, live sampled bytes, unwind errors,
//! dropped records.

use std::io::Write;
use std::time::Instant;

use heapprofd_report::human_bytes;

use super::{Counters, Counters as C};

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
