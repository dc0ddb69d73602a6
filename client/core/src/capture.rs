//! Capturing the registers and finding the stack to copy at a sample.
//!
//! The registers are read with inline assembly in the function that takes
//! the sample, so the instruction pointer, stack pointer and callee-saved
//! registers agree with that function's unwind information (the daemon
//! unwinds from there and drops the client's own frames by address).
//!
//! The stack copied is `[sp, end of the thread's stack)`, where the end
//! leaves out what is known not to hold frames (see [`set_main_stack`] and
//! `pthread_stack`). A thread's bounds
//! are computed once and cached in its TLS block: the main thread's from the
//! `[stack]` mapping read in the constructor, other threads' with
//! `pthread_getattr_np` (which allocates, so it runs under the guard). If the
//! stack pointer is outside the cached bounds, the thread is on a signal
//! alternate stack (`sigaltstack`), whose end is used instead. If nothing
//! fits, the sample carries registers only.

use core::sync::atomic::{AtomicU64, Ordering};
use heapprofd_proto::wire::{Arch, MAX_REGS};

use crate::tls::{STACK_FAILED, STACK_KNOWN, STACK_UNKNOWN, ThreadState};

/// Main thread stack bounds found by the constructor (0, 0 = unknown).
static MAIN_STACK_LO: AtomicU64 = AtomicU64::new(0);
static MAIN_STACK_HI: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" {
    /// The stack pointer at process entry (`&argc`), exported by ld.so.
    static __libc_stack_end: *const libc::c_void;
}

/// Records the main thread's stack mapping (constructor).
///
/// The copy stops a little above `__libc_stack_end` (the process's first
/// stack pointer, where argc sits) rather than at the end of the mapping:
/// everything above it is argv, the environment and the aux vector, never a
/// frame, and can be many KiB.
pub fn set_main_stack(range: Option<(u64, u64)>) {
    let Some((lo, mut hi)) = range else { return };
    // SAFETY: reading a pointer-sized variable ld.so initialises before any
    // constructor runs.
    let entry_sp = unsafe { core::ptr::addr_of!(__libc_stack_end).read() } as u64;
    if entry_sp > lo && entry_sp < hi {
        hi = hi.min(entry_sp.saturating_add(64));
    }
    // The mapping grows down on demand: allow for the whole stack rlimit.
    // SAFETY: getrlimit writes into the struct we pass.
    let mut rl: libc::rlimit = unsafe { core::mem::zeroed() };
    // SAFETY: valid out-pointer.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut rl) } == 0 {
        (rl.rlim_cur as u64).clamp(hi - lo, 1 << 30)
    } else {
        8 << 20
    };
    MAIN_STACK_LO.store(hi.saturating_sub(limit), Ordering::Relaxed);
    MAIN_STACK_HI.store(hi, Ordering::Relaxed);
}

/// Size of glibc's static TLS area (thread descriptor included), 0 = unknown.
static TLS_STATIC_SIZE: AtomicU64 = AtomicU64::new(0);

/// Asks glibc for the size of the static TLS area at the top of every
/// thread's stack block (constructor, guard held: `dlvsym` may allocate).
///
/// glibc starts a thread's frames right below that area, so a stack copy
/// can stop there instead of at the end of the block (saving ~2 KiB per
/// sample: the TLS surplus reserved for `dlopen`). The function is
/// `GLIBC_PRIVATE` but long-lived (the sanitizers use it the same way); if
/// it is missing, copies stop at our own TLS block instead.
pub fn resolve_tls_static_size() {
    #[cfg(target_env = "gnu")]
    // SAFETY: dlvsym with valid NUL-terminated strings; the function, if
    // found, has this signature in every glibc that exports it.
    unsafe {
        let f = libc::dlvsym(
            libc::RTLD_DEFAULT,
            c"_dl_get_tls_static_info".as_ptr(),
            c"GLIBC_PRIVATE".as_ptr(),
        );
        if f.is_null() {
            return;
        }
        let f: unsafe extern "C" fn(*mut usize, *mut usize) = core::mem::transmute(f);
        let (mut size, mut align) = (0usize, 0usize);
        f(&mut size, &mut align);
        if size > 0 && size < (1 << 20) {
            TLS_STATIC_SIZE.store(size as u64, Ordering::Relaxed);
        }
    }
}

/// The kernel thread id, cached in the thread's state.
#[inline]
pub(crate) fn tid(st: *mut ThreadState) -> u32 {
    // SAFETY: `st` is the calling thread's own TLS block.
    unsafe {
        if (*st).tid == 0 {
            (*st).tid = libc::syscall(libc::SYS_gettid) as u32;
        }
        (*st).tid
    }
}

