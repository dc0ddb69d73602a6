//! The ground truth of `tests/programs/alloc_truth.cpp` (keep the two in
//! sync): per function, the allocations and bytes it makes and frees per
//! repetition, how its stacks must look, and the grouping of a sample's
//! frames into those functions. Shared by `record_truth.rs` (native) and
//! `aarch64_e2e.rs` (the same program built for aarch64, under qemu).

use std::collections::BTreeMap;

use crate::record_harness::{Sample, Totals, frame_is, group_by};

/// How the leaf frame of a function's samples must look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaf {
    /// The function itself called malloc/calloc/realloc/posix_memalign.
    Direct,
    /// C++ `new`: `operator new…` (libstdc++) called by the function.
    OperatorNew,
    /// Several (main: the vector's `operator new`, printf's buffer).
    Any,
}

/// One row of the truth table, per repetition of `alloc_truth REPS`.
#[derive(Debug, Clone, Copy)]
pub struct Truth {
    pub function: &'static str,
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub freed: u64,
    /// Bytes in allocations smaller than 4096 (the default interval): only
    /// these are estimated; larger ones are always recorded with their size.
    pub small_bytes: u64,
    /// The freed part of `small_bytes`.
    pub small_freed: u64,
    pub leaf: Leaf,
}

pub const fn row(function: &'static str, allocs: u64, bytes: u64, frees: u64, freed: u64) -> Truth {
    Truth {
        function,
        allocs,
        bytes,
        frees,
        freed,
        small_bytes: bytes,
        small_freed: freed,
        leaf: Leaf::Direct,
    }
}

/// The program's functions (keep in sync with alloc_truth.cpp).
pub const PER_REP: [Truth; 8] = [
    row("leak_malloc", 100, 100 * 1000, 0, 0),
    row("temp_malloc", 200, 200 * 512, 200, 200 * 512),
    row("calloc_site", 30, 30 * 2000, 0, 0),
    // 10 chains of malloc(16) then realloc to 32 .. 4096: 9 allocations and
    // 8176 bytes each, all freed; the 4096-byte blocks are not "small".
    Truth {
        small_bytes: 10 * (8176 - 4096),
        small_freed: 10 * (8176 - 4096),
        ..row("realloc_chain", 90, 10 * 8176, 90, 10 * 8176)
    },
    row("memalign_site", 10, 10 * 256, 5, 5 * 256),
    Truth {
        leaf: Leaf::OperatorNew,
        ..row("cpp_new", 20, 20 * 300, 10, 10 * 300)
    },
    row("deep_leaf", 5, 5 * 77, 0, 0),
    row("thread_alloc", 4 * 64, 4 * 64 * 128, 0, 0),
];

/// `main`'s row at `reps`: the vector's `reserve(4096 * reps)` (8-byte
/// elements, freed by its destructor at exit) and glibc's 4096-byte stdout
/// buffer for a pipe (kept). Both are >= 4096 bytes: exact at any interval.
pub fn main_row(reps: u64) -> Truth {
    Truth {
        small_bytes: 0,
        small_freed: 0,
        leaf: Leaf::Any,
        ..row("main", 2, 4096 * 8 * reps + 4096, 1, 4096 * 8 * reps)
    }
}

/// Every row, scaled to `reps`.
pub fn truth(reps: u64) -> Vec<Truth> {
    PER_REP
        .iter()
        .map(|t| Truth {
            allocs: t.allocs * reps,
            bytes: t.bytes * reps,
            frees: t.frees * reps,
            freed: t.freed * reps,
            small_bytes: t.small_bytes * reps,
            small_freed: t.small_freed * reps,
            ..*t
        })
        .chain([main_row(reps)])
        .collect()
}

/// Group of ld.so's per-thread DTV callocs (inside `pthread_create`).
pub const DTV: &str = "<ld.so DTV in pthread_create>";
/// Group of allocations with no program function on the stack.
pub const OUTSIDE: &str = "<outside main>";

/// The group an allocation belongs to: the innermost program function on
/// its stack (works for our frames and heaptrack's `name (file)` frames).
pub fn group(frames: &[String]) -> String {
    if frames.iter().any(|f| f.contains("_dl_allocate_tls")) {
        return DTV.into();
    }
    for f in frames.iter().rev() {
        if let Some(t) = PER_REP.iter().find(|t| frame_is(f, t.function)) {
            return t.function.into();
        }
        if frame_is(f, "main") {
            return "main".into();
        }
    }
    OUTSIDE.into()
}

