//! What an injection is asked to do ([`InjectOptions`]) and what it did
//! ([`InjectReport`]): the same on every architecture, whether or not the
//! hijack exists there.

use std::path::PathBuf;
use std::time::Duration;

/// How to inject.
#[derive(Debug, Clone)]
pub struct InjectOptions {
    /// The client library (absolute path; loaded unless already mapped).
    pub lib: PathBuf,
    /// The socket id passed to the client (`/tmp/heapprofd-rs-<euid>/<id>.sock`).
    pub id: u32,
    /// How long to look for a thread at a safe point.
    pub safe_point_timeout: Duration,
    /// How long `dlopen` and the attach entry may take before we give up.
    pub call_timeout: Duration,
    /// Unwind tables of the target's modules (the daemon's cache, so its
    /// sessions reuse what the safe-point checks parsed).
    pub module_cache: std::sync::Arc<heapprofd_unwinder::ModuleCache>,
    /// The profile samples threads (`--cpu-time`, `--event`): the client
    /// always gets its thread, even in a single-threaded process (no
    /// synchronous session), so that its scans of `/proc/self/task` arm
    /// the threads the program starts later (each from the first scan
    /// after its start, within 50 ms). A heap-only profile of a
    /// single-threaded process stays synchronous.
    pub samples_threads: bool,
    /// Tests only: the step to stall at (`HEAPPROFD_ATTACH_TEST_STALL`,
    /// see `stall.rs`).
    pub test_stall: Option<String>,
}

/// What an injection did.
#[derive(Debug, Clone)]
pub struct InjectReport {
    /// The thread that ran the calls.
    pub tid: u32,
    /// How long that thread was stopped (from the interrupt's stop to the
    /// detach), including the calls.
    pub pause: Duration,
    /// Threads stopped and checked before one was safe (1 = the first).
    pub attempts: u32,
    /// Whether `dlopen` was called (false: the client was already loaded).
    pub loaded: bool,
    /// Time spent preparing (symbols, unwind tables) before stopping anything.
    pub prepare: Duration,
    /// Why the threads that were refused were refused (the last reason of each).
    pub refused: Vec<(u32, String)>,
    /// Where the pause went: (step, duration), in order.
    pub steps: Vec<(&'static str, Duration)>,
    /// The session was started synchronously, without a client thread (the
    /// target had one thread and the profile samples none, see
    /// [`InjectOptions::samples_threads`]): end it with [`crate::detach`].
    pub sync: bool,
}
