//! The client's two switches: the mode, which every hook reads, and
//! `STATE`, the connection state machine.
//!
//! ```text
//!            signal 36            next allocation           handshake ok
//!   IDLE ---------------> PENDING ---------------> CONNECTING ------------> ACTIVE
//!    ^  \______________________________________________/  |  failed           |
//!    |    HEAPPROFD_SOCKET set (constructor), attach       v                   |
//!    +------------------------------------------------- IDLE <----------------+
//!        teardown: daemon closed the socket or set shutdown, a write failed,
//!        block-mode timeout, fork (in the child)
//! ```
//!
//! The hooks only read the mode ([`mode`]): 0 = pass through (idle, connecting, torn
//! down), [`MODE_PENDING`] = an activation is pending, anything else = the
//! `mode_word` of the active session (even, unique per session), which the
//! per-thread sampler compares against to know it belongs to this session.
//! Whoever starts a session claims it by moving `STATE` to [`CONNECTING`]
//! with a compare-exchange (from `IDLE`, or from `PENDING` to take over a
//! pending activation); only the winner connects.

use core::sync::atomic::{AtomicU32, AtomicU64};

use crate::freeset::FreeSet;

/// What every hook reads, alone on its cache line so that no write to a
/// neighbouring variable (a statistics counter, the session pointer) ever
/// invalidates it in the other cores' caches.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Hot {
    /// The hooks' switch: 0 = pass through; [`MODE_PENDING`]; else a
    /// session's word.
    pub mode: AtomicU64,
    /// The set of live sampled addresses, mapped on the first activation.
    pub free_set: FreeSet,
}

/// The hooks' switch and the free set (see [`Hot`]); reach it with
/// [`hot`]. Public only for a front-end's assembly hooks, which read the
/// mode word by name (`sym`): it is the first field, at offset 0.
pub static HOT: Hot = Hot {
    mode: AtomicU64::new(0),
    free_set: FreeSet::new(),
};

const _: () = assert!(core::mem::offset_of!(Hot, mode) == 0);
// The hooks' switch and the free set share one cache line.
const _: () = assert!(core::mem::size_of::<Hot>() == 64);

/// The mode while an activation signal waits for the next allocation.
pub const MODE_PENDING: u64 = 1;

/// No session, none requested.
pub const IDLE: u32 = 0;
/// An activation was requested (signal); the next allocation starts it.
pub const PENDING: u32 = 1;
/// Someone claimed the session and is connecting.
pub const CONNECTING: u32 = 2;
/// A session is active.
pub const ACTIVE: u32 = 3;
/// The connection state (see the module diagram).
pub static STATE: AtomicU32 = AtomicU32::new(IDLE);

/// [`HOT`], reached with one PC-relative address computation wherever the
/// code is inlined. (A front-end's hooks are compiled in the front-end's
/// crate; a plain reference to a static of this crate from there goes
/// through the GOT, an extra load on every hook.)
#[inline(always)]
pub fn hot() -> &'static Hot {
    #[cfg(target_arch = "x86_64")]
    {
        let p: *const Hot;
        // SAFETY: computes the address of HOT; touches no memory.
        unsafe {
            core::arch::asm!(
                "lea {p}, [rip + {hot}]",
                p = out(reg) p,
                hot = sym HOT,
                options(pure, nomem, nostack, preserves_flags),
            );
            &*p
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        &HOT
    }
}

/// The hooks' switch, [`Hot::mode`].
#[inline(always)]
pub fn mode() -> &'static AtomicU64 {
    &hot().mode
}

/// The free set (empty and unmapped until a session starts).
#[inline(always)]
pub fn free_set() -> &'static FreeSet {
    &hot().free_set
}
