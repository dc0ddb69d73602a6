//! Recording the stack of a signal handler's interrupted context: the one
//! entry of the CPU-time timers' handler (`cputimer`), the exported
//! `heapprofd_request_stack`, and perf-event overflow signals.
//!
//! [`record_stack`] is async-signal-safe: it allocates nothing, takes no
//! lock a handler could deadlock on, and leaves `errno` as it found it.
//!
//! * The registers come from the handler's `ucontext` (the interrupted pc,
//!   sp and callee-saved registers), so the daemon's walk starts at the
//!   interrupted instruction, never in the handler (unbiased). A null
//!   `ucontext` takes the caller's own registers, flagged
//!   [`StackSampleHeader::FLAG_BIASED`].
//! * The thread's reentrancy guard is taken first: a signal that lands
//!   while the thread is inside the client (a sampled malloc holding the
//!   ring's spinlock, the watcher) records nothing and counts the sample
//!   lost, instead of spinning on a lock its own thread holds.
//! * The ring is written in drop mode whatever the session's mode: a full
//!   ring costs the sample (counted in the thread's `lost_dropped`, sent
//!   with its next sample), never a wait inside a handler. Losses count
//!   expirations: a dropped CPU signal that merged `k` overruns loses
//!   `1 + k` periods.
//! * The stack end is found without `pthread_getattr_np` (which
//!   allocates): the cached bounds when the thread has them, the main
//!   thread's from the constructor, else the start of glibc's static TLS
//!   area above the thread's frames (`pthread_self()` is the top of the
//!   stack block, the TLS area lies right below it), else the alternate
//!   signal stack.

use core::ffi::c_void;
use core::sync::atomic::Ordering;

use heapprofd_proto::wire::{MAX_REGS, RegisterFile, StackSampleHeader};
use heapprofd_shmem::WriteMode;

use crate::session::{self, Session};
use crate::state::mode;
use crate::threadslots::{GONE, claimed, count_lost, take_lost};
use crate::tls::{Guard, STACK_KNOWN, ThreadState};
use crate::{capture, errno, events};

/// [`record_stack`]'s result: recorded.
pub const RECORDED: i32 = 0;
/// No session is active (or it does not belong to this process).
pub const NOT_PROFILING: i32 = -1;
/// The thread was inside the client; counted lost.
pub const REENTERED: i32 = -2;
/// The ring was full (or refused the record); counted lost.
pub const DROPPED: i32 = -3;

/// What a sample is about: its tag, what it stands for, and the samples
/// lost just before it that the caller knows of.
#[derive(Debug, Clone, Copy)]
pub struct SampleKind {
    /// [`heapprofd_proto::wire::TAG_CPU_TIME`] or a program's tag.
    pub tag: u64,
    /// Nanoseconds of CPU, or the event's period (0 = the session's CPU
    /// period for CPU samples, 1 for others).
    pub period: u64,
    /// Timer overruns seen by the caller.
    pub lost_overrun: u32,
}

/// Records the stack of `ucontext` (a handler's third argument), or of the
/// caller when it is null. Returns [`RECORDED`] or a negative reason.
/// Async-signal-safe; `errno` is preserved.
#[inline(never)]
pub fn record_stack(ucontext: *const c_void, kind: SampleKind) -> i32 {
    let saved = errno::get();
    let r = record(ucontext, kind);
    errno::set(saved);
    r
}

fn record(ucontext: *const c_void, kind: SampleKind) -> i32 {
    let mode_word = mode().load(Ordering::Acquire);
    if mode_word < 2 || mode_word & 1 != 0 {
        return NOT_PROFILING;
    }
    let Some(g) = Guard::enter() else {
        // Inside the client: no TLS write (the guard's owner may be using
        // the thread's block); the tid costs a system call here.
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        count_lost(tid, kind.tag, 0, 1 + kind.lost_overrun);
        return REENTERED;
    };
    let st = g.thread();
    let tid = capture::tid(st);
    let Some(s) = session::acquire(mode_word) else {
        return NOT_PROFILING;
    };
    let r = if s.owns() {
        write_sample(s, st, tid, ucontext, kind)
    } else {
        NOT_PROFILING
    };
    session::release(s);
    r
}

