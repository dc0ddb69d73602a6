//! Shared helpers for the profile/trace/report tests: synthetic profiles
//! with known values, and the official-schema checker.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use heapprofd_model::profile::{Alloc, FrameId, Interner, Mapping, Profile};
use heapprofd_model::trace::{ClockReadings, TraceError, TraceWriter, WriterConfig};
use serde_json::Value;

/// Fixed clock readings: BOOTTIME is 1 s ahead of MONOTONIC_COARSE.
pub const CLOCKS: ClockReadings = ClockReadings {
    boottime_ns: 2_000_000_000,
    monotonic_coarse_ns: 1_000_000_000,
    monotonic_ns: 1_000_000_500,
    realtime_ns: 1_700_000_000_000_000_000,
};

/// Timestamp `ms` milliseconds after the clock readings (MONOTONIC_COARSE).
pub fn at_ms(ms: u64) -> u64 {
    CLOCKS.monotonic_coarse_ns + ms * 1_000_000
}

/// Frames of a fake program: `/usr/bin/app` (with a build id) and libc.
pub struct Program {
    pub interner: Interner,
    pub main: FrameId,
    pub start: FrameId,
    pub worker: FrameId,
    pub alloc_a: FrameId,
    pub alloc_b: FrameId,
    pub leaf_malloc: FrameId,
    pub error: FrameId,
}

impl Program {
    pub fn new() -> Self {
        let interner = Interner::new();
        let app = interner.intern_mapping(&Mapping {
            path: b"/usr/bin/app",
            build_id: Some(&[0xde, 0xad, 0xbe, 0xef]),
            start: 0x5555_0000_0000,
            end: 0x5555_0001_0000,
            exact_offset: 0x1000,
            start_offset: 0,
            load_bias: 0,
        });
        let libc = interner.intern_mapping(&Mapping {
            path: b"/lib/x86_64-linux-gnu/libc.so.6",
            build_id: None,
            start: 0x7f00_0000_0000,
            end: 0x7f00_0010_0000,
            exact_offset: 0x28000,
            start_offset: 0,
            load_bias: 0,
        });
        let f = |m, pc, name: &str, line| {
            interner.intern_frame(Some(m), pc, Some(name), Some("app.c"), line)
        };
        let start = f(libc, 0x29d90, "__libc_start_main", None);
        let main = f(app, 0x1100, "main", Some(10));
        let worker = f(app, 0x1200, "worker", Some(20));
        let alloc_a = f(app, 0x1300, "alloc_a", Some(30));
        let alloc_b = f(app, 0x1400, "alloc_b", Some(40));
        let leaf_malloc = interner.intern_frame(Some(libc), 0x9a0a0, Some("malloc"), None, None);
        let error = interner.intern_error_frame("MEMORY_INVALID");
        Program {
            interner,
            main,
            start,
            worker,
            alloc_a,
            alloc_b,
            leaf_malloc,
            error,
        }
    }

    pub fn stack_a(&self) -> Vec<FrameId> {
        vec![self.start, self.main, self.alloc_a]
    }

    pub fn stack_b(&self) -> Vec<FrameId> {
        vec![self.start, self.main, self.worker, self.alloc_b]
    }

    pub fn stack_err(&self) -> Vec<FrameId> {
        vec![self.main, self.error]
    }
}

/// A sampled allocation of `size` bytes (sampled with certainty) at
/// `address` by thread `tid`, `ms` milliseconds in.
pub fn alloc(seq: u64, address: u64, size: u64, tid: u32, ms: u64) -> Alloc {
    Alloc {
        heap: 0,
        seq,
        address,
        sample_size: size,
        size,
        tid,
        timestamp_ns: at_ms(ms),
    }
}

/// Sequence counters per pid for building profiles by hand.
#[derive(Default)]
pub struct Seq(std::collections::HashMap<u32, u64>);

impl Seq {
    pub fn next(&mut self, pid: u32) -> u64 {
        let s = self.0.entry(pid).or_insert(0);
        *s += 1;
        *s
    }
}

/// Path of check_trace.py (the proto crate's official-schema checker).
pub fn check_script() -> PathBuf {
    // This file is shared by the tests of several crates of the workspace.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("proto/tests/check_trace.py"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("proto/tests/check_trace.py"))
}

/// Runs `check_trace.py --strict` on `trace`; returns (exit code, JSON).
/// Panics with install instructions when python3 or perfetto is missing.
pub fn check_trace(trace: &Path) -> (i32, Value) {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let out = Command::new(&python)
        .arg(check_script())
        .arg("--strict")
        .arg(trace)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} ({e}); pip install perfetto"));
    let code = out.status.code().unwrap_or(-1);
    assert_ne!(
        code,
        3,
        "check_trace.py needs the perfetto package (pip install perfetto): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check_trace.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, json)
}

