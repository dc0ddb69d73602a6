//! Replays a captured session through the worker's per-record step
//! (`SessionUnwinder::handle_record`) offline: the daemon's unwinding cost
//! per sample on a real program, without the program, the ring or the other
//! threads competing for the machine, so that before/after numbers of a
//! change can be compared on a busy machine (run it under `valgrind
//! --tool=callgrind` for instruction counts).
//!
//! Capture first with the test receiver (`--capture PREFIX`, see
//! `tests/src/bin/heapprofd-test-receiver.rs` for the file format), e.g.
//!
//! ```text
//! heapprofd-test-receiver --socket /tmp/r.sock --block --interval 1 \
//!     --capture /tmp/sq --capture-max 200000 < /dev/tty &
//! HEAPPROFD_SOCKET=/tmp/r.sock HEAPPROFD_BLOCKING_INIT=1 \
//!     LD_PRELOAD=target/release/libheapprofd_client.so sqlite3 :memory: < x.sql
//! cargo bench -p heapprofd-daemon --bench replay -- /tmp/sq.PID.cap [--reps N] [--records N]
//! ```
//!
//! Prints the records and malloc samples replayed, the best and median time
//! per malloc sample over the repetitions (each with fresh caches: a
//! session's life), the distinct stacks, the replay memo's hits and misses,
//! and a digest of every sample's frames (rel_pc sequence) to compare two
//! builds' results. Module files are read from disk (the capture must be
//! replayed on the machine it was made on, with the same client library:
//! rebuilding `libheapprofd_client.so` after the capture breaks the walks
//! through its frames); the process's memory is not available (reads
//! outside the copied stack fail). `--stack-use` prints instead how many of
//! the stack bytes each malloc sample carries its walk reads. `--ring`
//! passes each record through a ring buffer as the worker reads it (left in
//! place, copied out in parts), `--ring-copied` as it was read before
//! (copied out whole, then handled): the copies' cost, with the record
//! still in this core's cache.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heapprofd_daemon::runtime::session_unwinder::SessionUnwinder;
use heapprofd_daemon::runtime::stacks::InternCtx;
use heapprofd_daemon::runtime::symbolize::Symbolizer;
use heapprofd_model::messages::Op;
use heapprofd_model::profile::Interner;
use heapprofd_proto::wire::Record;
use heapprofd_shmem::{InPlace, ReadOutcome, RingBuffer, WriteMode};
use heapprofd_unwinder::{
    MapsSource, ModuleCache, NoMemory, ProcessContext, RawUnwind, StackSample, WalkTrace,
};

/// One chunk of a capture file.
enum Chunk {
    Maps(String),
    Record(Vec<u8>),
}

struct Capture {
    pid: u32,
    client_text: std::ops::Range<u64>,
    chunks: Vec<Chunk>,
}

fn load(path: &str) -> Result<Capture, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading {path}: {e}"))?;
    let mut pos = 0usize;
    let mut pid = None;
    let mut client_text = 0..0;
    let mut chunks = Vec::new();
    while pos < bytes.len() {
        let (Some(&tag), Some(len)) = (bytes.get(pos), bytes.get(pos + 1..pos + 5)) else {
            return Err(format!("{path}: truncated chunk header at {pos}"));
        };
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        let Some(body) = bytes.get(pos + 5..pos + 5 + len) else {
            return Err(format!("{path}: truncated chunk at {pos}"));
        };
        pos += 5 + len;
        match tag {
            b'H' if body.len() == 12 && &body[..8] == b"HPRSCAP1" => {
                pid = Some(u32::from_le_bytes(body[8..12].try_into().expect("4 bytes")));
            }
            b'T' if body.len() == 16 => {
                let s = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
                let e = u64::from_le_bytes(body[8..].try_into().expect("8 bytes"));
                client_text = s..e;
            }
            b'M' => chunks.push(Chunk::Maps(String::from_utf8_lossy(body).into_owned())),
            b'R' => chunks.push(Chunk::Record(body.to_vec())),
            _ => return Err(format!("{path}: unknown chunk {tag:#x} at {pos}")),
        }
    }
    Ok(Capture {
        pid: pid.ok_or(format!("{path}: not a capture (no HPRSCAP1 header)"))?,
        client_text,
        chunks,
    })
}

