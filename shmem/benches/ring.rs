//! Ring-buffer throughput: one writer process and one reader process.
//!
//! `cargo bench -p heapprofd-shmem --bench ring` prints, for 4 KiB and
//! 300-byte records, the end-to-end throughput (writer start to the reader
//! having copied out the last record) and the writer's cost per record.
//! A baseline measured in the same run (a plain `memcpy` of the same bytes
//! into a private buffer) gives the ratio.

use std::time::Instant;

use heapprofd_shmem::{ReadOutcome, RingBuffer, WriteMode};

fn bench(record_len: usize, records: u64, data_size: u64) -> (f64, f64) {
    let (rb, _fd) = RingBuffer::create(data_size).expect("create ring buffer");
    // SAFETY: no other threads exist yet in this process; the child only
    // reads the ring buffer and exits with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mut reader = rb.reader();
        let mut buf = Vec::with_capacity(record_len);
        let mut n = 0;
        let mut sum = 0u64;
        while n < records {
            match reader.read(&mut buf) {
                ReadOutcome::Record(len) => {
                    n += 1;
                    sum = sum.wrapping_add(buf[len - 1] as u64);
                }
                ReadOutcome::Empty | ReadOutcome::Pending => std::hint::spin_loop(),
                ReadOutcome::Corrupt(c) => panic!("corrupt {c:?}"),
            }
        }
        std::hint::black_box(sum);
        // SAFETY: leaving the forked child without running the parent's atexit handlers.
        unsafe { libc::_exit(0) };
    }
    let payload = vec![0xa5u8; record_len];
    let start = Instant::now();
    for _ in 0..records {
        rb.write_parts(&[&payload], WriteMode::Block { timeout: None })
            .expect("write");
    }
    let writer_done = start.elapsed();
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let total = start.elapsed();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "reader failed"
    );
    let gbps = (records as f64 * record_len as f64) / total.as_secs_f64() / 1e9;
    let ns_per_write = writer_done.as_nanos() as f64 / records as f64;
    (gbps, ns_per_write)
}

/// The writer's cost alone: 300-byte records into a buffer nobody reads,
/// large enough that it never fills (median over `rounds` fresh buffers).
fn write_only(record_len: usize, rounds: usize) -> f64 {
    let size: u64 = 64 << 20;
    let n = (size as usize / heapprofd_shmem::record_size(record_len)) - 1;
    let payload = vec![0x3cu8; record_len];
    let mut per_write: Vec<f64> = (0..rounds)
        .map(|_| {
            let (rb, _fd) = RingBuffer::create(size).expect("create ring buffer");
            rb.prefault();
            let start = Instant::now();
            for _ in 0..n {
                let mut r = rb.begin_write(record_len, WriteMode::Drop).expect("write");
                r.write_at(0, &payload);
                std::hint::black_box(r.commit());
            }
            start.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    per_write.sort_by(f64::total_cmp);
    per_write[rounds / 2]
}

fn memcpy_baseline(record_len: usize, records: u64) -> f64 {
    let src = vec![0x5au8; record_len];
    let mut dst = vec![0u8; 1 << 20];
    let start = Instant::now();
    let mut off = 0;
    for _ in 0..records {
        if off + record_len > dst.len() {
            off = 0;
        }
        dst[off..off + record_len].copy_from_slice(std::hint::black_box(&src));
        off += record_len;
    }
    std::hint::black_box(&dst);
    (records as f64 * record_len as f64) / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let size = 8 << 20;
    let ns = write_only(300, 5);
    println!(
        "one 300-byte write (reserve + copy + commit), no reader, median of 5 x 64 MiB: {ns:.1} ns"
    );
    println!(
        "ring buffer: 1 writer process + 1 reader process, {} MiB buffer, block mode",
        size >> 20
    );
    for (len, n) in [(4096usize, 500_000u64), (300, 5_000_000)] {
        let base = memcpy_baseline(len, n);
        let mut runs: Vec<(f64, f64)> = (0..3).map(|_| bench(len, n, size)).collect();
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (gbps, ns) = runs[1];
        println!(
            "{len:>5} B records x {n}: {gbps:.2} GB/s end to end (median of 3), \
             writer {ns:.0} ns/record; private memcpy {base:.2} GB/s; ratio {:.2}",
            gbps / base
        );
    }
}
