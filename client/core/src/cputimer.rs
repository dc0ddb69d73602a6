//! CPU-time profiling: one POSIX timer per thread on the thread's own CPU
//! clock, delivering a real-time signal to that thread (`SIGEV_THREAD_ID`)
//! every `ClientConfig::cpu_period_ns` of CPU it uses; the handler records
//! the interrupted stack ([`stacksample::record_stack`]).
//!
//! * **Clock.** A thread's CPU clock is named from its tid as the kernel
//!   does (`((~tid) << 3) | 6`: `CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED`, as
//!   async-profiler and JDK's JEP 509 use), so the watcher can create the
//!   timer of any thread of the process. A thread blocked or asleep uses no
//!   CPU and gets no signal.
//! * **Threads.** The watcher arms every thread of `/proc/self/task` when
//!   the session starts and scans again every [`SCAN_MS`] ms while it
//!   runs: new threads are armed, the timers of threads that exited are
//!   deleted. Threads made by `pthread_create` while a session runs arm
//!   themselves first ([`thread_started`], called by the glibc front-end's
//!   `pthread_create`, which wraps the start routine), so none of their
//!   CPU is missed; the scans catch the others (raw `clone`, a client
//!   loaded by an attach, which interposes nothing). The watcher itself
//!   blocks every signal and is never armed.
//! * **Signal.** The first of `__SIGRTMIN + 5` ..= `__SIGRTMIN + 12`
//!   (glibc: 37..=44) whose disposition is `SIG_DFL` when the first CPU
//!   session starts, next to heapprofd's activation signal `__SIGRTMIN + 4`
//!   and chosen the same way (a program's own handler is never replaced);
//!   none free: no CPU samples. `SA_SIGINFO | SA_RESTART`: system calls the
//!   signal interrupts restart, so the program's `EINTR` behaviour stays as
//!   it was. Signals a thread blocks stay pending until it unblocks them.
//! * **Losses** per thread: timer overruns (`timer_getoverrun`, expirations
//!   merged while the last signal was pending) and samples the handler
//!   could not write (ring full, thread inside the client), kept in the
//!   thread's slot and sent with its next sample.
//! * **fork/exec.** Timers are not inherited by a fork child (the slots
//!   are forgotten there, as the session is); exec destroys them and the
//!   new image's session arms its own.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

use heapprofd_proto::wire::{PerfEvent, TAG_CPU_TIME};

use crate::stacksample::{SampleKind, record_stack, send_losses};
use crate::threadslots::{GONE, SLOTS, Slot, TABLE, slot_of};
use crate::{errno, perfevent};

/// `si_code`s of `F_SETSIG` signals (`POLL_IN`, `POLL_HUP`).
const POLL_IN: c_int = 1;
const POLL_HUP: c_int = 6;

/// How often the watcher looks for new threads while CPU profiling runs.
pub const SCAN_MS: u16 = 50;
/// Offsets from the kernel's `__SIGRTMIN` (32) tried for the signal.
const SIGNAL_OFFSETS: core::ops::RangeInclusive<c_int> = 5..=12;

/// The installed signal, 0 = none yet, -1 = none could be had.
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Scan counter (only the watcher scans).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The signal CPU timers deliver, installing the handler on first use;
/// `None` if every candidate is the program's.
pub fn signal() -> Option<c_int> {
    match SIGNAL.load(Ordering::Acquire) {
        0 => {}
        -1 => return None,
        s => return Some(s),
    }
    let base = libc::SIGRTMIN() - 2; // the kernel's __SIGRTMIN (glibc keeps 2)
    for off in SIGNAL_OFFSETS {
        let sig = base + off;
        if sig > libc::SIGRTMAX() {
            break;
        }
        // SAFETY: querying and setting a disposition with valid structs.
        unsafe {
            let mut old: libc::sigaction = core::mem::zeroed();
            if libc::sigaction(sig, core::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                continue;
            }
            let mut sa: libc::sigaction = core::mem::zeroed();
            sa.sa_sigaction = on_cpu_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, core::ptr::null_mut()) == 0 {
                SIGNAL.store(sig, Ordering::Release);
                return Some(sig);
            }
        }
    }
    SIGNAL.store(-1, Ordering::Release);
    None
}

