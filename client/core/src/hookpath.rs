//! What every front-end's allocation hooks do around their call to the real
//! allocator: the fast checks and the slow paths.
//!
//! A hook first loads the mode ([`mode`]: one relaxed load) and branches.
//! 0 means pass-through: the hook tail-calls the real allocator. While a
//! session is active:
//!
//! * allocation: [`skip`] accounts the size in the thread's sampler first (a
//!   TLS subtraction and compare); if the allocation is certainly not
//!   sampled, the hook tail-calls the real allocator (no stack frame of
//!   ours). Otherwise the hook calls the allocator and then [`on_alloc`]
//!   (registers, stack copy, ring buffer, free-set insert).
//! * free: [`may_be_sampled`] reads the free set's filter and one word of it
//!   (see `freeset`: no mode check; null filter without a session, all ones
//!   when every allocation is sampled); only a possibly sampled address goes
//!   to [`on_free`], which checks the mode, *before* the allocator gets the
//!   block back, so the address cannot be handed out again before the
//!   daemon hears of the free.
//! * realloc: the free of the old block (before the call), then an
//!   allocation of the new one.
//!
//! Nothing here panics: no indexing, no unwrap, no overflowing arithmetic
//! on these paths.

use core::ffi::c_void;
use core::sync::atomic::Ordering;

use crate::state::{MODE_PENDING, free_set};
use crate::tls::{self, Guard, ThreadState};
use crate::{activation, frontend, session};

/// The hooks' switch: 0 = pass through, else what [`skip`], [`on_alloc`]
/// and [`may_be_sampled`] take as `m`.
#[inline(always)]
pub fn mode() -> u64 {
    crate::state::mode().load(Ordering::Relaxed)
}

/// The allocation fast path with a session active (`m != 0`): true if this
/// allocation is certainly not sampled (its size is accounted), so the hook
/// can tail-call the allocator. False sends the hook to its slow path
/// ([`on_alloc`]), which also handles a pending activation, a thread not
/// set up for this session, and a thread inside the client.
#[inline(always)]
pub fn skip(size: usize, m: u64) -> bool {
    let st = tls::state();
    // SAFETY: `st` is this thread's TLS block.
    // An installed context the session's filters reject: one branch.
    unsafe {
        (*st).mode_seen == m
            && (*st).guard == 0
            && ((*st).context & 1 != 0 || (*st).sampler.skip(size))
    }
}

/// After an allocation of `size` bytes at `p` (null: failed) that [`skip`]
/// did not wave through.
#[cold]
#[inline(never)]
pub fn on_alloc(p: *mut c_void, size: usize, m: u64) {
    let st = tls::state();
    // SAFETY: `st` is this thread's TLS block.
    unsafe {
        if ((*st).mode_seen != m || (*st).guard != 0) && !thread_slow_path(st, m) {
            return;
        }
        if (*st).context & 1 != 0 {
            return;
        }
        let ss = (*st).sampler.sample_size(size);
        if ss != 0 && !p.is_null() {
            sampled(p, size, ss, m);
        }
    }
}

/// The thread's sampler is not set up for this session, the thread is
/// inside the client, or an activation is pending. True = go on sampling.
#[cold]
#[inline(never)]
fn thread_slow_path(st: *mut ThreadState, m: u64) -> bool {
    if Guard::held() {
        return false;
    }
    if m == MODE_PENDING {
        activation::start_pending();
        return false;
    }
    session::init_thread(st, m)
}

#[cold]
#[inline(never)]
fn sampled(p: *mut c_void, size: usize, ss: u64, m: u64) {
    let Some(g) = Guard::enter() else { return };
    session::sampled_alloc(&g, m, p, size, ss);
    (frontend::get().after_sample)();
}

/// Whether the block at `p` may be a sampled one whose free must be
/// recorded (then call [`on_free`] before freeing it). It reads only the
/// free set's filter (disarmed while no session wants frees), not the mode.
#[inline(always)]
pub fn may_be_sampled(p: *mut c_void) -> bool {
    free_set().may_hold(p as u64)
}

/// Records the free (or the free half of a realloc) of a block that
/// [`may_be_sampled`]. True if the block was a sampled one.
pub fn on_free(p: *mut c_void) -> bool {
    let m = mode();
    m > MODE_PENDING && !p.is_null() && session::sampled_free(m, p as u64)
}

/// Records the live block `p` of `size` bytes again, sampled with its real
/// size: a failed realloc kept the old block, whose free was already sent.
#[cold]
pub fn resample(p: *mut c_void, size: usize, m: u64) {
    if let Some(g) = Guard::enter() {
        session::sampled_alloc(&g, m, p, size, size as u64);
    }
}
