//! Ring-buffer behaviour tests: single-process semantics, a hostile peer
//! scribbling on the shared memory, and a multi-process stress run with many
//! writer threads in a child process.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use heapprofd_shmem::{
    ClientError, Corruption, ReadOutcome, RingBuffer, WriteError, WriteMode, offsets, record_size,
};

const PAGE: u64 = 4096;

fn read_all(rb: &RingBuffer) -> Vec<Vec<u8>> {
    let mut reader = rb.reader();
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while let ReadOutcome::Record(n) = reader.read(&mut buf) {
        assert_eq!(n, buf.len());
        out.push(buf.clone());
    }
    out
}

#[test]
fn write_then_read_in_order() {
    let (rb, _fd) = RingBuffer::create(PAGE).unwrap();
    for i in 0..10u8 {
        rb.write_parts(&[&[i; 3], &[i + 100; 5]], WriteMode::Drop)
            .unwrap();
    }
    let got = read_all(&rb);
    assert_eq!(got.len(), 10);
    for (i, r) in got.iter().enumerate() {
        let i = i as u8;
        assert_eq!(r, &[i, i, i, i + 100, i + 100, i + 100, i + 100, i + 100]);
    }
}

#[test]
fn full_buffer_drops_and_counts() {
    let (rb, _fd) = RingBuffer::create(PAGE).unwrap();
    let payload = [7u8; 1000];
    let fits = PAGE as usize / record_size(payload.len());
    for _ in 0..fits {
        rb.write_parts(&[&payload], WriteMode::Drop).unwrap();
    }
    assert_eq!(
        rb.write_parts(&[&payload], WriteMode::Drop),
        Err(WriteError::Full)
    );
    assert_eq!(rb.writer_stats().writes_overflow, 1);
    assert_eq!(read_all(&rb).len(), fits);
}

#[test]
fn wraps_around_without_splitting_records() {
    let (rb, _fd) = RingBuffer::create(PAGE).unwrap();
    let mut reader = rb.reader();
    let mut buf = Vec::new();
    // 1000 records of a size that does not divide the buffer: every position wraps eventually.
    for i in 0..1000u32 {
        let len = 300 + (i as usize % 37);
        let payload: Vec<u8> = (0..len).map(|j| (i as usize * 31 + j) as u8).collect();
        rb.write_parts(&[&payload], WriteMode::Drop).unwrap();
        assert_eq!(reader.read(&mut buf), ReadOutcome::Record(len));
        assert_eq!(buf, payload);
    }
    assert_eq!(reader.read(&mut buf), ReadOutcome::Empty);
}

#[test]
fn too_large_and_shutdown() {
    let (rb, _fd) = RingBuffer::create(PAGE).unwrap();
    let big = vec![0u8; PAGE as usize];
    assert_eq!(
        rb.write_parts(&[&big], WriteMode::Drop),
        Err(WriteError::TooLarge)
    );
    rb.set_shutdown();
    assert!(rb.is_shutdown());
    assert_eq!(
        rb.write_parts(&[b"x"], WriteMode::Drop),
        Err(WriteError::Shutdown)
    );
}

#[test]
fn uncommitted_is_pending_and_dropped_reservation_is_skipped() {
    let (rb, _fd) = RingBuffer::create(PAGE).unwrap();
    let mut reader = rb.reader();
    let mut buf = Vec::new();
    let mut r = rb.begin_write(16, WriteMode::Drop).unwrap();
    r.write_at(0, &[1; 16]);
    assert_eq!(reader.read(&mut buf), ReadOutcome::Pending);
    drop(r); // never committed: discarded
    rb.write_parts(&[b"after"], WriteMode::Drop).unwrap();
    assert_eq!(reader.read(&mut buf), ReadOutcome::Record(5));
    assert_eq!(buf, b"after");
}

#[test]
fn block_mode_times_out_and_records_the_error() {
    let (rb, _fd) = RingBuffer::create(PAGE).unwrap();
    let payload = [0u8; 2000];
    rb.write_parts(&[&payload], WriteMode::Drop).unwrap();
    let mode = WriteMode::Block {
        timeout: Some(Duration::from_millis(20)),
    };
    let t = Instant::now();
    assert_eq!(
        rb.write_parts(&[&payload, &payload], mode),
        Err(WriteError::Timeout)
    );
    assert!(t.elapsed() >= Duration::from_millis(20));
    assert_eq!(rb.client_error(), ClientError::HitTimeout);
    assert!(rb.writer_stats().blocked_us >= 20_000);
}

