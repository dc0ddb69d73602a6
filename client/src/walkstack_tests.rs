//! Tests of the in-process walk (`walkstack`): the caller's own stack from
//! the exported entry, an interrupted context from `getcontext`, a corrupt
//! pc, and no allocation while walking.

use super::*;
use core::cell::Cell;
#[cfg(target_arch = "x86_64")]
use heapprofd_client_core::walkbounds::walk_bounds;
use std::alloc::{GlobalAlloc, Layout, System};

unsafe extern "C" {
    fn heapprofd_rs_walk_stack(uc: *const c_void, cb: *const Callbacks, user: *mut c_void)
    -> c_int;
}

/// Counts this thread's allocations (the unit-test binary's allocator).
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// What the callbacks saw, in a fixed buffer (no allocation).
#[derive(Debug)]
struct Seen {
    begun: Option<(u64, c_int)>,
    frames: [(c_int, u64); MAX_FRAMES],
    n: usize,
    ended: bool,
    failure: Option<c_int>,
}

impl Seen {
    fn new() -> Box<Seen> {
        Box::new(Seen {
            begun: None,
            frames: [(0, 0); MAX_FRAMES],
            n: 0,
            ended: false,
            failure: None,
        })
    }
    fn pcs(&self) -> Vec<u64> {
        self.frames[..self.n].iter().map(|f| f.1).collect()
    }
}

unsafe extern "C" fn begin(t: u64, biased: c_int, u: *mut c_void) {
    // SAFETY: our Seen.
    unsafe { (*u.cast::<Seen>()).begun = Some((t, biased)) };
}
unsafe extern "C" fn frame(kind: c_int, pc: u64, u: *mut c_void) {
    // SAFETY: our Seen.
    let s = unsafe { &mut *u.cast::<Seen>() };
    s.frames[s.n] = (kind, pc);
    s.n += 1;
}
unsafe extern "C" fn end(_t: u64, u: *mut c_void) {
    // SAFETY: our Seen.
    unsafe { (*u.cast::<Seen>()).ended = true };
}
unsafe extern "C" fn failure(_t: u64, r: c_int, u: *mut c_void) {
    // SAFETY: our Seen.
    unsafe { (*u.cast::<Seen>()).failure = Some(r) };
}

const CB: Callbacks = Callbacks {
    begin: Some(begin),
    frame: Some(frame),
    end: Some(end),
    failure: Some(failure),
};

fn object_of(pc: u64) -> String {
    // SAFETY: dladdr on an address, reading the file name it returns.
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        if libc::dladdr((pc - 1) as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return String::new();
        }
        core::ffi::CStr::from_ptr(info.dli_fname)
            .to_string_lossy()
            .into_owned()
    }
}

#[inline(never)]
fn walk_here(seen: &mut Seen) -> c_int {
    // SAFETY: our callbacks and Seen.
    let rc = unsafe { heapprofd_rs_walk_stack(core::ptr::null(), &CB, (seen as *mut Seen).cast()) };
    core::hint::black_box(rc)
}

#[test]
fn the_callers_stack_is_walked_to_its_root_without_allocating() {
    heapprofd_walk_prepare();
    let mut seen = Seen::new();
    let before = ALLOCS.with(|c| c.get());
    let rc = walk_here(&mut seen);
    let after = ALLOCS.with(|c| c.get());
    assert_eq!(after, before, "the walk allocated");
    assert_eq!(rc, WALK_ENDED, "{seen:?}");
    assert!(seen.ended && seen.failure.is_none());
    let (thread, biased) = seen.begun.unwrap();
    assert_eq!(biased, 1);
    // SAFETY: no preconditions.
    assert_eq!(thread, unsafe { libc::syscall(libc::SYS_gettid) } as u64);
    // The first frame returns into walk_here; the test harness's frames
    // (std's thread start) follow, every one in a loaded object.
    let first = seen.pcs()[0];
    let here = walk_here as *const () as usize as u64;
    assert!(
        first > here && first < here + 512,
        "{first:#x} vs {here:#x}"
    );
    assert!(seen.n > 5, "{:?}", seen.pcs());
    assert!(seen.frames[..seen.n].iter().all(|f| f.0 == FRAME_NATIVE));
    // The outermost frames are libc's thread start (clone3 ends the walk).
    let objects: Vec<String> = seen.pcs().iter().map(|&pc| object_of(pc)).collect();
    assert!(objects.last().unwrap().contains("libc.so"), "{objects:?}");
}

