//! `record --event`: a software perf event per thread (page faults,
//! context switches, CPU or task clock) whose overflow, every
//! `ClientConfig::perf_period` events, sends the thread the same signal as
//! the CPU timers (`fcntl` `F_SETSIG` + `F_SETOWN_EX` to the thread, the
//! event file in `O_ASYNC` mode); the handler records the interrupted stack
//! as a sample of the event's tag ([`PerfEvent::tag`]) through the same
//! path ([`crate::stacksample::record_stack`]).
//!
//! The watcher opens the events when it arms the timers (`cputimer`),
//! closes them with the timers; the descriptors are close-on-exec. Only
//! software events: these machines have no hardware counters. An overflow
//! queues one real-time signal; a thread that keeps the signal blocked
//! through more overflows than `RLIMIT_SIGPENDING` would get `SIGIO`
//! instead (the kernel's rule for `F_SETSIG`), so `record --event` wants
//! periods that overflow rarely against that limit.

use core::ffi::c_int;
use core::sync::atomic::{AtomicU64, Ordering};

use heapprofd_proto::wire::PerfEvent;

use crate::threadslots::Slot;

/// `fcntl` commands and the owner type glibc's headers give them.
const F_SETSIG: c_int = 10;
const F_SETOWN_EX: c_int = 15;
const F_OWNER_TID: c_int = 0;
/// `PERF_TYPE_SOFTWARE`, `PERF_FLAG_FD_CLOEXEC`.
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// `perf_event_attr` flag bits: exclude_kernel, exclude_hv.
const EXCLUDE_KERNEL: u64 = 1 << 5;
const EXCLUDE_HV: u64 = 1 << 6;

/// `struct perf_event_attr` up to `sample_max_stack` (`PERF_ATTR_SIZE_VER5`).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved: u16,
}
const _: () = assert!(core::mem::size_of::<PerfEventAttr>() == 112);

#[repr(C)]
struct FOwnerEx {
    kind: c_int,
    pid: c_int,
}

/// The session's event tag and period (0: none), read by the handler.
static TAG: AtomicU64 = AtomicU64::new(0);
static PERIOD: AtomicU64 = AtomicU64::new(0);

/// Sets the event the threads sample on (`None`: none).
pub(crate) fn configure(event: Option<PerfEvent>, period: u64) {
    PERIOD.store(period.max(1), Ordering::Relaxed);
    TAG.store(event.map_or(0, PerfEvent::tag), Ordering::Release);
}

/// The tag and period of the signal's samples (the handler's), if an event
/// is configured.
pub(crate) fn current() -> Option<(u64, u64)> {
    match TAG.load(Ordering::Acquire) {
        0 => None,
        tag => Some((tag, PERIOD.load(Ordering::Relaxed))),
    }
}

/// The configured event and its period.
pub(crate) fn current_event() -> Option<(PerfEvent, u64)> {
    let (tag, period) = current()?;
    PerfEvent::of_tag(tag).map(|e| (e, period))
}

/// Opens `event` for thread `tid`, overflowing every `period` events
/// with signal `sig` to that thread; the slot keeps the descriptor.
pub(crate) fn open(s: &Slot, tid: u32, event: PerfEvent, period: u64, sig: c_int) {
    if s.perf_fd.load(Ordering::Relaxed) >= 0 {
        return;
    }
    let attr = PerfEventAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: core::mem::size_of::<PerfEventAttr>() as u32,
        config: event.sw_config(),
        sample_period: period.max(1),
        flags: EXCLUDE_KERNEL | EXCLUDE_HV,
        wakeup_events: 1,
        ..PerfEventAttr::default()
    };
    // SAFETY: perf_event_open with a valid attribute block; the fcntls
    // act on the descriptor it returned, which we own.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            tid as libc::pid_t,
            -1 as c_int,
            -1 as c_int,
            PERF_FLAG_FD_CLOEXEC,
        ) as c_int;
        if fd < 0 {
            return; // the thread exited, or no permission
        }
        let owner = FOwnerEx {
            kind: F_OWNER_TID,
            pid: tid as c_int,
        };
        let ok = libc::fcntl(fd, F_SETOWN_EX, &owner as *const FOwnerEx) == 0
            && libc::fcntl(fd, F_SETSIG, sig) == 0
            && libc::fcntl(fd, libc::F_SETFL, libc::O_ASYNC) == 0;
        if !ok {
            libc::close(fd);
            return;
        }
        s.perf_fd.store(fd, Ordering::Release);
    }
}

/// Closes the slot's event, if it has one.
pub(crate) fn close(s: &Slot) {
    let fd = s.perf_fd.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: a descriptor we opened and nobody else closes.
        unsafe { libc::close(fd) };
    }
}