#[test]
fn block_mode_waits_for_the_reader() {
    let (rb, fd) = RingBuffer::create(PAGE).unwrap();
    let payload = [9u8; 1500];
    rb.write_parts(&[&payload], WriteMode::Drop).unwrap();
    rb.write_parts(&[&payload], WriteMode::Drop).unwrap();
    // A second mapping of the same memfd plays the other process.
    let other = RingBuffer::attach(&fd).unwrap();
    let reader_thread = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        read_all(&other).len()
    });
    rb.write_parts(&[&payload], WriteMode::Block { timeout: None })
        .unwrap();
    assert!(reader_thread.join().unwrap() >= 2);
}

#[test]
fn poisoned_lock_refuses_writers() {
    let (rb, _fd) = RingBuffer::create(PAGE).unwrap();
    let (meta, _) = rb.raw_parts_for_testing();
    // Hold it forever,
    // as a writer that died inside the critical section would.
    // SAFETY: the metadata page is mapped and this offset is inside it.
    unsafe { meta.add(offsets::LOCK).cast::<u32>().write_volatile(1) };
    let t = Instant::now();
    assert_eq!(
        rb.write_parts(&[b"x"], WriteMode::Drop),
        Err(WriteError::LockTimeout)
    );
    assert!(t.elapsed() >= Duration::from_secs(1));
    assert_eq!(rb.writer_stats().spinlock_failures, 1);
    // Later writers fail at once instead of waiting again.
    let t = Instant::now();
    assert_eq!(
        rb.write_parts(&[b"x"], WriteMode::Drop),
        Err(WriteError::Poisoned)
    );
    assert!(t.elapsed() < Duration::from_millis(500));
}

#[test]
fn reader_survives_hostile_positions_and_headers() {
    let (rb, _fd) = RingBuffer::create(PAGE).unwrap();
    let (meta, data) = rb.raw_parts_for_testing();
    let set_write_pos = |v: u64| {
        // SAFETY: inside the mapped metadata page.
        unsafe { meta.add(offsets::WRITE_POS).cast::<u64>().write_volatile(v) }
    };
    for bogus in [3u64, PAGE + 8, u64::MAX - 7] {
        let (rb2, _fd2) = RingBuffer::create(PAGE).unwrap();
        let (m2, _) = rb2.raw_parts_for_testing();
        // SAFETY: inside the mapped metadata page.
        unsafe {
            m2.add(offsets::WRITE_POS)
                .cast::<u64>()
                .write_volatile(bogus)
        };
        let mut r = rb2.reader();
        let mut buf = Vec::new();
        assert!(matches!(
            r.read(&mut buf),
            ReadOutcome::Corrupt(Corruption::Positions { .. })
        ));
        // Sticky: the reader does not try again.
        assert!(matches!(r.read(&mut buf), ReadOutcome::Corrupt(_)));
        assert_eq!(r.stats().reads_corrupt, 2);
    }
    // A committed header claiming more bytes than were reserved.
    rb.write_parts(&[b"12345678"], WriteMode::Drop).unwrap();
    // SAFETY: the first record header is at the start of the data area.
    unsafe { data.cast::<u64>().write_volatile((1 << 32) | 4000) };
    let mut r = rb.reader();
    let mut buf = Vec::new();
    assert!(matches!(
        r.read(&mut buf),
        ReadOutcome::Corrupt(Corruption::RecordSize { .. })
    ));
    set_write_pos(0);
}