#[test]
fn an_interrupted_context_starts_at_its_pc() {
    heapprofd_walk_prepare();
    // SAFETY: getcontext fills a zeroed ucontext_t.
    let mut uc: libc::ucontext_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::getcontext(&mut uc) }, 0);
    let mut seen = Seen::new();
    // SAFETY: our callbacks, Seen and a filled ucontext.
    let rc = unsafe {
        heapprofd_rs_walk_stack(
            (&uc as *const libc::ucontext_t).cast(),
            &CB,
            (&mut *seen as *mut Seen).cast(),
        )
    };
    assert_eq!(rc, WALK_ENDED, "{seen:?}");
    assert_eq!(seen.begun.unwrap().1, 0);
    // getcontext's saved pc is its return address into this test.
    let here = an_interrupted_context_starts_at_its_pc as *const () as usize as u64;
    assert!(seen.pcs()[0] > here && seen.pcs()[0] < here + 4096);
}

#[test]
fn a_pc_in_no_object_is_a_failure_not_a_crash() {
    heapprofd_walk_prepare();
    let local = 0u64;
    let sp = &local as *const u64 as u64;
    let mut seen = Seen::new();
    let start = Start::At {
        pc: 0x1234,
        sp,
        fp: 0,
        lr: 0,
    };
    assert_eq!(
        walk(start, &CB, (&mut *seen as *mut Seen).cast()),
        WALK_FAILED
    );
    assert_eq!(seen.failure, Some(NO_UNWIND_INFO));
    assert_eq!(seen.pcs(), vec![0x1234]);
    assert_eq!(seen.frames[0].0, FRAME_UNKNOWN);
    assert!(!seen.ended);
}

#[test]
fn a_stack_pointer_on_no_stack_is_a_failure() {
    heapprofd_walk_prepare();
    let mut seen = Seen::new();
    let pc = walk_here as *const () as usize as u64;
    let start = Start::At {
        pc,
        sp: 0x1000,
        fp: 0,
        lr: 0,
    };
    assert_eq!(
        walk(start, &CB, (&mut *seen as *mut Seen).cast()),
        WALK_FAILED
    );
    assert_eq!(seen.failure, Some(NO_STACK));
}

#[test]
fn no_callbacks_is_einval() {
    // SAFETY: a NULL callbacks pointer is checked.
    let rc = unsafe {
        heapprofd_rs_walk_stack(core::ptr::null(), core::ptr::null(), core::ptr::null_mut())
    };
    assert_eq!(rc, WALK_EINVAL);
}

// Two tiny functions with known unwind rules: one whose CFA is rsp + 16
// after its push, one with no CFI at all (framehop falls back to frame
// pointers there).
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.heapprofd_rs_walk_test_fns,\"ax\",@progbits",
    ".p2align 4",
    "heapprofd_rs_walk_test_push:",
    ".cfi_startproc",
    "push rbx",
    ".cfi_adjust_cfa_offset 8",
    "heapprofd_rs_walk_test_after_push:",
    "pop rbx",
    ".cfi_adjust_cfa_offset -8",
    "ret",
    ".cfi_endproc",
    ".p2align 4",
    "heapprofd_rs_walk_test_no_cfi:",
    "nop",
    "nop",
    "ret",
    ".popsection",
);

