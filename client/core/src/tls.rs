//! Per-thread state in initial-exec TLS, and the reentrancy guard.
//!
//! Rust's `thread_local!` compiles to global-dynamic TLS in a shared object:
//! every access calls `__tls_get_addr`, which may call `malloc` (DTV growth
//! after a `dlopen`), which would re-enter our hooks. So the client keeps its
//! per-thread state in one 88-byte block of its own, declared in `.tbss` with
//! `global_asm!` and reached with the initial-exec sequence
//! (`%fs:0 + GOTTPOFF` on x86_64, `tpidr_el0 + GOTTPREL` on aarch64). The
//! linker marks the library `STATIC_TLS`; glibc's surplus static TLS has room
//! for a block this small even when the library is `dlopen`ed later.
//!
//! ```text
//! offset  field                      written by
//!   0     sampler (40 bytes)         the thread's own hooks
//!  40     mode_seen: u64             mode word the sampler was set up for
//!  48     stack_lo:  u64             cached stack bounds (computed once,
//!  56     stack_hi:  u64               under the guard)
//!  64     tid: u32, guard: u8, stack_state: u8, interval_shift: u8 (the
//!           sampler's interval is the session's times 2^shift, see
//!           `adaptive`), 1 byte padding
//!  72     context:   u64             the installed user context, `id << 1 |
//!                                      excluded` (see `contexts`)
//!  80     snapshot:  u64             the thread's last sampled stack (see
//!                                      `stackreuse`: 0 none yet, 1 never)
//! ```

use crate::sampler::Sampler;

/// `ThreadState::stack_state`: bounds not computed yet.
pub(crate) const STACK_UNKNOWN: u8 = 0;
/// `ThreadState::stack_state`: `stack_lo..stack_hi` are valid.
pub(crate) const STACK_KNOWN: u8 = 1;
/// `ThreadState::stack_state`: the bounds could not be found.
pub(crate) const STACK_FAILED: u8 = 2;

/// The client's per-thread state; lives in the TLS block, zero-initialised.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct ThreadState {
    /// This thread's Poisson sampler.
    pub sampler: Sampler,
    /// The mode word the sampler was initialised for (0 = never).
    pub mode_seen: u64,
    /// Lowest address of the thread's stack.
    pub stack_lo: u64,
    /// One past the highest address of the thread's stack.
    pub stack_hi: u64,
    /// Kernel thread id (0 = not fetched yet).
    pub tid: u32,
    /// Non-zero while a hook of this thread is inside the client.
    pub guard: u8,
    /// `STACK_*`.
    pub stack_state: u8,
    /// The sampler's interval is the session's `libc.malloc` interval
    /// times `2^interval_shift` (see `adaptive`).
    pub interval_shift: u8,
    _pad: u8,
    /// The installed user context: `id << 1 | excluded` (see `contexts`).
    pub context: u64,
    /// The thread's last sampled stack (see `stackreuse`).
    pub snapshot: u64,
}

/// Bytes of the TLS block.
pub(crate) const TLS_SIZE: usize = 88;
const _: () = assert!(core::mem::size_of::<ThreadState>() == TLS_SIZE);
const _: () = assert!(core::mem::align_of::<ThreadState>() <= 8);

// The symbol is global (so `asm!` in any codegen unit can name it) but hidden,
// and the version script keeps it out of the dynamic symbol table.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl heapprofd_rs_tls",
    ".hidden heapprofd_rs_tls",
    ".type heapprofd_rs_tls, @tls_object",
    ".size heapprofd_rs_tls, 88",
    "heapprofd_rs_tls:",
    ".zero 88",
    ".popsection",
);

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",%nobits",
    ".p2align 3",
    ".globl heapprofd_rs_tls",
    ".hidden heapprofd_rs_tls",
    ".type heapprofd_rs_tls, %tls_object",
    ".size heapprofd_rs_tls, 88",
    "heapprofd_rs_tls:",
    ".zero 88",
    ".popsection",
);

/// This thread's state block.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn state() -> *mut ThreadState {
    let p: *mut ThreadState;
    // SAFETY: reads the thread pointer and the block's offset from the GOT;
    // touches no other memory. `add` changes flags, so flags are not preserved.
    unsafe {
        core::arch::asm!(
            "mov {p}, qword ptr fs:0",
            "add {p}, qword ptr [rip + heapprofd_rs_tls@GOTTPOFF]",
            p = out(reg) p,
            options(nostack, pure, readonly),
        );
    }
    p
}

/// This thread's state block.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub(crate) fn state() -> *mut ThreadState {
    let p: *mut ThreadState;
    // SAFETY: reads the thread pointer and the block's offset from the GOT.
    unsafe {
        core::arch::asm!(
            "mrs {p}, tpidr_el0",
            "adrp {t}, :gottprel:heapprofd_rs_tls",
            "ldr {t}, [{t}, :gottprel_lo12:heapprofd_rs_tls]",
            "add {p}, {p}, {t}",
            p = out(reg) p,
            t = out(reg) _,
            options(nostack, pure, readonly, preserves_flags),
        );
    }
    p
}

/// Proof that this thread is inside the client. While it is alive, every hook
/// on this thread passes straight through to glibc, so nothing the client
/// does (including glibc functions that allocate, such as
/// `pthread_getattr_np`) can re-enter the sampling code.
#[derive(Debug)]
pub struct Guard {
    st: *mut ThreadState,
}

impl Guard {
    /// Enters the client, or returns `None` if this thread already is inside.
    #[inline(always)]
    pub fn enter() -> Option<Guard> {
        let st = state();
        // SAFETY: `st` is this thread's TLS block; only this thread (and its
        // signal handlers, which run to completion on top of us) touches it.
        unsafe {
            let g = core::ptr::addr_of_mut!((*st).guard);
            if g.read_volatile() != 0 {
                return None;
            }
            g.write_volatile(1);
        }
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        Some(Guard { st })
    }

    /// Whether this thread is inside the client.
    #[inline(always)]
    pub fn held() -> bool {
        // SAFETY: as in `enter`.
        unsafe { core::ptr::addr_of!((*state()).guard).read_volatile() != 0 }
    }

    /// This thread's state (valid for as long as the thread lives).
    #[inline(always)]
    pub(crate) fn thread(&self) -> *mut ThreadState {
        self.st
    }
}

impl Drop for Guard {
    #[inline(always)]
    fn drop(&mut self) {
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        // SAFETY: as in `enter`.
        unsafe { core::ptr::addr_of_mut!((*self.st).guard).write_volatile(0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_is_per_thread_and_not_reentrant() {
        let g = Guard::enter().expect("first entry");
        assert!(Guard::held());
        assert!(Guard::enter().is_none());
        // Another thread has its own block.
        std::thread::spawn(|| {
            assert!(!Guard::held());
            let _g = Guard::enter().expect("other thread");
            // SAFETY: our own block.
            unsafe { (*state()).tid = 7 };
        })
        .join()
        .unwrap();
        // SAFETY: our own block.
        assert_eq!(unsafe { (*state()).tid }, 0);
        drop(g);
        assert!(!Guard::held());
        assert!(Guard::enter().is_some());
    }
}
