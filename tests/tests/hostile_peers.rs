//! Hostile and broken peers against a running `record` (issue 10, §2).
//!
//! Each test starts `record -- stepper` (a program that allocates on
//! command), then the test process itself connects to record's socket and
//! misbehaves (`heapprofd_tests::hostile_peer`):
//!
//! * F1: 520 handshakes whose maps and mem descriptors are an `eventfd`
//!   (a read blocks forever); a genuine handshake must still be served.
//! * F2: `/tmp/perf-<pid>.map` is a FIFO (a blocking `open`) and a sample's
//!   pc is in an anonymous executable mapping (a JIT frame, named from
//!   the perf map).
//! * F3: `/dev/urandom` as the maps and mem descriptors, 8 at once.
//! * F4: a handshake sent one byte every 500 ms.
//! * F5: records of thousands of random heap ids with random sizes.
//! * F6: thousands of notices that the peer runs unprofiled.
//!
//! In every case `record` must finish when the program exits, exit 0, write
//! a trace that `check_trace.py --strict` accepts with the program's own
//! samples in it, and keep its peak RSS bounded. No assertion depends on
//! speed: the time limits only catch hangs, with margins of 5x or more
//! over the daemon's 2 s handshake deadline.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use heapprofd_tests::hostile_peer::{
    answer, closed_by_daemon, connect, genuine_session, peak_rss_kib, raise_fd_limit,
    record_socket, send_handshake,
};
use heapprofd_tests::record_harness::{
    Live, TraceSummary, check_trace, record_programs, scratch_dir,
};

/// The daemon's peak RSS must stay below this (a record of the stepper
/// peaks at a few tens of MiB; reading /dev/urandom 8 times at once took
/// 1.3 GB before).
const MAX_RSS_KIB: u64 = 300 << 10;

/// A running `record -- stepper` and where it listens.
struct Recording {
    live: Live,
    socket: PathBuf,
    trace: PathBuf,
}

impl Recording {
    fn start(tag: &str) -> Recording {
        let dir = scratch_dir(tag);
        let trace = dir.join("t.pftrace");
        let stepper = record_programs().path("stepper");
        // Every allocation is recorded (`-i 1`). At the default 4 KiB, the
        // 30 blocks of 1000 bytes the stepper keeps in `grow_site` all go
        // unsampled once in about 1,500 recordings (e^-7.3): the likeliest
        // reason a presence check failed once in the suite (70 reruns did
        // not repeat it). Now the check below is exact.
        let mut live = Live::start(
            &["-i", "1", "-o", &trace.to_string_lossy()],
            &[&stepper.to_string_lossy()],
        );
        live.step("grow 10");
        let socket = record_socket(live.pid);
        Recording {
            live,
            socket,
            trace,
        }
    }

    /// The program allocates more, exits; `record` must finish with a
    /// valid trace holding every one of the program's allocations, within
    /// a bounded RSS.
    fn finish(self) -> (TraceSummary, u64) {
        let (t, rss, _) = self.finish_with_stderr();
        (t, rss)
    }

    /// [`Recording::finish`], also giving record's stderr.
    fn finish_with_stderr(mut self) -> (TraceSummary, u64, String) {
        self.live.step("grow 20");
        let rss = peak_rss_kib(self.live.pid);
        let out = self.live.finish(Duration::from_secs(120));
        assert_eq!(out.code, Some(0), "record failed:\n{}", out.stderr);
        let t = check_trace(&self.trace);
        let grow = t
            .latest()
            .into_iter()
            .filter(|s| s.frames.iter().any(|f| f.contains("grow_site")))
            .map(|s| s.alloc_count)
            .sum::<u64>();
        // grow 10 and grow 20: all 30 of the program's blocks, whatever
        // the hostile peer did meanwhile.
        assert_eq!(grow, 30, "the program's own allocations in grow_site");
        eprintln!("record's peak RSS: {} MiB", rss >> 10);
        assert!(
            rss < MAX_RSS_KIB,
            "record's peak RSS was {} MiB (limit {} MiB)",
            rss >> 10,
            MAX_RSS_KIB >> 10
        );
        (t, rss, out.stderr)
    }
}