#[test]
fn commit_asks_to_wake_when_half_full_once_per_reader_progress() {
    let (rb, _fd) = RingBuffer::create(PAGE).unwrap();
    let payload = [0u8; 504]; // 512-byte records: 8 fill the buffer
    let wakes: Vec<bool> = (0..6)
        .map(|_| rb.write_parts(&[&payload], WriteMode::Drop).unwrap())
        .collect();
    // The 4th record brings the buffer to half full: one kick, not more.
    assert_eq!(wakes, [false, false, false, true, false, false]);
    // The reader makes progress (and publishes it when it runs dry): re-armed.
    assert_eq!(read_all(&rb).len(), 6);
    let wakes: Vec<bool> = (0..4)
        .map(|_| rb.write_parts(&[&payload], WriteMode::Drop).unwrap())
        .collect();
    assert_eq!(wakes, [false, false, false, true]);
}

#[test]
fn reader_paused_handshake() {
    let (rb, _fd) = RingBuffer::create(PAGE).unwrap();
    assert!(!rb.take_reader_paused());
    rb.pause_reader();
    assert!(rb.take_reader_paused());
    // Only one writer gets to wake the reader.
    assert!(!rb.take_reader_paused());
    rb.pause_reader();
    rb.unpause_reader();
    assert!(!rb.take_reader_paused());
}

#[test]
fn attach_rejects_bad_descriptors() {
    // An unsealed memfd of the right size.
    // SAFETY: plain syscalls.
    let fd = unsafe {
        let fd = libc_memfd();
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), (2 * PAGE) as i64), 0);
        fd
    };
    assert!(RingBuffer::attach(&fd).is_err());
    assert!(RingBuffer::create(3000).is_err());
    assert!(RingBuffer::create(PAGE * 3).is_err());
}

unsafe fn libc_memfd() -> OwnedFd {
    // SAFETY: valid C string; we take ownership of the new descriptor.
    unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC)) }
}

// ---------------------------------------------------------------------------
// Multi-process stress: the test binary re-executes itself as the writer.
// ---------------------------------------------------------------------------

const CHILD_ENV: &str = "HEAPPROFD_SHMEM_STRESS_CHILD";