fn write_sample(
    s: &Session,
    st: *mut ThreadState,
    tid: u32,
    ucontext: *const c_void,
    kind: SampleKind,
) -> i32 {
    if kind.tag != heapprofd_proto::wire::TAG_CPU_TIME
        && !events::ensure_sent(kind.tag, s.mode_word(), |rec| s.write_small_dropping(rec))
    {
        count_lost(tid, kind.tag, 0, 1 + kind.lost_overrun);
        return DROPPED;
    }
    let mut regs = [0u64; MAX_REGS];
    let mut flags = 0;
    let sp = if ucontext.is_null() {
        flags |= StackSampleHeader::FLAG_BIASED;
        capture::capture_regs(&mut regs)
    } else {
        // SAFETY: the caller passes the ucontext its handler received.
        unsafe { regs_of(ucontext, &mut regs) }
    };
    let stack_len = match signal_stack_end(st, tid, sp, s.pid) {
        Some(end) if end > sp => {
            let full = (end - sp) as usize;
            if full > s.max_stack {
                flags |= StackSampleHeader::FLAG_STACK_TRUNCATED;
                s.max_stack
            } else {
                full
            }
        }
        _ => {
            flags |= StackSampleHeader::FLAG_NO_STACK;
            0
        }
    };
    let (lost_overrun, lost_dropped) = take_lost(tid);
    // A CPU sample stands for the CPU the thread used since its previous
    // signal: the timer's period once, plus once per expiration the kernel
    // merged into this signal (it checks CPU timers at scheduler ticks, so
    // a period shorter than a tick expires several times per signal).
    let period = match kind.period {
        0 if kind.tag == heapprofd_proto::wire::TAG_CPU_TIME => s
            .cpu_period_ns()
            .saturating_mul(1 + u64::from(kind.lost_overrun)),
        0 => 1,
        p => p,
    };
    let header = StackSampleHeader {
        flags,
        tid,
        tag: kind.tag,
        timestamp_ns: clock_ns(libc::CLOCK_MONOTONIC),
        cpu_time_ns: clock_ns(libc::CLOCK_THREAD_CPUTIME_ID),
        period,
        lost_overrun: lost_overrun.saturating_add(kind.lost_overrun),
        lost_dropped,
        arch: capture::NATIVE_ARCH,
        stack_pointer: sp,
        stack_len: stack_len as u64,
        regs: RegisterFile(regs),
    };
    let mut fixed = [0u8; StackSampleHeader::ENCODED_LEN];
    header.encode_into(&mut fixed);
    let Ok(mut r) = s
        .rb()
        .begin_write(StackSampleHeader::ENCODED_LEN + stack_len, WriteMode::Drop)
    else {
        let lost = lost_dropped.saturating_add(1 + kind.lost_overrun);
        count_lost(tid, kind.tag, lost_overrun, lost);
        return DROPPED;
    };
    r.write_at(0, &fixed);
    // SAFETY: [sp, sp + stack_len) is the interrupted thread's live stack
    // (this thread's, below which the handler's frame sits), within the
    // bounds found above; the reservation has room for it after the header.
    unsafe {
        capture::copy_to_ring(
            r.as_mut_ptr().add(StackSampleHeader::ENCODED_LEN),
            sp as *const u8,
            stack_len,
        );
    }
    let wake = r.commit();
    // A broken socket is the watcher's to notice: no teardown in a handler.
    let _ = s.wake_if(wake);
    RECORDED
}

/// The process exits (the library's destructor, after the program's own
/// destructors): the losses of every thread still counted, which no
/// later sample of it will carry, go out on their own under the event of
/// each thread's last lost sample. Allocation-free.
pub fn send_losses_at_exit() {
    for s in claimed() {
        let tid = s.tid.load(Ordering::Acquire);
        if tid == 0 || tid == GONE {
            continue;
        }
        let (o, d) = (
            s.lost_overrun.swap(0, Ordering::Relaxed),
            s.lost_dropped.swap(0, Ordering::Relaxed),
        );
        if o != 0 || d != 0 {
            send_losses(tid, s.loss_tag.load(Ordering::Relaxed), o, d);
        }
    }
}

