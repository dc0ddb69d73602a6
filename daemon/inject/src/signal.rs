//! Waking a preloaded, dormant client with the activation signal.

use crate::ACTIVATION_SIGNAL;
use crate::error::{InjectError, Result};

/// Wakes a preloaded, dormant client with `sigqueue(pid, 36, id)`.
pub fn signal_activate(pid: u32, id: u32) -> Result<()> {
    // nix has no sigqueue (and its `Signal` cannot name the real-time
    // signal 36), so this stays a raw call.
    // SAFETY: sigqueue with a plain integer value.
    let rc = unsafe {
        let v = libc::sigval {
            sival_ptr: id as usize as *mut libc::c_void,
        };
        libc::sigqueue(pid as i32, ACTIVATION_SIGNAL, v)
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            return Err(InjectError::Permission(format!(
                "no permission to signal process {pid}: run as its user (or root); {e}"
            )));
        }
        return Err(InjectError::io(
            format!("sending the activation signal to {pid}"),
            e,
        ));
    }
    Ok(())
}