fn checksum(bytes: &[u8]) -> u64 {
    // FNV-1a, good enough to notice torn or shifted records.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Record: [writer u64][seq u64][body...][checksum of everything before u64].
fn make_record(writer: u64, seq: u64, rng: &mut u64, buf: &mut Vec<u8>) {
    let body_len = match xorshift(rng) % 64 {
        0 => 4096,
        _ => (xorshift(rng) % 600) as usize,
    };
    buf.clear();
    buf.extend_from_slice(&writer.to_le_bytes());
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend((0..body_len).map(|i| (seq as usize + i) as u8));
    let c = checksum(buf);
    buf.extend_from_slice(&c.to_le_bytes());
}

/// Runs in the child: `threads` writers each try `per_thread` records, then
/// prints one line per writer: "sent <writer> <ok> <failed>".
#[test]
fn stress_child_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut it = spec.split(',').map(|s| s.parse::<u64>().unwrap());
    let (fd, threads, per_thread, block) = (
        it.next().unwrap(),
        it.next().unwrap(),
        it.next().unwrap(),
        it.next().unwrap(),
    );
    // SAFETY: the parent passed this descriptor to us without CLOEXEC.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let rb = RingBuffer::attach(&fd).unwrap();
    let mode = if block == 1 {
        WriteMode::Block { timeout: None }
    } else {
        WriteMode::Drop
    };
    let results: Vec<(u64, u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|w| {
                let rb = &rb;
                s.spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (w + 1);
                    let mut buf = Vec::new();
                    let (mut ok, mut failed) = (0, 0);
                    for seq in 0..per_thread {
                        make_record(w, seq, &mut rng, &mut buf);
                        match rb.write_parts(&[&buf], mode) {
                            Ok(_) => ok += 1,
                            Err(WriteError::Full) => failed += 1,
                            Err(e) => panic!("writer {w}: {e}"),
                        }
                    }
                    (w, ok, failed)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (w, ok, failed) in results {
        println!("sent {w} {ok} {failed}");
    }
}

/// This test binary as a command. Under an emulator (the aarch64 tests
/// run by qemu-user, which cannot exec a foreign binary by itself),
/// `HEAPPROFD_TEST_RUNNER` holds the emulator's command line to prefix.
fn self_command() -> Command {
    let exe = std::env::current_exe().unwrap();
    let runner = std::env::var("HEAPPROFD_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(first) => {
            let mut c = Command::new(first);
            c.args(words).arg(exe);
            c
        }
        None => Command::new(exe),
    }
}

fn run_stress(data_size: u64, threads: u64, per_thread: u64, block: bool) {
    let (rb, fd) = RingBuffer::create(data_size).unwrap();
    // Let the child inherit the descriptor.
    // SAFETY: clearing FD_CLOEXEC on a descriptor we own.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) };
    let spec = format!("{},{threads},{per_thread},{}", fd.as_raw_fd(), block as u8);
    let mut child = self_command()
        .args([
            "--exact",
            "stress_child_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, spec)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    drop(fd);

    let mut reader = rb.reader();
    let mut buf = Vec::new();
    let mut next_seq = vec![0u64; threads as usize];
    let mut received = vec![0u64; threads as usize];
    let mut exited = None;
    loop {
        match reader.read(&mut buf) {
            ReadOutcome::Record(n) => {
                assert!(n >= 24, "short record {n}");
                let (body, tail) = buf.split_at(n - 8);
                let c = u64::from_le_bytes(tail.try_into().unwrap());
                assert_eq!(checksum(body), c, "checksum mismatch");
                let w = u64::from_le_bytes(body[..8].try_into().unwrap()) as usize;
                let seq = u64::from_le_bytes(body[8..16].try_into().unwrap());
                // FIFO per writer: sequence numbers only go up (drops leave gaps).
                assert!(
                    seq >= next_seq[w],
                    "writer {w}: seq {seq} after {}",
                    next_seq[w]
                );
                next_seq[w] = seq + 1;
                received[w] += 1;
            }
            ReadOutcome::Empty | ReadOutcome::Pending => {
                if let Some(status) = exited {
                    // The child is gone: nothing pending can still be committed.
                    assert!(
                        matches!(reader.read(&mut buf), ReadOutcome::Empty),
                        "{status:?}"
                    );
                    break;
                }
                if let Some(status) = child.try_wait().unwrap() {
                    exited = Some(status);
                } else {
                    std::thread::yield_now();
                }
            }
            ReadOutcome::Corrupt(c) => panic!("corrupt: {c:?}"),
        }
    }
    assert!(exited.unwrap().success());
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut total_failed = 0;
    let mut seen = 0;
    for line in out.lines() {
        let line = line.unwrap();
        // The harness may print "test stress_child_entry ... " on the same line.
        let Some(at) = line.find("sent ") else {
            continue;
        };
        let rest = &line[at + 5..];
        let v: Vec<u64> = rest.split(' ').map(|s| s.parse().unwrap()).collect();
        let (w, ok, failed) = (v[0] as usize, v[1], v[2]);
        assert_eq!(ok + failed, per_thread);
        assert_eq!(
            received[w], ok,
            "writer {w}: every committed record arrives intact"
        );
        total_failed += failed;
        seen += 1;
    }
    assert_eq!(seen, threads);
    let stats = reader.stats();
    assert_eq!(stats.writes_overflow, total_failed, "every drop is counted");
    assert_eq!(stats.reads_ok, received.iter().sum::<u64>());
    eprintln!(
        "stress: {} records arrived, {total_failed} dropped",
        stats.reads_ok
    );
    if block {
        assert_eq!(total_failed, 0);
    }
}

#[test]
fn stress_many_writers_in_child_process_drop_mode() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    // A small buffer forces wrap-around and overflows.
    run_stress(64 * 1024, 8, 150_000, false);
}

#[test]
fn stress_many_writers_in_child_process_block_mode() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    run_stress(256 * 1024, 8, 150_000, true);
}

#[test]
fn prefault_keeps_contents() {
    let (rb, fd) = RingBuffer::create(16 * PAGE).unwrap();
    rb.write_parts(&[b"before"], WriteMode::Drop).unwrap();
    let client = RingBuffer::attach(&fd).unwrap();
    // Supported on Linux 5.14+; either way the contents must not change.
    let _ = client.prefault();
    client.write_parts(&[b"after"], WriteMode::Drop).unwrap();
    assert_eq!(read_all(&rb), vec![b"before".to_vec(), b"after".to_vec()]);
}
