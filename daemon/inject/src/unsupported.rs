//! `inject`/`detach` where the ptrace hijack is not written (it is
//! x86_64 code: registers, signal frame, system-call stub). Both refuse
//! with an error that says so; a preloaded dormant client can still be
//! woken with the activation signal ([`crate::signal_activate`]).

use crate::error::{InjectError, Result};
use crate::options::{InjectOptions, InjectReport};
use crate::probe::Target;

fn refuse(target: &Target) -> InjectError {
    InjectError::Refused(format!(
        "process {}: loading the client into a running process is only implemented on x86_64 \
         (this is {}); start the program with the client preloaded \
         (LD_PRELOAD=.../libheapprofd_client.so) and it can be woken instead",
        target.pid,
        std::env::consts::ARCH
    ))
}

/// Refuses: see the module docs.
pub fn inject(target: &Target, _opts: &InjectOptions) -> Result<InjectReport> {
    Err(refuse(target))
}

/// Refuses: see the module docs.
pub fn detach(target: &Target, _opts: &InjectOptions) -> Result<InjectReport> {
    Err(refuse(target))
}
