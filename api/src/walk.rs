//! The stack-request API's in-process walk for Rust: [`prepare`] and
//! [`walk_stack`] over the client's `heapprofd_walk_prepare` and
//! `heapprofd_walk_stack` (the same API as `heapprofd.h`'s, whose comment
//! has the full semantics).
//!
//! ```no_run
//! use heapprofd_api::walk::{self, FrameType, StackVisitor, WalkFailure};
//!
//! struct Print;
//! impl StackVisitor for Print {
//!     fn frame(&mut self, kind: FrameType, pc: u64) {
//!         let _ = (kind, pc); // async-signal-safe work only, in a handler
//!     }
//!     fn failure(&mut self, _thread: u64, _reason: WalkFailure) {}
//! }
//! // Once, outside signal handlers (looks the client up, builds its tables).
//! if walk::prepare() {
//!     // Here, or in a handler with its ucontext: SAFETY: a null context.
//!     unsafe { walk::walk_stack(core::ptr::null(), &mut Print) };
//! }
//! ```
//!
//! [`walk_stack`] never looks anything up and never allocates: without
//! the client, or before [`prepare`], it returns [`WalkResult::Unavailable`]
//! and calls nothing.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};

/// A frame's type (`HEAPPROFD_FRAME_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameType {
    /// A pc in no loaded object nor perf map range (a corrupt return
    /// address, JIT code not in the map); the walk then fails with
    /// [`WalkFailure::NoUnwindInfo`].
    Unknown,
    /// A pc in a loaded object.
    Native,
    /// JIT code named by the process's perf map (`/tmp/perf-PID.map`, as
    /// [`prepare`] last read it), unwound through its frame pointer.
    Jit,
    /// Reserved: an inlined frame (not delivered yet).
    Inlined,
    /// A value this crate does not know (a newer client).
    Other(i32),
}

impl FrameType {
    fn from_raw(v: c_int) -> FrameType {
        match v {
            0 => FrameType::Unknown,
            1 => FrameType::Native,
            2 => FrameType::Jit,
            3 => FrameType::Inlined,
            v => FrameType::Other(v),
        }
    }
}

/// Why a walk ended before the outermost frame (`HEAPPROFD_WALK_*` reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkFailure {
    /// A pc in no loaded object nor perf map range.
    NoUnwindInfo,
    /// A frame's unwind rule needed memory outside the walked stack.
    OutOfBounds,
    /// More than [`MAX_FRAMES`] frames.
    DepthLimit,
    /// The unwind went backwards, did not advance or overflowed.
    BadFrame,
    /// A `dlopen`/`dlclose` kept replacing the tables during the walk.
    TablesUpdating,
    /// The stack pointer is on no stack the client knows.
    NoStack,
    /// [`MAX_CONCURRENT`] walks already in progress.
    Busy,
    /// The client's tables were never built.
    NotPrepared,
    /// A reason this crate does not know (a newer client).
    Other(i32),
}

impl WalkFailure {
    fn from_raw(v: c_int) -> WalkFailure {
        match v {
            1 => WalkFailure::NoUnwindInfo,
            2 => WalkFailure::OutOfBounds,
            3 => WalkFailure::DepthLimit,
            4 => WalkFailure::BadFrame,
            5 => WalkFailure::TablesUpdating,
            6 => WalkFailure::NoStack,
            7 => WalkFailure::Busy,
            8 => WalkFailure::NotPrepared,
            v => WalkFailure::Other(v),
        }
    }
}

/// Most frames one walk delivers (`HEAPPROFD_WALK_MAX_FRAMES`).
pub const MAX_FRAMES: usize = 256;
/// Walks that may run at once in a process (`HEAPPROFD_WALK_MAX_CONCURRENT`).
pub const MAX_CONCURRENT: usize = 8;

/// What a walk returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkResult {
    /// `end` was called: the outermost frame was reached.
    Ended,
    /// `failure` was called.
    Failed,
    /// No client, or [`prepare`] never succeeded: nothing was called.
    Unavailable,
}