fn eventfd() -> OwnedFd {
    // SAFETY: eventfd returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0, "eventfd");
    // SAFETY: a fresh descriptor we own.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The dumps of this test process in a trace.
fn own_dumps(t: &TraceSummary) -> Vec<&serde_json::Value> {
    let me = u64::from(std::process::id());
    t.dumps
        .iter()
        .filter(|d| d["pid"].as_u64() == Some(me))
        .collect()
}

/// F1: descriptors that block on read tie up nothing: 520 such handshakes
/// (more than tokio's 512 blocking threads) are refused, a genuine
/// handshake is served meanwhile, and `record` finishes.
#[test]
fn blocking_descriptors_do_not_exhaust_the_daemon() {
    raise_fd_limit(8192);
    let r = Recording::start("f1");
    let efd = eventfd();
    let hostile: Vec<_> = (0..520)
        .map(|_| {
            let s = connect(&r.socket);
            let _ = send_handshake(&s, &[efd.as_raw_fd(), efd.as_raw_fd()]);
            s
        })
        .collect();
    // One deadline for all the answers (a daemon stuck on them answers none).
    let deadline = Instant::now() + Duration::from_secs(30);
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let refused = hostile
        .iter()
        .filter(|s| answer(s, left()) == Some(false))
        .count();
    eprintln!("{refused} of {} eventfd handshakes refused", hostile.len());
    assert_eq!(
        refused,
        hostile.len(),
        "an eventfd was taken for a maps file"
    );
    // Served while the hostile connections are still open.
    let s = genuine_session(&r.socket, Duration::from_secs(10));
    drop(s);
    r.finish();
    drop(hostile);
}

/// F2: a FIFO at `/tmp/perf-<pid>.map` (anyone can make one for any pid)
/// is not opened in a way that blocks; the JIT frame stays unnamed.
#[test]
fn fifo_perf_map_does_not_block_the_daemon() {
    let r = Recording::start("f2");
    let perf_map = PathBuf::from(format!("/tmp/perf-{}.map", std::process::id()));
    let _ = std::fs::remove_file(&perf_map);
    let c = std::ffi::CString::new(perf_map.to_string_lossy().as_bytes()).expect("path");
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let _cleanup = RemoveOnDrop(perf_map.clone());
    // An anonymous executable page: what a JIT's code looks like in the maps.
    // SAFETY: a fresh anonymous mapping, never unmapped while the test runs.
    let jit = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(jit, libc::MAP_FAILED);
    let mut s = genuine_session(&r.socket, Duration::from_secs(10));
    for i in 0..10u64 {
        assert!(s.malloc(0, 0x1000_0000 + i * 64, 64, jit as u64 + 0x10));
    }
    drop(s);
    let (t, _) = r.finish();
    let own: u64 = own_dumps(&t)
        .iter()
        .map(|d| d["alloc_count"].as_u64().unwrap_or(0))
        .max()
        .unwrap_or(0);
    assert_eq!(own, 10, "the JIT samples are in the trace");
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// F3: a device as maps and mem (`/dev/urandom`, 8 at once) is refused
/// before anything is read from it.
#[test]
fn endless_descriptors_do_not_bloat_the_daemon() {
    let r = Recording::start("f3");
    let urandom = std::fs::File::open("/dev/urandom").expect("/dev/urandom");
    let hostile: Vec<_> = (0..8)
        .map(|_| {
            let s = connect(&r.socket);
            send_handshake(&s, &[urandom.as_raw_fd(), urandom.as_raw_fd()]).expect("send");
            s
        })
        .collect();
    let answers: Vec<_> = hostile
        .iter()
        .map(|s| answer(s, Duration::from_secs(60)))
        .collect();
    eprintln!(
        "after 8 /dev/urandom handshakes: record's peak RSS {} MiB",
        peak_rss_kib(r.live.pid) >> 10
    );
    assert!(
        answers.iter().all(|a| *a == Some(false)),
        "/dev/urandom taken for a maps file: {answers:?}"
    );
    r.finish();
}

/// F4: the handshake has one deadline (2 s) from the connection on, not a
/// timeout per read: a peer sending a byte every 500 ms is cut off.
#[test]
fn slow_handshake_is_cut_off_at_its_deadline() {
    let r = Recording::start("f4");
    let maps = std::fs::File::open("/proc/self/maps").expect("maps");
    let mem = std::fs::File::open("/proc/self/mem").expect("mem");
    let bytes = heapprofd_tests::hostile_peer::handshake().encode();
    let s = connect(&r.socket);
    let start = Instant::now();
    let mut sent = 0;
    for (i, b) in bytes.iter().enumerate() {
        if closed_by_daemon(&s) {
            break;
        }
        let fds = if i == 0 {
            vec![maps.as_raw_fd(), mem.as_raw_fd()]
        } else {
            Vec::new()
        };
        if heapprofd_proto::socket::send_with_fds(s.as_raw_fd(), &[*b], &fds).is_err() {
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    let held = start.elapsed();
    let cut = closed_by_daemon(&s) || answer(&s, Duration::from_secs(1)) == Some(false);
    eprintln!(
        "slow handshake: {sent} of {} bytes sent, held {:.1} s, cut off: {cut}",
        bytes.len(),
        held.as_secs_f64()
    );
    assert!(
        cut && sent < bytes.len(),
        "a handshake dripping one byte per 500 ms was kept for {:.1} s ({sent} bytes)",
        held.as_secs_f64()
    );
    assert!(
        held < Duration::from_secs(10),
        "the daemon held the handshake for {held:?} (deadline 2 s)"
    );
    r.finish();
}

/// F5: heap ids are bounded per process; records of heaps beyond the bound
/// are dropped and the process is flagged `hit_guardrail` in the trace.
#[test]
fn random_heap_ids_are_bounded_and_flagged() {
    let r = Recording::start("f5");
    let mut s = genuine_session(&r.socket, Duration::from_secs(10));
    let pc = random_heap_ids_are_bounded_and_flagged as fn() as usize as u64;
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut written = 0;
    for i in 0..4000u64 {
        let heap = next() as u32;
        if i % 2 == 0 {
            s.heap_name(heap, &format!("h{heap}"), 4096);
        }
        if s.malloc(heap, 0x1000_0000 + i * 64, next() >> 8, pc) {
            written += 1;
        }
        if i % 256 == 255 {
            // Let the daemon drain (its 10 ms poll) so few records are dropped.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(written > 1000, "only {written} records fit the ring buffer");
    drop(s);
    let trace = r.trace.clone();
    let (t, _) = r.finish();
    let own = own_dumps(&t);
    let mut heaps: Vec<&str> = own.iter().filter_map(|d| d["heap_name"].as_str()).collect();
    heaps.sort_unstable();
    heaps.dedup();
    eprintln!("{} heaps of our pid in {}", heaps.len(), trace.display());
    assert!(!own.is_empty(), "no dump of the hostile process");
    // libc.malloc and the 256 custom heaps a client may register.
    let limit = heapprofd_proto::wire::MAX_CUSTOM_HEAPS as usize + 1;
    assert!(
        heaps.len() <= limit,
        "{} heaps for one process (at most {limit})",
        heaps.len()
    );
    assert!(
        own.iter()
            .all(|d| d["hit_guardrail"] == serde_json::Value::Bool(true)),
        "the process that hit the heap limit is not flagged hit_guardrail"
    );
    let stepper_flagged = t
        .dumps
        .iter()
        .filter(|d| d["pid"].as_u64() != Some(u64::from(std::process::id())))
        .any(|d| d["hit_guardrail"] == serde_json::Value::Bool(true));
    assert!(!stepper_flagged, "the well-behaved program was flagged");
}

/// F6: a peer that says thousands of times that it runs unprofiled is
/// noted once: one warning, one process in the trace, flagged.
#[test]
fn repeated_unprofiled_notices_are_noted_once() {
    let r = Recording::start("f6");
    let notice = heapprofd_proto::wire::Handshake {
        unprofilable: heapprofd_proto::wire::Unprofilable::StaticProgram,
        ..heapprofd_tests::hostile_peer::handshake()
    };
    // The daemon may refuse a connection it has no room for (at most 128
    // pending): such a notice is not sent, and not counted.
    let mut sent = 0;
    for _ in 0..2000 {
        let Ok(sock) = std::os::unix::net::UnixStream::connect(&r.socket) else {
            continue;
        };
        if heapprofd_proto::socket::send_with_fds(sock.as_raw_fd(), &notice.encode(), &[]).is_ok() {
            sent += 1;
        }
    }
    assert!(sent >= 100, "only {sent} of 2000 notices could be sent");
    let (t, _, stderr) = r.finish_with_stderr();
    let me = std::process::id();
    let warnings = stderr
        .lines()
        .filter(|l| l.contains(&format!("pid {me} ")) && l.contains("runs unprofiled"))
        .count();
    eprintln!("{warnings} warnings for {sent} notices");
    assert!(
        (1..=2).contains(&warnings),
        "{warnings} warnings about pid {me} running unprofiled ({sent} notices sent; want it said once)\n{stderr}"
    );
    let own = own_dumps(&t);
    assert!(!own.is_empty(), "the notices left no trace of pid {me}");
    let mut heaps: Vec<&str> = own.iter().filter_map(|d| d["heap_name"].as_str()).collect();
    heaps.dedup();
    assert_eq!(
        heaps.len(),
        1,
        "one (empty) heap for the notices: {heaps:?}"
    );
}

/// A `record` killed with SIGKILL leaves its socket behind; the next
/// `record` of the same user removes it at start. Sockets live in a
/// private directory of the user (mode 0700, owned by us).
#[test]
fn stale_sockets_of_killed_records_are_removed() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let killed = Recording::start("stale-killed");
    let stale = killed.socket.clone();
    let dir = stale
        .parent()
        .expect("the socket's directory")
        .to_path_buf();
    let meta = std::fs::metadata(&dir).expect("the runtime directory");
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o700,
        "{}",
        dir.display()
    );
    assert_eq!(
        meta.uid(),
        nix::unistd::geteuid().as_raw(),
        "{}",
        dir.display()
    );
    killed.live.signal(libc::SIGKILL);
    let out = killed
        .live
        .finish_killing_leftovers(Duration::from_secs(60));
    assert_eq!(out.code, None, "record was killed");
    assert!(stale.exists(), "a killed record leaves {}", stale.display());
    let next = Recording::start("stale-next");
    assert_eq!(next.socket.parent(), Some(dir.as_path()));
    assert!(
        !stale.exists(),
        "the next record left the stale socket {} of a killed one",
        stale.display()
    );
    next.finish();
}
