//! The stack-request API's in-process walk: `heapprofd_walk_stack` and
//! `heapprofd_walk_prepare` (exported; declared in `include/heapprofd.h`,
//! wrapped by the `heapprofd-api` crate).
//!
//! `heapprofd_walk_stack(ucontext, callbacks, user)` walks a stack
//! synchronously, in the calling thread, and reports it through the
//! callbacks: `begin(thread, biased)`, `frame(type, pc)` from the innermost
//! frame outwards, then exactly one of `end(thread)` or
//! `failure(thread, reason)`. With a `ucontext` (a signal handler's third
//! argument) the walk starts at the interrupted instruction (unbiased);
//! with NULL it starts at the caller of `heapprofd_walk_stack` (biased).
//! The exported symbol is a few instructions of assembly that pass the
//! caller's return address, stack pointer and frame pointer to
//! [`walk_entry`].
//!
//! Async-signal-safe: the tables (`walktables`) and the rule caches are
//! made by `heapprofd_walk_prepare` (outside any handler); a walk only
//! reads them, takes a free cache with a compare-exchange, reads memory
//! only within the walked stack (`heapprofd_client_core::walkbounds`) and
//! the loaded objects' unwind sections, allocates nothing, takes no lock
//! and keeps `errno`.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use framehop::{Error, FrameAddress, Unwinder};
use heapprofd_client_core::errno;
use heapprofd_client_core::tls::Guard;
use heapprofd_client_core::walkbounds::walk_bounds;

use crate::walktables::{self, ArchRegs, Unavailable, WalkCache};

/// `HEAPPROFD_FRAME_UNKNOWN`: a pc in no loaded object and no perf map
/// range (JIT code not in the map, or a corrupt return address).
pub(crate) const FRAME_UNKNOWN: c_int = 0;
/// `HEAPPROFD_FRAME_NATIVE`: a pc in a loaded object.
pub(crate) const FRAME_NATIVE: c_int = 1;
/// `HEAPPROFD_FRAME_JIT`: a pc in JIT code the perf map names.
pub(crate) const FRAME_JIT: c_int = 2;

/// `HEAPPROFD_WALK_NO_UNWIND_INFO`: a pc in no loaded object nor JIT range.
pub(crate) const NO_UNWIND_INFO: c_int = 1;
/// `HEAPPROFD_WALK_OUT_OF_BOUNDS`: a frame's unwind rule read outside the stack.
pub(crate) const OUT_OF_BOUNDS: c_int = 2;
/// `HEAPPROFD_WALK_DEPTH_LIMIT`: more than [`MAX_FRAMES`] frames.
pub(crate) const DEPTH_LIMIT: c_int = 3;
/// `HEAPPROFD_WALK_BAD_FRAME`: the unwind went backwards, did not advance or overflowed.
pub(crate) const BAD_FRAME: c_int = 4;
/// `HEAPPROFD_WALK_TABLES_UPDATING`: updates kept replacing the tables.
pub(crate) const TABLES_UPDATING: c_int = 5;
/// `HEAPPROFD_WALK_NO_STACK`: the stack pointer is on no stack known.
pub(crate) const NO_STACK: c_int = 6;
/// `HEAPPROFD_WALK_BUSY`: [`CACHES`] walks already in progress.
pub(crate) const BUSY: c_int = 7;
/// `HEAPPROFD_WALK_NOT_PREPARED`: `heapprofd_walk_prepare` never ran.
pub(crate) const NOT_PREPARED: c_int = 8;

/// Most frames delivered by one walk.
pub(crate) const MAX_FRAMES: usize = 256;
/// Walks that may run at once (each needs a rule cache).
pub(crate) const CACHES: usize = 8;

/// `heapprofd_walk_stack`'s results.
pub(crate) const WALK_ENDED: c_int = 0;
/// `failure` was called.
pub(crate) const WALK_FAILED: c_int = 1;
/// No callbacks given.
pub(crate) const WALK_EINVAL: c_int = -2;

/// `struct heapprofd_stack_callbacks`.
#[repr(C)]
#[derive(Debug)]
pub struct Callbacks {
    begin: Option<unsafe extern "C" fn(thread: u64, biased: c_int, user: *mut c_void)>,
    frame: Option<unsafe extern "C" fn(kind: c_int, pc: u64, user: *mut c_void)>,
    end: Option<unsafe extern "C" fn(thread: u64, user: *mut c_void)>,
    failure: Option<unsafe extern "C" fn(thread: u64, reason: c_int, user: *mut c_void)>,
}

static CACHE_PTRS: [AtomicPtr<WalkCache>; CACHES] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; CACHES];
static CACHE_BUSY: [AtomicBool; CACHES] = [const { AtomicBool::new(false) }; CACHES];