/// Sends the losses `tid` counted and no sample carried (the thread
/// exited, or the process exits), as a record flagged `FLAG_LOSSES_ONLY`
/// of event `tag`. Not from a handler; false if nothing could be written.
pub fn send_losses(tid: u32, tag: u64, lost_overrun: u32, lost_dropped: u32) -> bool {
    let mode_word = mode().load(Ordering::Acquire);
    if mode_word < 2 || mode_word & 1 != 0 {
        return false;
    }
    let Some(s) = session::acquire(mode_word) else {
        return false;
    };
    let header = StackSampleHeader {
        flags: StackSampleHeader::FLAG_LOSSES_ONLY | StackSampleHeader::FLAG_NO_STACK,
        tid,
        tag,
        timestamp_ns: clock_ns(libc::CLOCK_MONOTONIC),
        cpu_time_ns: 0,
        period: 0,
        lost_overrun,
        lost_dropped,
        arch: capture::NATIVE_ARCH,
        stack_pointer: 0,
        stack_len: 0,
        regs: RegisterFile([0; MAX_REGS]),
    };
    let mut fixed = [0u8; StackSampleHeader::ENCODED_LEN];
    header.encode_into(&mut fixed);
    let sent = s.owns() && s.write_small_dropping(&fixed);
    session::release(s);
    sent
}

/// The interrupted registers in DWARF numbering; returns the stack pointer.
///
/// # Safety
/// `uc` must point to a `ucontext_t` the kernel passed to a handler.
#[cfg(target_arch = "x86_64")]
unsafe fn regs_of(uc: *const c_void, regs: &mut [u64; MAX_REGS]) -> u64 {
    use heapprofd_proto::wire::x86_64 as r;
    // SAFETY: as documented.
    let g = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
    let get = |i: libc::c_int| g[i as usize] as u64;
    let pairs = [
        (0, libc::REG_RAX),
        (1, libc::REG_RDX),
        (2, libc::REG_RCX),
        (3, libc::REG_RBX),
        (4, libc::REG_RSI),
        (5, libc::REG_RDI),
        (6, libc::REG_RBP),
        (r::RSP, libc::REG_RSP),
        (8, libc::REG_R8),
        (9, libc::REG_R9),
        (10, libc::REG_R10),
        (11, libc::REG_R11),
        (12, libc::REG_R12),
        (13, libc::REG_R13),
        (14, libc::REG_R14),
        (15, libc::REG_R15),
        (r::RIP, libc::REG_RIP),
    ];
    for (slot, reg) in pairs {
        regs[slot] = get(reg);
    }
    regs[r::RSP]
}

/// The interrupted registers (x0..x30, sp, pc); returns the stack pointer.
///
/// # Safety
/// `uc` must point to a `ucontext_t` the kernel passed to a handler.
#[cfg(target_arch = "aarch64")]
unsafe fn regs_of(uc: *const c_void, regs: &mut [u64; MAX_REGS]) -> u64 {
    use heapprofd_proto::wire::aarch64 as r;
    // SAFETY: as documented.
    let m = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext };
    regs[..31].copy_from_slice(&m.regs);
    regs[r::SP] = m.sp;
    regs[r::PC] = m.pc;
    m.sp
}

/// The end of the stack `sp` is on, found without allocating (see the
/// module docs).
fn signal_stack_end(st: *mut ThreadState, tid: u32, sp: u64, pid: i32) -> Option<u64> {
    // SAFETY: the calling thread's own block, guard held.
    let (state, lo, hi) = unsafe { ((*st).stack_state, (*st).stack_lo, (*st).stack_hi) };
    if state == STACK_KNOWN && sp >= lo && sp < hi {
        return Some(hi);
    }
    if tid as i32 == pid {
        if let Some((lo, hi)) = capture::main_stack_bounds() {
            if sp >= lo && sp < hi {
                return Some(hi);
            }
        }
    } else if let Some(top) = capture::frames_top_below_tls() {
        // The thread's frames lie below its static TLS area; a stack is at
        // most this far from its top (a larger distance means `sp` is on
        // some other stack).
        if sp < top && top - sp <= MAX_THREAD_STACK {
            return Some(top);
        }
    }
    capture::altstack_end(sp)
}

/// Largest distance from a thread's stack pointer to its stack's top that
/// [`signal_stack_end`] accepts without known bounds.
const MAX_THREAD_STACK: u64 = 1 << 30;

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}