/// The maps as of the replay's position in the capture.
struct ReplayMaps(Arc<Mutex<String>>);

impl MapsSource for ReplayMaps {
    fn read_maps(&mut self) -> std::io::Result<String> {
        Ok(self.0.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// What one replay measured.
struct Replay {
    elapsed: Duration,
    records: u64,
    mallocs: u64,
    stacks: usize,
    hits: u64,
    misses: u64,
    digest: u64,
    errors: u64,
}

/// How records reach `handle_record`.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// From the capture's buffers.
    Direct,
    /// Through a ring: each record written, then read in place and copied
    /// out in parts by `handle_record` (the worker's path).
    RingInPlace,
    /// Through a ring: each record copied out whole first, then handled.
    RingCopied,
}

fn replay(cap: &Capture, path: Path) -> Replay {
    let maps = Arc::new(Mutex::new(String::new()));
    let mut chunks = cap.chunks.iter().peekable();
    // The maps of the handshake come first.
    while let Some(Chunk::Maps(m)) = chunks.peek() {
        *maps.lock().expect("maps") = m.clone();
        chunks.next();
    }
    let process = ProcessContext::new(
        cap.pid,
        Box::new(ReplayMaps(Arc::clone(&maps))),
        Box::new(NoMemory),
        Arc::new(ModuleCache::default()),
    );
    let mut u = SessionUnwinder::new(process, cap.client_text.clone(), 1);
    let (interner, symbolizer) = (Interner::new(), Symbolizer::new());
    let cx = InternCtx {
        interner: &interner,
        symbolizer: &symbolizer,
        symbolize: false,
    };
    let mut ops = Vec::with_capacity(1024);
    let mut defined: HashMap<u32, u64> = HashMap::new();
    let mut digest = std::collections::hash_map::DefaultHasher::new();
    let (mut records, mut elapsed) = (0u64, Duration::ZERO);
    let (ring, _fd) = RingBuffer::create(8 << 20).expect("an 8 MiB ring");
    let mut reader = ring.reader();
    let (mut copied, mut scratch) = (Vec::new(), Vec::new());
    for c in chunks {
        match c {
            Chunk::Maps(m) => *maps.lock().expect("maps") = m.clone(),
            Chunk::Record(r) => {
                records += 1;
                if path != Path::Direct {
                    // Written outside the timing, as the client would.
                    let mut w = ring.begin_write(r.len(), WriteMode::Drop).expect("room");
                    w.write_at(0, r);
                    w.commit();
                }
                let t0 = Instant::now();
                match path {
                    Path::Direct => u.handle_record(r, &mut scratch, &mut ops, &cx),
                    Path::RingInPlace => {
                        if let InPlace::Record(rec) = reader.read_in_place() {
                            u.handle_record(&rec, &mut scratch, &mut ops, &cx);
                        }
                    }
                    Path::RingCopied => {
                        if let ReadOutcome::Record(_) = reader.read(&mut copied) {
                            u.handle_record(&copied, &mut scratch, &mut ops, &cx);
                        }
                    }
                }
                elapsed += t0.elapsed();
                for op in ops.drain(..) {
                    match op {
                        Op::Stack { id, frames } => {
                            let mut h = std::collections::hash_map::DefaultHasher::new();
                            let view = interner.read();
                            for f in frames.iter() {
                                let data = view.frame(*f);
                                data.map(|d| d.rel_pc).hash(&mut h);
                                view.function_name(*f).hash(&mut h);
                            }
                            defined.insert(id, h.finish());
                        }
                        Op::Malloc { stack, .. } => defined.get(&stack).hash(&mut digest),
                        _ => {}
                    }
                }
            }
        }
    }
    Replay {
        elapsed,
        records,
        mallocs: u.samples,
        stacks: u.walker.stacks.len(),
        hits: u.walker.stacks.memo.hits,
        misses: u.walker.stacks.memo.misses,
        digest: digest.finish(),
        errors: u.walker.unwind_errors,
    }
}

/// `--stack-use`: of the stack bytes each malloc sample carries, how many
/// its walk reads (up to the highest word read, from a traced walk of every
/// sample with no memo), and how many walks read outside the copy.
fn stack_use(cap: &Capture) {
    let maps = Arc::new(Mutex::new(String::new()));
    let mut process = None;
    let (mut raw, mut trace) = (RawUnwind::default(), WalkTrace::default());
    let (mut samples, mut copied, mut used, mut outside) = (0u64, 0u64, 0u64, 0u64);
    for c in &cap.chunks {
        match c {
            Chunk::Maps(m) => *maps.lock().expect("maps") = m.clone(),
            Chunk::Record(r) => {
                let Ok(Record::Malloc(h, stack)) = Record::decode(r) else {
                    continue;
                };
                let p = process.get_or_insert_with(|| {
                    ProcessContext::new(
                        cap.pid,
                        Box::new(ReplayMaps(Arc::clone(&maps))),
                        Box::new(NoMemory),
                        Arc::new(ModuleCache::default()),
                    )
                });
                let sample = StackSample {
                    arch: h.arch,
                    regs: &h.regs,
                    stack_pointer: h.stack_pointer,
                    stack,
                    skip: cap.client_text.clone(),
                };
                p.unwind_raw_traced(&sample, &mut raw, &mut trace);
                samples += 1;
                copied += stack.len() as u64;
                let top = trace.reads.iter().map(|&(a, _)| a + 8).max();
                used += top.map_or(0, |t| t.saturating_sub(h.stack_pointer));
                outside += u64::from(!trace.replayable);
            }
        }
    }
    let per = |v: u64| v as f64 / samples.max(1) as f64;
    println!(
        "stack_use: malloc_samples={samples} copied_bytes_per_sample={:.0} read_up_to_bytes_per_sample={:.0} not_replayable={outside}",
        per(copied),
        per(used)
    );
}

fn main() {
    let mut path = None;
    let mut use_only = false;
    let mut reps = 5usize;
    let mut limit = usize::MAX;
    let mut path_kind = Path::Direct;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).unwrap_or(5),
            "--records" => {
                limit = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(usize::MAX)
            }
            "--bench" => {}
            "--stack-use" => use_only = true,
            "--ring" => path_kind = Path::RingInPlace,
            "--ring-copied" => path_kind = Path::RingCopied,
            _ if path.is_none() && !a.starts_with("--") => path = Some(a),
            other => {
                eprintln!(
                    "replay: unknown argument {other}\nusage: replay FILE.cap [--reps N] [--records N] [--stack-use] [--ring|--ring-copied]"
                );
                std::process::exit(2);
            }
        }
    }
    let Some(path) = path else {
        eprintln!(
            "usage: replay FILE.cap [--reps N]  (capture with heapprofd-test-receiver --capture)"
        );
        std::process::exit(2);
    };
    let mut cap = load(&path).unwrap_or_else(|e| {
        eprintln!("replay: {e}");
        std::process::exit(1);
    });
    let mut records = 0usize;
    cap.chunks.retain(|c| match c {
        Chunk::Maps(_) => true,
        Chunk::Record(_) => {
            records += 1;
            records <= limit
        }
    });
    if use_only {
        stack_use(&cap);
        return;
    }
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..reps.max(1) {
        let r = replay(&cap, path_kind);
        times.push(r.elapsed);
        last = Some(r);
    }
    let r = last.expect("one replay");
    times.sort();
    let per = |d: Duration| d.as_nanos() as f64 / r.mallocs.max(1) as f64;
    println!(
        "records={} mallocs={} best_ns_per_malloc={:.0} median_ns_per_malloc={:.0} stacks={} memo_hits={} memo_misses={} unwind_errors={} digest={:016x}",
        r.records,
        r.mallocs,
        per(times[0]),
        per(times[times.len() / 2]),
        r.stacks,
        r.hits,
        r.misses,
        r.errors,
        r.digest
    );
}
