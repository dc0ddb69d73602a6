//! What the core asks of its front-end: the interface a front-end (the
//! glibc interposer in `client/`, later the bionic one in `android/`)
//! registers once, before any session can start, with [`install`].
//!
//! The core never names a front-end module. It knows nothing of how the
//! program's allocations reach the hooks (symbol interposition, patched
//! GOTs, a malloc dispatch table) nor of the allocator the hooks forward
//! to. Two things a front-end provides are not in this table:
//!
//! * **the real allocator.** The front-end's hooks call the allocator that
//!   would have served the program without the client, and the front-end
//!   installs a Rust `#[global_allocator]` that calls it directly: the
//!   core's own allocations (a session struct, the watcher's job) must never
//!   enter the hooks.
//! * **the hooks themselves**, built on `hookpath` (the checks and slow
//!   paths every front-end's hooks share).
//!
//! Every callback here runs with the reentrancy guard held (so glibc code
//! that allocates passes through the hooks) and must not panic.

use core::sync::atomic::{AtomicPtr, Ordering};

/// Why a front-end refused to start a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Logged to stderr after `heapprofd-rs: `.
    pub message: &'static [u8],
    /// What the daemon is told instead of a session
    /// ([`connect::notify_unprofilable`](crate::connect::notify_unprofilable)).
    pub unprofilable: heapprofd_proto::wire::Unprofilable,
}

/// The callbacks of a front-end. All of them are plain functions so that
/// the table can be a `static`.
#[derive(Debug)]
pub struct Frontend {
    /// On the connecting thread (or the thread of a synchronous attach),
    /// before the handshake: make the program's allocations reach the hooks
    /// (glibc: patch the GOTs when the library does not interpose), so that
    /// once the daemon sees the session every allocation is seen. An error
    /// refuses the session.
    pub before_connect: fn() -> Result<(), Refusal>,
    /// After the session ended (or failed to start), on the same thread:
    /// undo `before_connect`.
    pub after_session: fn(),
    /// How often, in milliseconds, the watcher wants to call `tick` while a
    /// session runs; `None` when there is nothing to do (it then sleeps up
    /// to a second at a time).
    pub tick_ms: fn() -> Option<u16>,
    /// The watcher's periodic turn (glibc: patch objects loaded meanwhile).
    pub tick: fn(),
    /// After each sampled allocation, on the allocating thread (glibc: patch
    /// the objects a `dlopen` just added). Called often: keep it to a load
    /// and a branch in the common case.
    pub after_sample: fn(),
}

fn never_refuse() -> Result<(), Refusal> {
    Ok(())
}
fn nothing() {}
fn no_tick() -> Option<u16> {
    None
}

/// The front-end of a library whose hooks are reached without help
/// (what the core uses until [`install`] is called).
pub static PASSIVE: Frontend = Frontend {
    before_connect: never_refuse,
    after_session: nothing,
    tick_ms: no_tick,
    tick: nothing,
    after_sample: nothing,
};

static INSTALLED: AtomicPtr<Frontend> =
    AtomicPtr::new(&PASSIVE as *const Frontend as *mut Frontend);

/// Registers the front-end. Call once, from the library's constructor,
/// before anything can start a session.
pub fn install(f: &'static Frontend) {
    INSTALLED.store(f as *const Frontend as *mut Frontend, Ordering::Release);
}

/// The registered front-end.
#[inline]
pub(crate) fn get() -> &'static Frontend {
    // SAFETY: only ever set to a `&'static Frontend`.
    unsafe { &*INSTALLED.load(Ordering::Acquire) }
}
