//! Bookkeeping and dump benchmark: `Profile::malloc`/`free` throughput (in
//! order, and with every free arriving before its malloc) and the cost of
//! dumping a million live callsites.
//!
//! `cargo bench -p heapprofd-model --bench bookkeeping`

#[path = "../tests/core_support/mod.rs"]
mod core_support;

use std::io;

use core_support::{CLOCKS, Program, at_ms, big_profile};
use heapprofd_model::profile::{Alloc, Profile};
use heapprofd_model::trace::TraceWriter;

fn main() {
    use std::time::Instant;
    let p = Program::new();
    let n: u64 = 1_000_000;
    // Bookkeeping: malloc + free pairs over 64 callsites, in order.
    let stacks: Vec<Vec<_>> = (0..64u64)
        .map(|i| {
            let leaf = p
                .interner
                .intern_frame(None, i, Some(&format!("site{i}")), None, None);
            vec![p.start, p.main, p.worker, leaf]
        })
        .collect();
    let mut prof = Profile::new(&p.interner);
    prof.set_heap(1, 0, None, 4096);
    let t = Instant::now();
    for i in 0..n {
        let addr = 0x1000 + (i % 4096) * 64;
        prof.malloc(
            1,
            Alloc {
                heap: 0,
                seq: 2 * i + 1,
                address: addr,
                sample_size: 4096,
                size: 4096,
                tid: 1,
                timestamp_ns: at_ms(1),
            },
            &stacks[(i % 64) as usize],
        );
        prof.free(1, 0, 2 * i + 2, addr);
    }
    let ops = t.elapsed();
    eprintln!(
        "bookkeeping: {} malloc+free pairs in {:?} ({:.0} ns per op)",
        n,
        ops,
        ops.as_nanos() as f64 / (2 * n) as f64
    );
    // Same, arriving in reverse pairs (free before malloc).
    let mut prof = Profile::new(&p.interner);
    prof.set_heap(1, 0, None, 4096);
    let t = Instant::now();
    for i in 0..n {
        let addr = 0x1000 + (i % 4096) * 64;
        prof.free(1, 0, 2 * i + 2, addr);
        prof.malloc(
            1,
            Alloc {
                heap: 0,
                seq: 2 * i + 1,
                address: addr,
                sample_size: 4096,
                size: 4096,
                tid: 1,
                timestamp_ns: at_ms(1),
            },
            &stacks[(i % 64) as usize],
        );
    }
    let ops = t.elapsed();
    eprintln!(
        "bookkeeping, every free before its malloc: {:.0} ns per op",
        ops.as_nanos() as f64 / (2 * n) as f64
    );
    // Dump of a million distinct live callsites.
    let t = Instant::now();
    let mut prof = big_profile(&p, n);
    eprintln!(
        "building 1M callsites (interning + malloc): {:?}",
        t.elapsed()
    );
    let mut w = TraceWriter::new(io::sink(), CLOCKS).unwrap();
    let t = Instant::now();
    let s1 = w.dump(&mut prof, &p.interner, at_ms(2)).unwrap();
    let first = t.elapsed();
    let t = Instant::now();
    let s2 = w.dump(&mut prof, &p.interner, at_ms(3)).unwrap();
    let second = t.elapsed();
    eprintln!(
        "dump of 1M live callsites: first {first:?} ({} MB, {} packets, interned data included), \
         next {second:?} ({} MB)",
        s1.bytes / 1_000_000,
        s1.packets,
        s2.bytes / 1_000_000
    );
}