/// This thread's stack bounds, computed on first use. Call with the guard held.
pub(crate) fn thread_stack(st: *mut ThreadState) -> Option<(u64, u64)> {
    // SAFETY: `st` is the calling thread's own TLS block.
    unsafe {
        match (*st).stack_state {
            STACK_KNOWN => return Some(((*st).stack_lo, (*st).stack_hi)),
            STACK_FAILED => return None,
            _ => {}
        }
        debug_assert_eq!((*st).stack_state, STACK_UNKNOWN);
        let bounds = if tid(st) as i32 == libc::getpid() {
            let (lo, hi) = (
                MAIN_STACK_LO.load(Ordering::Relaxed),
                MAIN_STACK_HI.load(Ordering::Relaxed),
            );
            (hi != 0).then_some((lo, hi))
        } else {
            pthread_stack()
        };
        match bounds {
            Some((lo, hi)) => {
                (*st).stack_lo = lo;
                (*st).stack_hi = hi;
                (*st).stack_state = STACK_KNOWN;
            }
            None => (*st).stack_state = STACK_FAILED,
        }
        bounds
    }
}

/// A non-main thread's stack from glibc (allocates: the guard must be held).
fn pthread_stack() -> Option<(u64, u64)> {
    // SAFETY: standard use of the pthread attribute API on the calling thread.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = core::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 || addr.is_null() || size == 0 {
            return None;
        }
        let lo = addr as u64;
        let block_end = lo.checked_add(size as u64)?;
        Some((lo, frames_top(lo, block_end)))
    }
}

/// The main thread's stack bounds found by the constructor, if any.
pub(crate) fn main_stack_bounds() -> Option<(u64, u64)> {
    let (lo, hi) = (
        MAIN_STACK_LO.load(Ordering::Relaxed),
        MAIN_STACK_HI.load(Ordering::Relaxed),
    );
    (hi != 0).then_some((lo, hi))
}

/// Where the frames of a non-main thread whose stack block is
/// `[lo, block_end)` end: below glibc's thread descriptor and static TLS.
pub(crate) fn frames_top(lo: u64, block_end: u64) -> u64 {
    let mut hi = block_end;
    // glibc keeps the thread descriptor and the static TLS area at the
    // top of the stack block, above every frame. Our own TLS block is
    // in that area: the copy never needs to go past it.
    let own_tls = crate::tls::state() as u64;
    if own_tls > lo && own_tls < hi {
        hi = own_tls;
    }
    // Better: the frames start right below the whole static TLS area
    // (64 bytes of slack for glibc's alignment rounding).
    let tls_size = TLS_STATIC_SIZE.load(Ordering::Relaxed);
    if tls_size != 0 {
        let top = block_end.saturating_sub(tls_size).saturating_add(64);
        if top > lo && top < hi {
            hi = top;
        }
    }
    hi
}

/// The stack range to copy for a sample taken at `sp`: the end of whichever
/// stack `sp` is on, or `None` if unknown.
pub(crate) fn stack_end_for(st: *mut ThreadState, sp: u64) -> Option<u64> {
    if let Some((lo, hi)) = thread_stack(st) {
        if sp >= lo && sp < hi {
            return Some(hi);
        }
    }
    // Not on the thread's stack: a signal handler on an alternate stack?
    altstack_end(sp)
}

/// A glibc thread's frames lie below its static TLS area, at the top of
/// its stack block, where our own TLS block is: an upper bound of the
/// thread's frames found without allocating (a non-main thread only; the
/// main thread's TLS is elsewhere).
pub(crate) fn frames_top_below_tls() -> Option<u64> {
    let top = crate::tls::state() as u64;
    (top != 0).then_some(top)
}

/// The end of the alternate signal stack if `sp` is on it.
pub(crate) fn altstack_end(sp: u64) -> Option<u64> {
    // SAFETY: sigaltstack with a null new stack only reads the current one.
    unsafe {
        let mut ss: libc::stack_t = core::mem::zeroed();
        if libc::sigaltstack(core::ptr::null(), &mut ss) == 0 && ss.ss_flags & libc::SS_ONSTACK != 0
        {
            let lo = ss.ss_sp as u64;
            let hi = lo.saturating_add(ss.ss_size as u64);
            if sp >= lo && sp < hi {
                return Some(hi);
            }
        }
    }
    None
}

/// How many registers [`capture_unwind_regs`] takes.
#[cfg(target_arch = "x86_64")]
pub(crate) const UNWIND_REGS: usize = 8;
/// How many registers [`capture_unwind_regs`] takes.
#[cfg(target_arch = "aarch64")]
pub(crate) const UNWIND_REGS: usize = 14;
/// Where [`capture_unwind_regs`] puts the stack pointer.
#[cfg(target_arch = "x86_64")]
pub(crate) const SP_INDEX: usize = 2;
/// Where [`capture_unwind_regs`] puts the stack pointer.
#[cfg(target_arch = "aarch64")]
pub(crate) const SP_INDEX: usize = 12;

