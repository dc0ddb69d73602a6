//! How a session reaches the program's malloc calls, and the core's
//! `Frontend` for glibc.
//!
//! A preloaded library interposes: its exported hooks already are the
//! program's malloc, and a session needs nothing more. A library loaded
//! later (attach), or preloaded after another allocator, does not (see
//! `interpose`): before it connects, a session resolves the originals of
//! the hook table (refusing an allocator built into the executable), then
//! patches every loaded object's GOT (`got`), keeps patching objects
//! loaded meanwhile (`newobjects`), and restores every slot at the end.

use heapprofd_client_core::frontend::{Frontend, Refusal};

use crate::hooktable::HOOKS;
use crate::{got, hooks, interpose, newobjects, originals};

/// The glibc front-end, registered by the constructor.
pub(crate) static GLIBC: Frontend = Frontend {
    before_connect: start,
    after_session: end,
    tick_ms,
    tick: newobjects::poll,
    after_sample: newobjects::catch_up,
};

/// Whether a session can reach the program's calls (always when the
/// library interposes; by patching unless the executable has its own
/// allocator built in). Call with the guard held.
pub(crate) fn allocator_ok() -> bool {
    if !interpose::needs_patching() {
        return true;
    }
    originals::resolve(&[&HOOKS]);
    originals::refusal(&hooks::MALLOC).is_none()
}

/// Before a session connects: patch, if the library does not interpose.
pub(crate) fn start() -> Result<(), Refusal> {
    if !interpose::needs_patching() {
        return Ok(());
    }
    // Objects loaded since the constructor (libstdc++ by a dlopen).
    originals::resolve(&[&HOOKS]);
    if let Some(r) = originals::refusal(&hooks::MALLOC) {
        return Err(r);
    }
    got::lock().start(&HOOKS);
    Ok(())
}

/// After a session: put every patched slot back.
pub(crate) fn end() {
    got::lock().end();
}

fn tick_ms() -> Option<u16> {
    got::is_active().then_some(newobjects::POLL_MS)
}