/// The timers' handler: async-signal-safe, errno preserved.
extern "C" fn on_cpu_signal(_sig: c_int, info: *mut libc::siginfo_t, uc: *mut c_void) {
    let saved = errno::get();
    // SAFETY: SA_SIGINFO: the kernel passes a valid siginfo.
    let (code, value) = unsafe {
        match info.as_ref() {
            Some(i) => (i.si_code, i.si_value().sival_ptr as usize),
            None => (0, 0),
        }
    };
    // A perf event's overflow (`F_SETSIG`: a `POLL_*` code).
    if (code == POLL_IN || code == POLL_HUP)
        && let Some((tag, period)) = perfevent::current()
    {
        let kind = SampleKind {
            tag,
            period,
            lost_overrun: 0,
        };
        record_stack(uc, kind);
    }
    // Only our timers' signals (someone else's `kill` of it is ignored).
    if code == libc::SI_TIMER && (1..=SLOTS).contains(&value) {
        let s = &TABLE[value - 1];
        let overrun = if s.armed.load(Ordering::Acquire) {
            // SAFETY: a timer id the watcher created (a deleted one makes
            // the call fail, read as no overrun).
            unsafe { libc::timer_getoverrun(s.timer.load(Ordering::Relaxed) as libc::timer_t) }
        } else {
            0
        };
        let kind = SampleKind {
            tag: TAG_CPU_TIME,
            period: 0,
            lost_overrun: overrun.max(0) as u32,
        };
        record_stack(uc, kind);
    }
    errno::set(saved);
}

/// What the watcher arms each thread with.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// CPU timer period in ns (0: none).
    pub cpu_period_ns: u64,
    /// A perf event and its period.
    pub event: Option<(PerfEvent, u64)>,
}

impl Plan {
    /// The plan of a session's configuration (`None`: nothing to arm).
    pub fn of(cpu_period_ns: u64, perf_event: u32, perf_period: u64) -> Option<Plan> {
        let event = PerfEvent::from_u32(perf_event).map(|e| (e, perf_period.max(1)));
        (cpu_period_ns > 0 || event.is_some()).then_some(Plan {
            cpu_period_ns,
            event,
        })
    }
}

/// Arms `tid` (its timer, its perf event) unless it is; marks it seen by
/// scan `generation`.
fn arm(tid: u32, plan: &Plan, sig: c_int, generation: u64) {
    let Some((idx, s)) = slot_of(tid, true) else {
        return;
    };
    s.seen.store(generation, Ordering::Relaxed);
    // One armer at a time: the watcher's scan and the thread's own start
    // (`thread_started`) may meet here.
    if s.busy.swap(true, Ordering::Acquire) {
        return;
    }
    arm_slot(idx, s, tid, plan, sig);
    s.busy.store(false, Ordering::Release);
}

fn arm_slot(idx: usize, s: &Slot, tid: u32, plan: &Plan, sig: c_int) {
    if let Some((event, period)) = plan.event {
        perfevent::open(s, tid, event, period, sig);
    }
    let period_ns = plan.cpu_period_ns;
    if period_ns == 0 || s.armed.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: plain timer creation with valid structs; the clock id names
    // a thread of this process.
    unsafe {
        let mut sev: libc::sigevent = core::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = sig;
        sev.sigev_value = libc::sigval {
            sival_ptr: (idx + 1) as *mut c_void,
        };
        sev.sigev_notify_thread_id = tid as c_int;
        let clock = ((!(tid as libc::clockid_t)) << 3) | 6;
        let mut timer: libc::timer_t = core::ptr::null_mut();
        if libc::timer_create(clock, &mut sev, &mut timer) != 0 {
            return; // the thread exited meanwhile
        }
        let ts = libc::timespec {
            tv_sec: (period_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (period_ns % 1_000_000_000) as libc::c_long,
        };
        let its = libc::itimerspec {
            it_interval: ts,
            it_value: ts,
        };
        s.timer.store(timer as usize, Ordering::Relaxed);
        s.armed.store(true, Ordering::Release);
        if libc::timer_settime(timer, 0, &its, core::ptr::null_mut()) != 0 {
            s.armed.store(false, Ordering::Release);
            libc::timer_delete(timer);
        }
    }
}

fn disarm(s: &Slot) {
    if s.armed.swap(false, Ordering::AcqRel) {
        // SAFETY: a timer we created and have not deleted.
        unsafe { libc::timer_delete(s.timer.load(Ordering::Relaxed) as libc::timer_t) };
    }
    perfevent::close(s);
}

/// The watcher's turn: arms every thread of the process but `own_tid`
/// as `plan` says, disarms the threads that exited. False if nothing can
/// be armed here (no free signal).
pub fn scan(plan: &Plan, own_tid: u32) -> bool {
    let Some(sig) = signal() else { return false };
    perfevent::configure(plan.event.map(|e| e.0), plan.event.map_or(1, |e| e.1));
    CPU_PERIOD.store(plan.cpu_period_ns, Ordering::Relaxed);
    ACTIVE.store(true, Ordering::Release);
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed) + 1;
    let complete = for_each_task(|tid| {
        if tid != own_tid {
            arm(tid, plan, sig, generation);
        }
    });
    if complete {
        for s in TABLE.iter() {
            let armed = s.armed.load(Ordering::Relaxed) || s.perf_fd.load(Ordering::Relaxed) >= 0;
            // Not listed: gone, or started after the listing was read (and
            // armed by itself): `tgkill(.., 0)` tells them apart.
            if armed && s.seen.load(Ordering::Relaxed) != generation && !alive(s) {
                disarm(s);
                send_exited_losses(s, plan);
                s.tid.store(GONE, Ordering::Release);
            }
        }
    }
    true
}