/// The architecture this library is built for.
pub(crate) const NATIVE_ARCH: Arch = match Arch::native() {
    Some(a) => a,
    None => panic!("unsupported architecture"),
};
// [`capture_unwind_regs`] takes the wire's unwind registers, in its order.
const _: () = assert!(NATIVE_ARCH.unwind_slots().len() == UNWIND_REGS);
const _: () = assert!(NATIVE_ARCH.unwind_slots()[SP_INDEX] == NATIVE_ARCH.sp_ip_slots().0);

/// The registers an unwinder starts from, as [`capture_regs`] fills them,
/// in a compact array: a malloc sample's array sits in the frame that takes
/// it, which is part of the stack the sample copies, and the wire's 34
/// slots (272 bytes, all but a few zero, different at every sample) made up
/// a third of a one-stack sample's fresh bytes. Returns the stack pointer.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn capture_unwind_regs(regs: &mut [u64; UNWIND_REGS]) -> u64 {
    // SAFETY: stores registers into the 8-slot array; touches nothing else.
    unsafe {
        core::arch::asm!(
            "mov qword ptr [{r}], rbx",
            "mov qword ptr [{r} + 8], rbp",
            "mov qword ptr [{r} + 16], rsp",
            "mov qword ptr [{r} + 24], r12",
            "mov qword ptr [{r} + 32], r13",
            "mov qword ptr [{r} + 40], r14",
            "mov qword ptr [{r} + 48], r15",
            "lea {t}, [rip]",
            "mov qword ptr [{r} + 56], {t}",
            r = in(reg) regs.as_mut_ptr(),
            t = out(reg) _,
            options(nostack, preserves_flags),
        );
    }
    regs[SP_INDEX]
}

/// The registers an unwinder starts from (x19..x30, sp, pc) in a compact
/// array (see the x86_64 version). Returns the stack pointer.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub(crate) fn capture_unwind_regs(regs: &mut [u64; UNWIND_REGS]) -> u64 {
    // SAFETY: stores registers into the 14-slot array; touches nothing else.
    unsafe {
        core::arch::asm!(
            "stp x19, x20, [{r}]",
            "stp x21, x22, [{r}, #16]",
            "stp x23, x24, [{r}, #32]",
            "stp x25, x26, [{r}, #48]",
            "stp x27, x28, [{r}, #64]",
            "stp x29, x30, [{r}, #80]",
            "mov {t}, sp",
            "str {t}, [{r}, #96]",
            "adr {t}, .",
            "str {t}, [{r}, #104]",
            r = in(reg) regs.as_mut_ptr(),
            t = out(reg) _,
            options(nostack, preserves_flags),
        );
    }
    regs[SP_INDEX]
}

