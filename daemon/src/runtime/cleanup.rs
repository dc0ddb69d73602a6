//! What `record` must undo even when it dies of a bug: the binary is built
//! with `panic = "abort"`, so no destructor runs on a panic, and without
//! this a panic would leave the profiled command running without its
//! parent and the daemon's socket file behind.
//!
//! `record` registers the socket path and, once spawned, the command's
//! pid; a panic hook (installed once, chained before the default one)
//! kills the command (SIGKILL: `record` is about to abort and cannot wait
//! for it) and removes the socket. Ordinary error paths do not need it:
//! they return, the daemon's `Drop` removes the socket, and `record`
//! waits for the command as it does after `--duration`.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};

static CHILD: AtomicI32 = AtomicI32::new(0);
static SOCKET: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Installs the panic hook (once per process).
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            run();
            default(info);
        }));
    });
}

/// Registers the daemon's socket path.
pub fn set_socket(path: PathBuf) {
    if let Ok(mut s) = SOCKET.lock() {
        *s = Some(path);
    }
}

/// Registers the spawned command (0: none).
pub fn set_child(pid: u32) {
    CHILD.store(i32::try_from(pid).unwrap_or(0), Ordering::SeqCst);
}

/// Kills the registered command and removes the socket (what the panic
/// hook does).
pub fn run() {
    let pid = CHILD.swap(0, Ordering::SeqCst);
    if pid > 0 {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // try_lock: the hook may run while this thread holds the lock.
    if let Ok(mut s) = SOCKET.try_lock()
        && let Some(p) = s.take()
    {
        let _ = std::fs::remove_file(p);
    }
}