/// The losses an exited thread counted after its last sample, sent on
/// their own (of its CPU-time event, else its perf event's).
fn send_exited_losses(s: &Slot, plan: &Plan) {
    let (o, d) = (
        s.lost_overrun.swap(0, Ordering::Relaxed),
        s.lost_dropped.swap(0, Ordering::Relaxed),
    );
    if o == 0 && d == 0 {
        return;
    }
    let tag = match (plan.cpu_period_ns, plan.event) {
        (0, Some((e, _))) => e.tag(),
        _ => TAG_CPU_TIME,
    };
    send_losses(s.tid.load(Ordering::Relaxed), tag, o, d);
}

/// Whether the slot's thread still runs.
fn alive(s: &Slot) -> bool {
    let tid = s.tid.load(Ordering::Acquire);
    // SAFETY: signal 0 only checks that the thread exists.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::pid_t, 0) };
    rc == 0 || crate::errno::get() != libc::ESRCH
}

/// Deletes every timer and closes every event (the session ended), and
/// empties the table.
pub fn disarm_all() {
    ACTIVE.store(false, Ordering::SeqCst);
    perfevent::configure(None, 1);
    for s in crate::threadslots::claimed() {
        disarm(s);
        s.reset();
    }
}

/// Whether threads arm themselves when they start (a session with a plan
/// runs), and the CPU period they arm with.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static CPU_PERIOD: AtomicU64 = AtomicU64::new(0);

/// In a forked child: no session samples its threads (the parent's timers
/// and events are not inherited; its slots are forgotten by
/// `threadslots::forget_in_child`).
pub(crate) fn forget_in_child() {
    ACTIVE.store(false, Ordering::SeqCst);
    perfevent::configure(None, 1);
}

/// Whether a thread starting now should call [`thread_started`] (one
/// load: the front-end's `pthread_create` wraps the start routine only
/// then).
#[inline]
pub fn wants_thread_start() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// A new thread, before its start routine: arms its own timer and event
/// (so none of its CPU is missed, as the watcher's next scan would) and
/// computes its stack bounds while it may allocate (the handler then has
/// them). Not async-signal-safe.
pub fn thread_started() {
    if !ACTIVE.load(Ordering::Acquire) {
        return;
    }
    let Some(g) = crate::tls::Guard::enter() else {
        return;
    };
    let st = g.thread();
    let _ = crate::capture::thread_stack(st);
    let tid = crate::capture::tid(st);
    let Some(sig) = signal() else { return };
    let plan = Plan {
        cpu_period_ns: CPU_PERIOD.load(Ordering::Relaxed),
        event: perfevent::current_event(),
    };
    arm(tid, &plan, sig, GENERATION.load(Ordering::Relaxed));
    // The session ended meanwhile: nobody else would delete these.
    if !ACTIVE.load(Ordering::SeqCst)
        && let Some((_, s)) = slot_of(tid, false)
    {
        disarm(s);
    }
}

/// Calls `f` with every tid of `/proc/self/task` (raw `getdents64`, a
/// buffer on the stack). False if the directory could not be read whole.
fn for_each_task(mut f: impl FnMut(u32)) -> bool {
    // SAFETY: open with a valid NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/task".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 4096];
    let complete = loop {
        // SAFETY: reading directory entries into our buffer.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if n < 0 {
            break false;
        }
        if n == 0 {
            break true;
        }
        let mut off = 0usize;
        while off + 19 < n as usize {
            // linux_dirent64: ino u64, off i64, reclen u16, type u8, name.
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 || off + reclen > n as usize {
                break;
            }
            let name = &buf[off + 19..off + reclen];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some(tid) = parse_tid(name) {
                f(tid);
            }
            off += reclen;
        }
    };
    // SAFETY: closing the descriptor we opened.
    unsafe { libc::close(fd) };
    complete
}

fn parse_tid(name: &[u8]) -> Option<u32> {
    if name.is_empty() || name.len() > 10 {
        return None;
    }
    let mut v = 0u64;
    for &b in name {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(b - b'0');
    }
    u32::try_from(v).ok().filter(|&t| t != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_listed_with_our_own_tid() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        let mut seen = Vec::new();
        assert!(for_each_task(|t| seen.push(t)));
        assert!(seen.contains(&me), "{seen:?} lacks {me}");
        assert_eq!(parse_tid(b"123"), Some(123));
        assert_eq!(parse_tid(b"."), None);
        assert_eq!(parse_tid(b"99999999999"), None);
    }
}
