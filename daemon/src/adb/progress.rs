//! Progress on stderr while the device profiles: one line when it starts
//! (what, on which device, until when), then, on a terminal, the elapsed
//! time updated in place; one line when it stops.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// The progress of one profile.
#[derive(Debug)]
pub struct Progress {
    start: Instant,
    duration: Option<Duration>,
    tty: bool,
    last: u64,
}

impl Progress {
    /// Says that the profile started.
    pub fn start(serial: &str, what: &str, duration: Option<Duration>) -> Progress {
        let duration = duration.filter(|d| !d.is_zero());
        let until = match duration {
            Some(d) => format!("for {:?} (Ctrl-C ends it sooner)", d),
            None => "until Ctrl-C".into(),
        };
        eprintln!("profiling {what} on {serial} {until}");
        Progress {
            start: Instant::now(),
            duration,
            tty: std::io::stderr().is_terminal(),
            last: u64::MAX,
        }
    }

    /// Updates the elapsed time (on a terminal, once a second).
    pub fn tick(&mut self) {
        let secs = self.start.elapsed().as_secs();
        if !self.tty || secs == self.last {
            return;
        }
        self.last = secs;
        let of = self
            .duration
            .map(|d| format!(" of {}s", d.as_secs()))
            .unwrap_or_default();
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r  {secs}s{of} ");
        let _ = e.flush();
    }

    /// Says that the profile is being stopped (Ctrl-C).
    pub fn stopping(&mut self) {
        self.end_line();
        eprintln!("stopping the profile on the device (the trace is written)...");
    }

    /// Ends the in-place line.
    pub fn end_line(&mut self) {
        if self.tty && self.last != u64::MAX {
            eprintln!();
            self.last = u64::MAX;
        }
    }
}

/// What the options profile, for the progress line.
pub fn what(args: &super::args::AndroidArgs) -> String {
    let mut v = Vec::new();
    if args.all {
        v.push("every profileable process".to_string());
    }
    if !args.name.is_empty() {
        v.push(args.name.join(","));
    }
    if !args.pid.is_empty() {
        let p: Vec<String> = args.pid.iter().map(|p| format!("pid {p}")).collect();
        v.push(p.join(","));
    }
    v.join(" and ")
}