/// The callbacks of a walk, in order: `begin`, `frame` per frame from the
/// innermost outwards, then `end` or `failure`. In a signal handler they
/// run in the handler: async-signal-safe work only.
pub trait StackVisitor {
    /// The walk starts on `thread` (kernel tid); `biased`: the caller's own
    /// stack (a null context) rather than an interrupted one.
    fn begin(&mut self, thread: u64, biased: bool) {
        let _ = (thread, biased);
    }
    /// One frame: the interrupted pc first (unbiased walks), then return
    /// addresses.
    fn frame(&mut self, kind: FrameType, pc: u64);
    /// The outermost frame was reached.
    fn end(&mut self, thread: u64) {
        let _ = thread;
    }
    /// The walk could not go on.
    fn failure(&mut self, thread: u64, reason: WalkFailure);
}

#[repr(C)]
struct Callbacks {
    begin: unsafe extern "C" fn(u64, c_int, *mut c_void),
    frame: unsafe extern "C" fn(c_int, u64, *mut c_void),
    end: unsafe extern "C" fn(u64, *mut c_void),
    failure: unsafe extern "C" fn(u64, c_int, *mut c_void),
}

type WalkFn = unsafe extern "C" fn(*const c_void, *const Callbacks, *mut c_void) -> c_int;
type PrepareFn = unsafe extern "C" fn() -> c_int;

static WALK: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// Looks the client up and has it build its unwind tables from the
/// objects loaded now and the process's perf map
/// (`heapprofd_walk_prepare`). Not from a signal
/// handler. `dlopen` and `dlclose` update the tables by themselves
/// afterwards, except a `dlopen` of a bare name whose search depends on
/// its caller (the calling object has a `DT_RUNPATH`, or an object other
/// than the program a `DT_RPATH`): call again after one. False without
/// the client.
pub fn prepare() -> bool {
    // SAFETY: dlsym with RTLD_DEFAULT and NUL-terminated names.
    let (p, w) = unsafe {
        (
            libc::dlsym(libc::RTLD_DEFAULT, c"heapprofd_walk_prepare".as_ptr()),
            libc::dlsym(libc::RTLD_DEFAULT, c"heapprofd_walk_stack".as_ptr()),
        )
    };
    if p.is_null() || w.is_null() {
        return false;
    }
    // SAFETY: the client's `int heapprofd_walk_prepare(void)`.
    let rc = unsafe { core::mem::transmute::<*mut c_void, PrepareFn>(p)() };
    WALK.store(w, Ordering::Release);
    rc == 0
}

unsafe extern "C" fn on_begin<V: StackVisitor>(t: u64, biased: c_int, u: *mut c_void) {
    // SAFETY: `u` is the visitor `walk_stack` passed.
    unsafe { (*u.cast::<V>()).begin(t, biased != 0) }
}
unsafe extern "C" fn on_frame<V: StackVisitor>(kind: c_int, pc: u64, u: *mut c_void) {
    // SAFETY: as above.
    unsafe { (*u.cast::<V>()).frame(FrameType::from_raw(kind), pc) }
}
unsafe extern "C" fn on_end<V: StackVisitor>(t: u64, u: *mut c_void) {
    // SAFETY: as above.
    unsafe { (*u.cast::<V>()).end(t) }
}
unsafe extern "C" fn on_failure<V: StackVisitor>(t: u64, r: c_int, u: *mut c_void) {
    // SAFETY: as above.
    unsafe { (*u.cast::<V>()).failure(t, WalkFailure::from_raw(r)) }
}