pub fn show(samples: &[Sample]) -> String {
    samples
        .iter()
        .map(|s| {
            format!(
                "  {} allocs {} B, {} frees {} B: {}\n",
                s.alloc_count,
                s.allocated,
                s.free_count,
                s.freed,
                s.frames.join(" <- ")
            )
        })
        .collect()
}

/// What the outermost frames of a new thread's stack are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadStart {
    /// `clone3` (or `clone`) -> `start_thread` -> `thread_main`: a libc
    /// whose local symbols are known (Debian's x86_64 libc has them).
    Named,
    /// `thread_main`'s callers are libc's thread start, maybe unnamed
    /// (`?`: a libc without `.symtab` or debug information, as Debian's
    /// cross libc).
    InLibc,
}

/// Checks the shape of one sample's stack for the function it belongs to,
/// with the thread start as `start` says.
pub fn check_stack_from(t: &Truth, s: &Sample, start: ThreadStart) {
    let f = &s.frames;
    let ctx = || format!("{}: stack {:?}", t.function, f);
    assert!(
        !f.iter().any(|x| x.starts_with("ERROR")),
        "error frame; {}",
        ctx()
    );
    let leaf = f.last().map(String::as_str).unwrap_or("");
    match t.leaf {
        Leaf::Direct => assert_eq!(leaf, t.function, "leaf frame; {}", ctx()),
        Leaf::OperatorNew => {
            assert!(leaf.starts_with("operator new"), "leaf frame; {}", ctx());
            assert_eq!(f[f.len() - 2], t.function, "caller of new; {}", ctx());
        }
        Leaf::Any => {}
    }
    if t.function == "thread_alloc" && start == ThreadStart::Named {
        // Thread start: clone3 (or clone) -> start_thread -> thread_main.
        assert!(f[0].starts_with("clone"), "outermost frame; {}", ctx());
        assert_eq!(&f[1..3], ["start_thread", "thread_main"], "{}", ctx());
    } else if t.function == "thread_alloc" {
        let at = f.iter().position(|x| x == "thread_main");
        assert!(
            at.is_some_and(|i| i > 0
                && f[..i].iter().all(|x| x == "?"
                    || x.starts_with("start_thread")
                    || x.starts_with("thread_start")
                    || x.starts_with("clone"))),
            "thread_main called from libc's thread start; {}",
            ctx()
        );
    } else {
        // Main thread: _start -> __libc_start_main… -> … -> main.
        assert_eq!(f[0], "_start", "outermost frame; {}", ctx());
        assert!(f.iter().any(|x| x == "main"), "no main; {}", ctx());
    }
    if t.function == "deep_leaf" {
        let depth = f.iter().filter(|x| *x == "deep_recurse").count();
        assert_eq!(depth, 151, "deep_recurse(150..0) frames; {}", ctx());
        let main = f.iter().position(|x| x == "main").unwrap();
        assert!(
            f[main + 1..f.len() - 1].iter().all(|x| x == "deep_recurse"),
            "main -> 151 x deep_recurse -> deep_leaf; {}",
            ctx()
        );
    }
}

/// The samples of group `g` ([`group`]).
pub fn in_group(samples: &[Sample], g: &str) -> Vec<Sample> {
    samples
        .iter()
        .filter(|s| group(&s.frames) == g)
        .cloned()
        .collect()
}

/// Checks a `-i 1` profile of `alloc_truth 1`: every function's
/// allocations, bytes, frees and freed bytes equal the truth table, and
/// each of its stacks has the shape [`check_stack_from`] wants. Returns the
/// totals per group (the program's functions and the others).
pub fn check_exact(samples: &[Sample], start: ThreadStart) -> BTreeMap<String, Totals> {
    let groups = group_by(samples, group);
    for t in truth(1) {
        let got = groups.get(t.function).copied().unwrap_or_default();
        let want = Totals {
            allocs: t.allocs,
            bytes: t.bytes,
            frees: t.frees,
            freed: t.freed,
        };
        assert_eq!(
            got,
            want,
            "{}: trace (left) vs truth (right); its stacks:\n{}",
            t.function,
            show(&in_group(samples, t.function))
        );
        for s in in_group(samples, t.function) {
            check_stack_from(&t, &s, start);
        }
    }
    groups
}