/// A two-process profile with known values (interval 1 so bytes are exact):
///
/// * pid 100 `app --flag`, heap 0 libc.malloc:
///   stack_a: 3 x 100 bytes, 1 freed; stack_b: 2 x 1000 bytes, both freed;
///   stack_err: 1 x 7 bytes, live.
/// * pid 100 heap 1 `custom`: stack_a: 1 x 64 bytes, live.
/// * pid 200 `other`, heap 0: stack_b: 5 x 10 bytes, 4 freed; buffer_overran.
pub fn sample_profile(p: &Program) -> Profile {
    let mut prof = Profile::new(&p.interner);
    let mut seq = Seq::default();
    prof.add_process(100, vec!["app".into(), "--flag".into()], true);
    prof.set_heap(100, 0, Some("libc.malloc"), 1);
    prof.set_heap(100, 1, Some("custom"), 1);
    prof.add_process(200, vec!["other".into()], false);
    prof.set_heap(200, 0, Some("libc.malloc"), 1);
    for i in 0..3u64 {
        let s = seq.next(100);
        prof.malloc(
            100,
            Alloc {
                heap: 0,
                seq: s,
                address: 0x1000 + i * 0x100,
                sample_size: 100,
                size: 100,
                tid: 1,
                timestamp_ns: at_ms(1),
            },
            &p.stack_a(),
        );
    }
    let s = seq.next(100);
    prof.free(100, 0, s, 0x1000);
    for i in 0..2u64 {
        let s = seq.next(100);
        prof.malloc(
            100,
            Alloc {
                heap: 0,
                seq: s,
                address: 0x9000 + i * 0x1000,
                sample_size: 1000,
                size: 1000,
                tid: 1,
                timestamp_ns: at_ms(2),
            },
            &p.stack_b(),
        );
    }
    for i in 0..2u64 {
        let s = seq.next(100);
        prof.free(100, 0, s, 0x9000 + i * 0x1000);
    }
    let s = seq.next(100);
    prof.malloc(
        100,
        Alloc {
            heap: 0,
            seq: s,
            address: 0x20000,
            sample_size: 7,
            size: 7,
            tid: 1,
            timestamp_ns: at_ms(3),
        },
        &p.stack_err(),
    );
    let s = seq.next(100);
    prof.malloc(
        100,
        Alloc {
            heap: 1,
            seq: s,
            address: 0x30000,
            sample_size: 64,
            size: 64,
            tid: 1,
            timestamp_ns: at_ms(3),
        },
        &p.stack_a(),
    );
    for i in 0..5u64 {
        let s = seq.next(200);
        prof.malloc(
            200,
            Alloc {
                heap: 0,
                seq: s,
                address: 0x40000 + i * 16,
                sample_size: 10,
                size: 10,
                tid: 1,
                timestamp_ns: at_ms(4),
            },
            &p.stack_b(),
        );
    }
    for i in 0..4u64 {
        let s = seq.next(200);
        prof.free(200, 0, s, 0x40000 + i * 16);
    }
    {
        let pr = prof.process_mut(200).unwrap();
        pr.flags.buffer_overran = true;
        pr.stats.record_unwind(250, false);
        pr.stats.record_unwind(3, true);
        pr.stats.map_reparses = 2;
    }
    prof.flush_all();
    prof
}

/// Writes a trace to memory with `f` between start and finish.
pub fn write_trace(
    cfg: WriterConfig,
    f: impl FnOnce(&mut TraceWriter<&mut Vec<u8>>) -> Result<(), TraceError>,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = TraceWriter::with_config(&mut out, CLOCKS, cfg).unwrap();
    f(&mut w).unwrap();
    w.finish().unwrap();
    out
}

/// `n` distinct live callsites in pid 7 (interval 4096).
pub fn big_profile(p: &Program, n: u64) -> Profile {
    let mut prof = Profile::new(&p.interner);
    prof.add_process(7, vec!["big".into()], true);
    prof.set_heap(7, 0, None, 4096);
    for i in 0..n {
        let leaf = p
            .interner
            .intern_frame(None, 0x1000 + i, Some(&format!("fn_{i}")), None, None);
        let stack = [p.start, p.main, leaf];
        prof.malloc(
            7,
            Alloc {
                heap: 0,
                seq: i + 1,
                address: 0x100000 + i * 64,
                sample_size: 4096,
                size: 4096,
                tid: 1,
                timestamp_ns: at_ms(1),
            },
            &stack,
        );
    }
    prof
}