/// A rule cache taken by one walk (given back on drop).
struct CacheHold(usize);

impl CacheHold {
    fn take() -> Option<CacheHold> {
        (0..CACHES).find_map(|i| {
            let free = !CACHE_PTRS[i].load(Ordering::Acquire).is_null()
                && CACHE_BUSY[i]
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok();
            free.then_some(CacheHold(i))
        })
    }
    fn cache(&mut self) -> &mut WalkCache {
        // SAFETY: made by `prepare`, never freed; ours alone while busy.
        unsafe { &mut *CACHE_PTRS[self.0].load(Ordering::Acquire) }
    }
}

impl Drop for CacheHold {
    fn drop(&mut self) {
        CACHE_BUSY[self.0].store(false, Ordering::Release);
    }
}

/// In a fork child: the walks other threads of the parent were making do
/// not exist here; their caches are free and their table reader counts
/// would hold back every update.
unsafe extern "C" fn forget_walks() {
    for b in &CACHE_BUSY {
        b.store(false, Ordering::Release);
    }
    walktables::forget_readers();
}

/// `int heapprofd_walk_prepare(void)`: builds (or rebuilds) the unwind
/// tables from the objects loaded now, and the walks' caches. Not from a
/// signal handler. Returns 0.
#[cfg_attr(not(test), unsafe(export_name = "heapprofd_walk_prepare"))]
pub extern "C" fn heapprofd_walk_prepare() -> c_int {
    let saved = errno::get();
    static ATFORK: std::sync::Once = std::sync::Once::new();
    // SAFETY: registering a handler valid for the process lifetime.
    ATFORK.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(forget_walks));
    });
    {
        let _g = Guard::enter();
        for p in &CACHE_PTRS {
            if p.load(Ordering::Acquire).is_null() {
                let c = Box::into_raw(Box::new(WalkCache::new_in()));
                if p.compare_exchange(
                    core::ptr::null_mut(),
                    c,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
                {
                    // SAFETY: ours, never published.
                    drop(unsafe { Box::from_raw(c) });
                }
            }
        }
    }
    walktables::refresh();
    errno::set(saved);
    0
}

/// What the assembly entry hands over: the walk's arguments and the
/// caller's registers at the call (return address, stack pointer after
/// the return, frame pointer).
extern "C" fn walk_entry(
    uc: *const c_void,
    cb: *const Callbacks,
    user: *mut c_void,
    ra: u64,
    sp: u64,
    fp: u64,
) -> c_int {
    let saved = errno::get();
    let rc = if cb.is_null() {
        WALK_EINVAL
    } else {
        let start = if uc.is_null() {
            Start::Caller { ra, sp, fp }
        } else {
            // SAFETY: the caller's ucontext_t (a handler's third argument).
            unsafe { Start::interrupted(uc) }
        };
        // SAFETY: the caller's callbacks.
        walk(start, unsafe { &*cb }, user)
    };
    errno::set(saved);
    rc
}

/// Where a walk starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Start {
    /// At a return address into the caller (biased).
    Caller { ra: u64, sp: u64, fp: u64 },
    /// At an interrupted instruction (unbiased); `lr` is aarch64's link register.
    At { pc: u64, sp: u64, fp: u64, lr: u64 },
}

impl Start {
    #[cfg(target_arch = "x86_64")]
    unsafe fn interrupted(uc: *const c_void) -> Start {
        // SAFETY: a ucontext_t from the kernel or getcontext (caller's contract).
        let g = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
        let r = |i: c_int| g.get(i as usize).copied().unwrap_or(0) as u64;
        Start::At {
            pc: r(libc::REG_RIP),
            sp: r(libc::REG_RSP),
            fp: r(libc::REG_RBP),
            lr: 0,
        }
    }

