//! Tests of the server: a handshake in flight when the daemon finishes.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdStream;

use heapprofd_proto::socket::{recv_with_fds, send_with_fds};
use heapprofd_proto::wire::{Arch, Handshake, version};

use super::*;

/// The client side of a handshake, as the client library does it.
fn client_handshake(sock: &StdStream) {
    let maps = File::open("/proc/self/maps").expect("maps");
    let mem = File::open("/proc/self/mem").expect("mem");
    let hs = Handshake {
        version: version::CURRENT,
        pid: std::process::id(),
        arch: Arch::native().expect("supported architecture"),
        page_size: 4096,
        flags: 0,
        client_text_start: 0,
        client_text_end: 0,
        unprofilable: heapprofd_proto::wire::Unprofilable::None,
    };
    send_with_fds(
        sock.as_raw_fd(),
        &hs.encode(),
        &[maps.as_raw_fd(), mem.as_raw_fd()],
    )
    .expect("sending the handshake");
    let mut buf = [0u8; ClientConfig::ENCODED_LEN];
    let mut fds: [Option<OwnedFd>; 1] = [None];
    let n = recv_with_fds(sock.as_raw_fd(), &mut buf, &mut fds).expect("config");
    assert_eq!(n, 1, "the configuration comes with the ring's memfd");
}

/// A program that connects, completes its handshake and exits while the
/// daemon is already finishing is still in the profile (record sees a
/// quick program exit before its session reaches a worker).
#[test]
fn finish_waits_for_a_handshake_in_flight() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("t.pftrace");
    let options = DaemonOptions {
        socket: dir.path().join("s.sock"),
        client: ClientConfig::new(4096, 1 << 20),
        workers: 1,
        symbolize: false,
        symbol_store: None,
        book: BookkeeperOptions {
            owns_interner: false,
            output: File::create(&out).expect("trace file"),
            output_path: out,
            interval: 4096,
            dump_at_max: false,
            symbolize: false,
        },
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (summary, client) = rt.block_on(async {
        let mut d = Daemon::start(options, Arc::new(Counters::default())).expect("start");
        d.serve();
        // Connected (queued or accepted) before the daemon finishes; the
        // handshake itself only comes while finish() already runs.
        let sock = StdStream::connect(d.socket_path()).expect("connect");
        let client = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            client_handshake(&sock);
        });
        let summary = tokio::task::spawn_blocking(move || d.finish())
            .await
            .expect("finish thread")
            .expect("finish");
        (summary, client)
    });
    client.join().expect("client thread");
    assert_eq!(summary.processes.len(), 1, "{:?}", summary.processes);
    assert_eq!(summary.processes[0].pid, std::process::id());
}