#[cfg(target_arch = "x86_64")]
fn asm_label(which: u8) -> u64 {
    let p: u64;
    // SAFETY: only takes a label's address.
    unsafe {
        if which == 0 {
            core::arch::asm!("lea {p}, [rip + heapprofd_rs_walk_test_after_push]", p = out(reg) p);
        } else {
            core::arch::asm!("lea {p}, [rip + heapprofd_rs_walk_test_no_cfi]", p = out(reg) p);
        }
    }
    p
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_rule_reading_past_the_stack_top_is_out_of_bounds() {
    heapprofd_walk_prepare();
    let local = 0u64;
    let (_, top) = walk_bounds(&local as *const u64 as u64).expect("on a stack");
    // After the push the return address is at rsp + 8: with rsp 8 bytes
    // below the top, that is the first byte past it.
    let start = Start::At {
        pc: asm_label(0),
        sp: top - 8,
        fp: 0,
        lr: 0,
    };
    let mut seen = Seen::new();
    assert_eq!(
        walk(start, &CB, (&mut *seen as *mut Seen).cast()),
        WALK_FAILED
    );
    assert_eq!(seen.failure, Some(OUT_OF_BOUNDS), "{seen:?}");
    assert_eq!(seen.pcs(), vec![asm_label(0)]);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_frame_pointer_below_the_stack_pointer_is_a_bad_frame() {
    heapprofd_walk_prepare();
    let local = 0u64;
    let sp = &local as *const u64 as u64 & !15;
    // A return address into the function (a first frame would get
    // framehop's instruction analysis, which sees the `ret` coming).
    let start = Start::Caller {
        ra: asm_label(1) + 2,
        sp,
        fp: sp - 64,
    };
    let mut seen = Seen::new();
    assert_eq!(
        walk(start, &CB, (&mut *seen as *mut Seen).cast()),
        WALK_FAILED
    );
    assert_eq!(seen.failure, Some(BAD_FRAME), "{seen:?}");
}

/// Set in the copy of this test binary that runs the fork test alone.
const FORK_TEST_ALONE: &str = "HEAPPROFD_WALK_FORK_TEST_ALONE";

#[test]
fn a_fork_child_forgets_the_walks_of_the_parents_threads() {
    if std::env::var_os(FORK_TEST_ALONE).is_some() {
        fork_while_a_walk_is_in_progress();
        return;
    }
    // Run alone in a fresh copy of this binary: the harness's other test
    // threads may be inside `dl_iterate_phdr` at the fork, and a child of a
    // multi-threaded process would then wait for the loader's lock forever
    // (glibc does not reset it at fork), which this test is not about.
    // Under an emulator (the aarch64 tests run by qemu-user, which cannot
    // exec a foreign binary by itself) `HEAPPROFD_TEST_RUNNER` holds its
    // command line (scripts/test.sh).
    let exe = std::env::current_exe().expect("test binary");
    let runner = std::env::var("HEAPPROFD_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    let mut command = match words.next() {
        Some(first) => {
            let mut c = std::process::Command::new(first);
            c.args(words).arg(exe);
            c
        }
        None => std::process::Command::new(exe),
    };
    let mut child = command
        .args([
            "walkstack::tests::a_fork_child_forgets_the_walks_of_the_parents_threads",
            "--exact",
            "--test-threads=1",
        ])
        .env(FORK_TEST_ALONE, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the test binary");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the fork test did not finish in 60 s (a child hung)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.success(),
        "{status}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The copy ran this test (a filter that matched nothing also exits 0).
    assert!(stdout.contains("1 passed"), "{stdout}");
}

/// Forks while this thread holds a reader of the tables; the child's two
/// updates must both publish, within a bounded wait for the child.
fn fork_while_a_walk_is_in_progress() {
    heapprofd_walk_prepare();
    // A walk in progress (here: this thread's, which the child does not
    // continue) while the process forks.
    let held = walktables::read().expect("prepared");
    // SAFETY: the child only updates the tables and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let t0 = walktables::current_table();
        walktables::refresh();
        let t1 = walktables::current_table();
        walktables::refresh();
        let t2 = walktables::current_table();
        // Both updates published (else one waited 2 s for the parent's
        // reader and kept the old table).
        let ok = t0 != t1 && t1 != t2;
        // SAFETY: leaving the child without running the harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    drop(held);
    let mut status = 0;
    // SAFETY: waiting for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status:#x}"
    );
}

/// The header's `#define NAME VALUE` lines.
fn header_value(name: &str) -> i64 {
    let h = include_str!("../include/heapprofd.h");
    let line = h
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name) && l.starts_with("#define"))
        .unwrap_or_else(|| panic!("{name} not in heapprofd.h"));
    let v = line.split_whitespace().nth(2).unwrap();
    v.trim_matches(|c| c == '(' || c == ')').parse().unwrap()
}

#[test]
fn the_header_has_the_values_the_client_uses() {
    let pairs: [(&str, c_int); 17] = [
        ("HEAPPROFD_FRAME_UNKNOWN", FRAME_UNKNOWN),
        ("HEAPPROFD_FRAME_NATIVE", FRAME_NATIVE),
        ("HEAPPROFD_FRAME_JIT", FRAME_JIT),
        ("HEAPPROFD_WALK_NO_UNWIND_INFO", NO_UNWIND_INFO),
        ("HEAPPROFD_WALK_OUT_OF_BOUNDS", OUT_OF_BOUNDS),
        ("HEAPPROFD_WALK_DEPTH_LIMIT", DEPTH_LIMIT),
        ("HEAPPROFD_WALK_BAD_FRAME", BAD_FRAME),
        ("HEAPPROFD_WALK_TABLES_UPDATING", TABLES_UPDATING),
        ("HEAPPROFD_WALK_NO_STACK", NO_STACK),
        ("HEAPPROFD_WALK_BUSY", BUSY),
        ("HEAPPROFD_WALK_NOT_PREPARED", NOT_PREPARED),
        ("HEAPPROFD_WALK_ENDED", WALK_ENDED),
        ("HEAPPROFD_WALK_FAILED", WALK_FAILED),
        ("HEAPPROFD_WALK_UNAVAILABLE", -1),
        ("HEAPPROFD_WALK_EINVAL", WALK_EINVAL),
        ("HEAPPROFD_WALK_MAX_FRAMES", MAX_FRAMES as c_int),
        ("HEAPPROFD_WALK_MAX_CONCURRENT", CACHES as c_int),
    ];
    for (name, v) in pairs {
        assert_eq!(header_value(name), i64::from(v), "{name}");
    }
}