/// Walks a stack now (`heapprofd_walk_stack`): the context a signal
/// handler interrupted (`ucontext`, the handler's third argument;
/// unbiased), or the caller's own stack (null; biased, starting at the
/// return address into the function that called `walk_stack`).
/// Inlined into its caller, so a biased walk's first frame is the return
/// address into that caller. Async-signal-safe once [`prepare`] ran.
///
/// # Safety
/// `ucontext` is null or points to a `ucontext_t` (a signal handler's, or
/// one `getcontext` filled on this thread's live stack).
#[inline(always)]
pub unsafe fn walk_stack<V: StackVisitor>(ucontext: *const c_void, visitor: &mut V) -> WalkResult {
    let w = WALK.load(Ordering::Acquire);
    if w.is_null() {
        return WalkResult::Unavailable;
    }
    let cb = Callbacks {
        begin: on_begin::<V>,
        frame: on_frame::<V>,
        end: on_end::<V>,
        failure: on_failure::<V>,
    };
    // SAFETY: the client's heapprofd_walk_stack, our callbacks and visitor.
    let rc = unsafe {
        core::mem::transmute::<*mut c_void, WalkFn>(w)(ucontext, &cb, (visitor as *mut V).cast())
    };
    match rc {
        0 => WalkResult::Ended,
        1 => WalkResult::Failed,
        _ => WalkResult::Unavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(usize);
    impl StackVisitor for Count {
        fn frame(&mut self, _kind: FrameType, _pc: u64) {
            self.0 += 1;
        }
        fn failure(&mut self, _thread: u64, _reason: WalkFailure) {}
    }

    #[test]
    fn without_the_client_nothing_is_called() {
        assert!(!prepare());
        let mut c = Count(0);
        // SAFETY: a null context.
        let r = unsafe { walk_stack(core::ptr::null(), &mut c) };
        assert_eq!(r, WalkResult::Unavailable);
        assert_eq!(c.0, 0);
    }

    /// The value of `#define NAME VALUE` in the C header.
    fn header_value(name: &str) -> i32 {
        let h = include_str!("../../client/include/heapprofd.h");
        let line = h
            .lines()
            .find(|l| l.starts_with("#define") && l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("{name} not in heapprofd.h"));
        let v = line.split_whitespace().nth(2).unwrap();
        v.trim_matches(|c| c == '(' || c == ')').parse().unwrap()
    }

    #[test]
    fn the_values_are_the_headers() {
        for (name, t) in [
            ("HEAPPROFD_FRAME_UNKNOWN", FrameType::Unknown),
            ("HEAPPROFD_FRAME_NATIVE", FrameType::Native),
            ("HEAPPROFD_FRAME_JIT", FrameType::Jit),
            ("HEAPPROFD_FRAME_INLINED", FrameType::Inlined),
        ] {
            assert_eq!(FrameType::from_raw(header_value(name)), t, "{name}");
        }
        for (name, r) in [
            ("HEAPPROFD_WALK_NO_UNWIND_INFO", WalkFailure::NoUnwindInfo),
            ("HEAPPROFD_WALK_OUT_OF_BOUNDS", WalkFailure::OutOfBounds),
            ("HEAPPROFD_WALK_DEPTH_LIMIT", WalkFailure::DepthLimit),
            ("HEAPPROFD_WALK_BAD_FRAME", WalkFailure::BadFrame),
            (
                "HEAPPROFD_WALK_TABLES_UPDATING",
                WalkFailure::TablesUpdating,
            ),
            ("HEAPPROFD_WALK_NO_STACK", WalkFailure::NoStack),
            ("HEAPPROFD_WALK_BUSY", WalkFailure::Busy),
            ("HEAPPROFD_WALK_NOT_PREPARED", WalkFailure::NotPrepared),
        ] {
            assert_eq!(WalkFailure::from_raw(header_value(name)), r, "{name}");
        }
        assert_eq!(
            header_value("HEAPPROFD_WALK_MAX_FRAMES") as usize,
            MAX_FRAMES
        );
        assert_eq!(
            header_value("HEAPPROFD_WALK_MAX_CONCURRENT") as usize,
            MAX_CONCURRENT
        );
    }

    #[test]
    fn raw_values_map_to_their_names() {
        assert_eq!(FrameType::from_raw(1), FrameType::Native);
        assert_eq!(FrameType::from_raw(9), FrameType::Other(9));
        assert_eq!(WalkFailure::from_raw(3), WalkFailure::DepthLimit);
        assert_eq!(WalkFailure::from_raw(8), WalkFailure::NotPrepared);
    }
}