    #[cfg(target_arch = "aarch64")]
    unsafe fn interrupted(uc: *const c_void) -> Start {
        // SAFETY: a ucontext_t from the kernel (caller's contract).
        let m = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext };
        Start::At {
            pc: m.pc,
            sp: m.sp,
            fp: m.regs[29],
            lr: m.regs[30],
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn regs(pc: u64, sp: u64, fp: u64, _lr: u64) -> ArchRegs {
    ArchRegs::new(pc, sp, fp)
}

#[cfg(target_arch = "aarch64")]
fn regs(_pc: u64, sp: u64, fp: u64, lr: u64) -> ArchRegs {
    ArchRegs::new(lr, sp, fp)
}

/// The walk: callbacks in order, returns [`WALK_ENDED`] or [`WALK_FAILED`].
pub(crate) fn walk(start: Start, cb: &Callbacks, user: *mut c_void) -> c_int {
    // SAFETY: gettid has no preconditions.
    let thread = unsafe { libc::syscall(libc::SYS_gettid) } as u64;
    let biased = matches!(start, Start::Caller { .. });
    if let Some(f) = cb.begin {
        // SAFETY: the caller's callback.
        unsafe { f(thread, c_int::from(biased), user) };
    }
    let reason = match frames(start, cb, user) {
        Ok(()) => {
            if let Some(f) = cb.end {
                // SAFETY: the caller's callback.
                unsafe { f(thread, user) };
            }
            return WALK_ENDED;
        }
        Err(reason) => reason,
    };
    if let Some(f) = cb.failure {
        // SAFETY: the caller's callback.
        unsafe { f(thread, reason, user) };
    }
    WALK_FAILED
}

/// Delivers the frames; Err(reason) when the walk cannot finish.
fn frames(start: Start, cb: &Callbacks, user: *mut c_void) -> Result<(), c_int> {
    let reading = walktables::read().map_err(|e| match e {
        Unavailable::NotReady => NOT_PREPARED,
        Unavailable::Updating => TABLES_UPDATING,
    })?;
    let tables = reading.tables();
    let mut hold = CacheHold::take().ok_or(BUSY)?;
    let (mut addr, mut regs, sp) = match start {
        Start::Caller { ra, sp, fp } => (
            FrameAddress::from_return_address(ra).ok_or(BAD_FRAME)?,
            regs(ra, sp, fp, ra),
            sp,
        ),
        Start::At { pc, sp, fp, lr } => (
            FrameAddress::from_instruction_pointer(pc),
            regs(pc, sp, fp, lr),
            sp,
        ),
    };
    let (lo, hi) = walk_bounds(sp).ok_or(NO_STACK)?;
    let mut read = |a: u64| -> Result<u64, ()> {
        if a >= lo && a.checked_add(8).is_some_and(|e| e <= hi) && a % 8 == 0 {
            // SAFETY: inside the walked stack, mapped from `lo` up.
            Ok(unsafe { core::ptr::read_volatile(a as *const u64) })
        } else {
            Err(())
        }
    };
    let deliver = |kind: c_int, pc: u64| {
        if let Some(f) = cb.frame {
            // SAFETY: the caller's callback.
            unsafe { f(kind, pc, user) };
        }
    };
    for _ in 0..MAX_FRAMES {
        let pc = addr.address();
        let lookup = addr.address_for_lookup();
        if tables.contains(lookup) {
            deliver(FRAME_NATIVE, pc);
        } else if tables.is_jit(lookup) {
            // No unwind info: framehop's frame-pointer rule (JITs keep
            // frame pointers), reads still bounded to the stack.
            deliver(FRAME_JIT, pc);
        } else {
            deliver(FRAME_UNKNOWN, pc);
            return Err(NO_UNWIND_INFO);
        }
        match tables
            .unwinder
            .unwind_frame(addr, &mut regs, hold.cache(), &mut read)
        {
            Ok(None) | Ok(Some(0)) => return Ok(()),
            Ok(Some(ra)) => addr = FrameAddress::from_return_address(ra).ok_or(BAD_FRAME)?,
            Err(Error::CouldNotReadStack(_)) => return Err(OUT_OF_BOUNDS),
            Err(_) => return Err(BAD_FRAME),
        }
    }
    Err(DEPTH_LIMIT)
}

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.heapprofd_rs_walk_stack,\"ax\",@progbits",
    ".p2align 4",
    ".globl heapprofd_rs_walk_stack",
    ".hidden heapprofd_rs_walk_stack",
    ".type heapprofd_rs_walk_stack, @function",
    export!("heapprofd_walk_stack"),
    "heapprofd_rs_walk_stack:",
    ".cfi_startproc",
    "mov rcx, qword ptr [rsp]",
    "lea r8, [rsp + 8]",
    "mov r9, rbp",
    "jmp {entry}",
    ".cfi_endproc",
    ".size heapprofd_rs_walk_stack, . - heapprofd_rs_walk_stack",
    ".popsection",
    entry = sym walk_entry,
);

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".pushsection .text.heapprofd_rs_walk_stack,\"ax\",%progbits",
    ".p2align 4",
    ".globl heapprofd_rs_walk_stack",
    ".hidden heapprofd_rs_walk_stack",
    ".type heapprofd_rs_walk_stack, %function",
    export!("heapprofd_walk_stack"),
    "heapprofd_rs_walk_stack:",
    ".cfi_startproc",
    "mov x3, x30",
    "mov x4, sp",
    "mov x5, x29",
    "b {entry}",
    ".cfi_endproc",
    ".size heapprofd_rs_walk_stack, . - heapprofd_rs_walk_stack",
    ".popsection",
    entry = sym walk_entry,
);

#[cfg(test)]
#[path = "walkstack_tests.rs"]
mod tests;
