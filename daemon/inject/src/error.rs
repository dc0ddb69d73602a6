//! The errors of probing and injecting: each says what failed and what to
//! do, and tells the caller whether the target was touched.

use std::io;
use std::time::Duration;

/// Why an attach (or the end of a synchronous session) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InjectError {
    /// The target cannot be profiled this way (not a process, a zombie,
    /// traced, statically linked, another allocator, no usable client
    /// library...); nothing was touched. The message says why and what to do.
    #[error("{0}")]
    Refused(String),
    /// No permission to read or trace the target; the message says what is
    /// needed (user, Yama's `ptrace_scope`, `CAP_SYS_PTRACE`).
    #[error("{0}")]
    Permission(String),
    /// The target exited while we were attaching.
    #[error("process {pid} exited during the attach")]
    Exited {
        /// The target.
        pid: u32,
    },
    /// No thread was at a safe point before the timeout; the target was
    /// left as it was.
    #[error(
        "no thread of process {pid} was at a safe point to load the profiler within \
         {:.1}s (a thread inside malloc, the dynamic loader, fork or thread creation \
         could deadlock); the target was left as it was. Last seen: {last_seen}",
        timeout.as_secs_f64()
    )]
    NoSafePoint {
        /// The target.
        pid: u32,
        /// How long threads were tried.
        timeout: Duration,
        /// Each thread's last reason, `thread TID: why; ...`.
        last_seen: String,
    },
    /// A step failed after a thread was stopped (a call that crashed, timed
    /// out or returned an error); the message says what state the thread
    /// and the library were left in.
    #[error("{0}")]
    CallFailed(String),
    /// Reading a file or a `/proc` entry failed.
    #[error("{context}")]
    Io {
        /// What was being read.
        context: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A system call on a thread of the target (ptrace, wait) failed.
    #[error(transparent)]
    Os(#[from] io::Error),
}

impl InjectError {
    /// An [`InjectError::Io`] with its context.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        InjectError::Io {
            context: context.into(),
            source,
        }
    }

    /// Whether this is a system call that found the thread gone (`ESRCH`).
    pub(crate) fn thread_gone(&self) -> bool {
        matches!(self, InjectError::Os(e) if e.raw_os_error() == Some(libc::ESRCH))
    }
}

/// The result type of this crate.
pub type Result<T, E = InjectError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn io_errors_keep_their_cause() {
        let e = InjectError::io(
            "reading /proc/1/maps",
            io::Error::from_raw_os_error(libc::EACCES),
        );
        assert_eq!(e.to_string(), "reading /proc/1/maps");
        let cause = e.source().expect("the io error is the source");
        assert!(cause.to_string().contains("Permission denied"), "{cause}");
        assert!(!e.thread_gone());
        assert!(InjectError::Os(io::Error::from_raw_os_error(libc::ESRCH)).thread_gone());
    }
}
