//! The one logging facade of the daemon and its libraries: the `log` crate,
//! with this small logger writing each message to stderr as
//! `heapprofd-rs: MESSAGE` (warnings carry their own `warning:` in the
//! text). Debug messages are shown with `HEAPPROFD_DEBUG`. Library code
//! only calls `log::info!` and friends; the binary installs the logger.

use std::io::Write;

use log::{Level, LevelFilter, Log, Metadata, Record};

/// Writes every enabled record to stderr with the program's name.
#[derive(Debug)]
struct StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // One write per message (stderr is unbuffered), so messages of
        // several threads do not interleave within a line.
        let line = format!("heapprofd-rs: {}\n", record.args());
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// The level shown: debug messages only with `HEAPPROFD_DEBUG`.
pub fn level(debug: bool) -> LevelFilter {
    if debug {
        LevelFilter::Debug
    } else {
        LevelFilter::Info
    }
}

/// Installs the logger (once; later calls keep the first logger but set
/// the level).
pub fn init(debug: bool) {
    static LOGGER: StderrLogger = StderrLogger;
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level(debug));
}

/// Whether debug messages are shown (they cost something to prepare).
pub fn debug_enabled() -> bool {
    log::log_enabled!(Level::Debug)
}