/// Registers at the capture point, in DWARF numbering (see `proto::wire`):
/// [`capture_unwind_regs`]' registers put in their slots of `regs` (the
/// others are left as they are). Returns the stack pointer.
#[inline(always)]
pub(crate) fn capture_regs(regs: &mut [u64; MAX_REGS]) -> u64 {
    let mut c = [0u64; UNWIND_REGS];
    let sp = capture_unwind_regs(&mut c);
    NATIVE_ARCH.place_unwind_regs(&c, regs);
    sp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{Guard, state};

    #[test]
    fn registers_point_into_this_function_and_stack() {
        let mut regs = [0u64; MAX_REGS];
        let sp = capture_regs(&mut regs);
        let local = 0u8;
        let here = &local as *const u8 as u64;
        // sp is below our local variables, and within a few KiB of them.
        assert!(
            sp <= here && here - sp < 64 * 1024,
            "sp {sp:#x} local {here:#x}"
        );
        let arch = heapprofd_proto::wire::Arch::native().expect("supported arch");
        let (sp_slot, ip_slot) = arch.sp_ip_slots();
        assert_eq!(regs[sp_slot], sp);
        assert_ne!(regs[ip_slot], 0);
    }

    #[test]
    fn the_compact_capture_fills_the_slots_the_full_one_does() {
        // The slots the full capture writes (a sentinel elsewhere).
        let mut full = [u64::MAX; MAX_REGS];
        let sp_full = capture_regs(&mut full);
        let mut compact = [u64::MAX; UNWIND_REGS];
        let sp = capture_unwind_regs(&mut compact);
        assert_eq!(sp, sp_full, "same frame, same stack pointer");
        let written: Vec<usize> = (0..MAX_REGS).filter(|&i| full[i] != u64::MAX).collect();
        let slots = NATIVE_ARCH.unwind_slots();
        assert_eq!(written, slots, "the full capture writes these slots");
        assert!(compact.iter().all(|&v| v != u64::MAX), "{compact:x?}");
        let mut file = [0u64; MAX_REGS];
        NATIVE_ARCH.place_unwind_regs(&compact, &mut file);
        let arch = heapprofd_proto::wire::Arch::native().expect("supported arch");
        let (sp_slot, ip_slot) = arch.sp_ip_slots();
        assert_eq!(file[sp_slot], sp);
        assert!(file[ip_slot] != 0);
        for (i, slot) in slots.iter().enumerate() {
            assert_eq!(file[*slot], compact[i]);
        }
        let others = (0..MAX_REGS).filter(|i| !slots.contains(i));
        assert!(others.map(|i| file[i]).all(|v| v == 0));
    }

    #[test]
    fn static_tls_trim_keeps_the_frames() {
        resolve_tls_static_size();
        std::thread::spawn(|| {
            let _g = Guard::enter().unwrap();
            let mut regs = [0u64; MAX_REGS];
            let sp = capture_regs(&mut regs);
            let end = stack_end_for(state(), sp).expect("bounds");
            // Below our TLS block, above this frame and its callers' (the
            // thread's first frames are a few hundred bytes above sp here).
            assert!(end <= state() as u64);
            assert!(end > sp + 64, "sp {sp:#x} end {end:#x}");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn worker_thread_bounds_contain_the_stack_pointer() {
        std::thread::spawn(|| {
            let _g = Guard::enter().unwrap();
            let mut regs = [0u64; MAX_REGS];
            let sp = capture_regs(&mut regs);
            let end = stack_end_for(state(), sp).expect("bounds");
            assert!(end > sp && end - sp < 8 << 20);
            // Cached the second time.
            // SAFETY: our own block.
            assert_eq!(unsafe { (*state()).stack_state }, STACK_KNOWN);
            assert_eq!(stack_end_for(state(), sp), Some(end));
        })
        .join()
        .unwrap();
    }
}

/// Smallest stack copy done with non-temporal stores (see [`copy_to_ring`]).
pub(crate) const NT_COPY_MIN: usize = 16 * 1024;

/// Copies `len` bytes of stack into the ring buffer.
///
/// The destination is cold: the ring is megabytes long and the reader, on
/// another core, last touched it. On x86_64, copies of at least
/// [`NT_COPY_MIN`] bytes use non-temporal stores, which write whole lines
/// without first reading them in; an `sfence` then orders them before the
/// caller's commit (a release store, which alone does not order
/// non-temporal stores). Measured with `heapprofd-client-bench` into a cold
/// ring: 33 KiB copies went from 3.7 to 2.4 us per sample, while 3 KiB
/// copies got slower (0.6 to 1.2 us: the `sfence` waits for the
/// write-combining buffers), and 8.5 KiB ones did not change.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes, and the two
/// ranges must not overlap.
#[inline]
pub(crate) unsafe fn copy_to_ring(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= NT_COPY_MIN {
        use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // SAFETY: every access below stays inside the two ranges the caller
        // vouches for; SSE2 is part of the x86_64 baseline.
        unsafe {
            let head = dst.align_offset(16).min(len);
            core::ptr::copy_nonoverlapping(src, dst, head);
            let mut off = head;
            while off + 64 <= len {
                let s = src.add(off).cast::<__m128i>();
                let d = dst.add(off).cast::<__m128i>();
                let (a, b, c, e) = (
                    _mm_loadu_si128(s),
                    _mm_loadu_si128(s.add(1)),
                    _mm_loadu_si128(s.add(2)),
                    _mm_loadu_si128(s.add(3)),
                );
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
                off += 64;
            }
            core::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
            _mm_sfence();
        }
        return;
    }
    // SAFETY: as documented for the caller.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, len) };
}

#[cfg(test)]
mod copy_tests {
    use super::*;

    #[test]
    fn copy_to_ring_copies_every_length_and_alignment() {
        let src: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let n = NT_COPY_MIN;
        for len in [
            0usize,
            1,
            15,
            16,
            63,
            1024,
            n - 1,
            n,
            n + 1,
            n + 100,
            39_990,
        ] {
            for shift in 0..16 {
                let mut dst = vec![0u8; 40_100];
                // SAFETY: both ranges are inside the vectors.
                unsafe { copy_to_ring(dst.as_mut_ptr().add(shift), src.as_ptr().add(1), len) };
                assert_eq!(
                    &dst[shift..shift + len],
                    &src[1..1 + len],
                    "len {len} shift {shift}"
                );
                assert!(dst[..shift].iter().all(|&b| b == 0));
                assert!(dst[shift + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
