//! `heapprofd-test-receiver`: a minimal stand-in for the daemon, for the
//! client's end-to-end tests and benchmarks. **A test tool, not the daemon.**
//!
//! It listens on a UNIX socket, answers every client's handshake with a
//! `ClientConfig` and a fresh ring buffer, drains and decodes every record,
//! and when its standard input is closed (and every client has gone) prints
//! one summary line per session, then `done sessions=N`:
//!
//! ```text
//! listening path=/tmp/x.sock
//! connected pid=123 flags=1 text_start=0x7f.. text_end=0x7f..
//! rec pid=123 seq=1 kind=malloc addr=0x... size=100 sample=100 stack=2048 flags=0
//! rec pid=123 seq=2 kind=free addr=0x...
//! session pid=123 flags=1 mallocs=1 sample_bytes=100 alloc_bytes=100 frees=1 ...
//! done sessions=1
//! ```
//!
//! `rec` lines only with `--records`; their `seq` is the record's number
//! among the session's mallocs and frees in ring order, as the daemon
//! numbers them (the client writes 0). With `--capture PREFIX`, every
//! session also writes `PREFIX.PID.cap`: what a daemon-side benchmark needs
//! to replay the session's unwinding offline (`daemon/benches/replay.rs`).
//! The file is a sequence of chunks `[tag u8][len u32 LE][len bytes]`:
//! `H` = `HPRSCAP1` + pid (u32 LE), `T` = the client's text range (two u64
//! LE), `M` = the text of `/proc/PID/maps` (at the handshake, and again
//! whenever it changed, checked before each drain), `R` = one record as
//! read from the ring. `--capture-max N` stops capturing records after N
//! (the session goes on being drained).
//!
//! Drain protocol (heapprofd's): read
//! until empty; if that batch had records, look again after 10 ms without
//! asking to be woken; if it had none, `pause_reader`, read once more, and
//! sleep in `poll` on the socket (a wake byte or EOF ends the sleep; 100 ms
//! at most).
//!
//! Usage: `heapprofd-test-receiver --socket PATH [--interval N] [--seed N]
//! [--block] [--stack-reuse] [--block-timeout-us N] [--shmem-size N] [--max-stack N] [--records]
//! [--stall-ms N] [--capture PREFIX] [--capture-max N]`

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Set when stdin closes: sessions still running are ended (shutdown flag
/// and socket shutdown, as the daemon does), drained, and summarised.
static STOP: AtomicBool = AtomicBool::new(false);

use heapprofd_proto::socket::{recv_with_fds, send_with_fds};
use heapprofd_proto::wire::{ClientConfig, Handshake, MallocHeader, Record};
use heapprofd_shmem::{ReadOutcome, RingBuffer};

#[derive(Debug, Clone)]
struct Options {
    socket: String,
    config: ClientConfig,
    records: bool,
    /// Milliseconds to wait after the handshake before reading anything
    /// (to fill the buffer and make block-mode writers time out).
    stall_ms: u64,
    /// Where to capture sessions (see the module docs), and how many records.
    capture: Option<(String, u64)>,
}

fn parse_args() -> Result<Options, String> {
    let mut socket = None;
    let mut config = ClientConfig::new(4096, 8 << 20);
    let mut records = false;
    let mut stall_ms = 0;
    let mut capture = None;
    let mut capture_max = u64::MAX;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or(format!("{name} needs a number"))
        };
        match a.as_str() {
            "--socket" => socket = args.next(),
            "--interval" => {
                config.sampling_interval = num("--interval")?;
                config.heaps[0].interval = config.sampling_interval;
            }
            "--seed" => config.seed = num("--seed")?,
            "--block" => config.flags |= ClientConfig::FLAG_BLOCK_CLIENT,
            "--stack-reuse" => config.flags |= ClientConfig::FLAG_STACK_REUSE,
            "--block-timeout-us" => config.block_timeout_us = num("--block-timeout-us")?,
            "--shmem-size" => config.shmem_size = num("--shmem-size")?,
            "--max-stack" => config.max_stack_bytes = num("--max-stack")?,
            "--records" => records = true,
            "--stall-ms" => stall_ms = num("--stall-ms")?,
            "--capture" => capture = args.next(),
            "--capture-max" => capture_max = num("--capture-max")?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Options {
        socket: socket.ok_or("--socket is required")?,
        config,
        records,
        stall_ms,
        capture: capture.map(|p| (p, capture_max)),
    })
}

/// What one session delivered.
#[derive(Debug, Default)]
struct Summary {
    pid: u32,
    flags: u32,
    mallocs: u64,
    sample_bytes: u64,
    alloc_bytes: u64,
    frees: u64,
    heap_names: u64,
    decode_errors: u64,
    corrupt: u64,
    overflow: u64,
    no_stack: u64,
    truncated: u64,
    stack_bytes: u64,
    /// Records whose sequence is not 0 (the client leaves it to the
    /// daemon since protocol version 7).
    seq_set: u64,
    /// The last malloc or free's number, in ring order (as the daemon
    /// numbers them; printed as `seq=`).
    last_seq: u64,
    sp_mismatch: u64,
    pending_at_end: u64,
    client_error: u32,
}

type Out = Arc<Mutex<std::io::Stdout>>;

fn say(out: &Out, line: &str) {
    let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

fn serve(stream: UnixStream, opts: &Options, out: &Out) -> Result<Summary, String> {
    let sock = stream.as_raw_fd();
    let mut buf = [0u8; Handshake::ENCODED_LEN];
    let mut fds: [Option<OwnedFd>; 2] = [None, None];
    recv_with_fds(sock, &mut buf, &mut fds).map_err(|e| format!("handshake: {e}"))?;
    let hs = Handshake::decode(&buf).map_err(|e| format!("handshake: {e}"))?;
    if fds.iter().any(Option::is_none) {
        return Err("handshake without the maps and mem descriptors".into());
    }
    let (rb, memfd) = RingBuffer::create(opts.config.shmem_size).map_err(|e| e.to_string())?;
    send_with_fds(sock, &opts.config.encode(), &[memfd.as_raw_fd()])
        .map_err(|e| format!("config: {e}"))?;
    drop(memfd);
    say(
        out,
        &format!(
            "connected pid={} flags={} text_start={:#x} text_end={:#x}",
            hs.pid, hs.flags, hs.client_text_start, hs.client_text_end
        ),
    );
    std::thread::sleep(std::time::Duration::from_millis(opts.stall_ms));
    let mut sum = Summary {
        pid: hs.pid,
        flags: hs.flags,
        ..Summary::default()
    };
    let mut capture = match &opts.capture {
        Some((prefix, max)) => Some(
            Capture::create(
                &format!("{prefix}.{}.cap", hs.pid),
                &hs,
                fds[0].take().expect("maps fd"),
                *max,
            )
            .map_err(|e| format!("capture: {e}"))?,
        ),
        None => None,
    };
    let mut reader = rb.reader();
    let mut rec = Vec::new();
    let mut eof = false;
    let mut idle_after_eof = 0;
    loop {
        // Drain everything there is.
        let mut got = 0u64;
        if let Some(c) = capture.as_mut() {
            c.maps().map_err(|e| format!("capture: {e}"))?;
        }
        let last = loop {
            match reader.read(&mut rec) {
                ReadOutcome::Record(_) => {
                    got += 1;
                    if let Some(c) = capture.as_mut() {
                        c.record(&rec).map_err(|e| format!("capture: {e}"))?;
                    }
                    account(&rec, &mut sum, opts.records.then_some(out));
                }
                other => break other,
            }
        };
        if let ReadOutcome::Corrupt(_) = last {
            sum.corrupt += 1;
            break;
        }
        if eof {
            match last {
                ReadOutcome::Empty => break,
                _ if got > 0 => continue,
                _ => {
                    // A writer died mid-record, or is about to commit.
                    idle_after_eof += 1;
                    if idle_after_eof > 200 {
                        sum.pending_at_end = 1;
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                }
            }
        }
        // Like the daemon: after a batch, come back a little later without
        // asking for a wake-up; only an empty buffer pauses the reader, and
        // then one more read closes the race with a writer that just
        // committed without seeing the flag.
        let timeout_ms = if got > 0 {
            10
        } else {
            rb.pause_reader();
            if let ReadOutcome::Record(_) = reader.read(&mut rec) {
                rb.unpause_reader();
                if let Some(c) = capture.as_mut() {
                    c.record(&rec).map_err(|e| format!("capture: {e}"))?;
                }
                account(&rec, &mut sum, opts.records.then_some(out));
                continue;
            }
            100
        };
        let mut pfd = libc::pollfd {
            fd: sock,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if pfd.revents != 0 {
            let mut b = [0u8; 256];
            // SAFETY: reading into our own buffer.
            let n = unsafe { libc::recv(sock, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
            if n == 0
                || (n < 0
                    && std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock)
            {
                eof = true;
            }
        }
        rb.unpause_reader();
        if STOP.load(Ordering::SeqCst) && !eof {
            rb.set_shutdown();
            // SAFETY: shutting down our own socket.
            unsafe { libc::shutdown(sock, libc::SHUT_RDWR) };
            eof = true;
        }
    }
    let stats = reader.stats();
    sum.overflow = stats.writes_overflow;
    sum.client_error = rb.client_error() as u32;
    rb.set_shutdown();
    Ok(sum)
}

/// A session being captured (see the module docs).
struct Capture {
    out: std::io::BufWriter<std::fs::File>,
    maps: std::fs::File,
    last_maps: String,
    left: u64,
}

impl Capture {
    fn create(path: &str, hs: &Handshake, maps: OwnedFd, max: u64) -> std::io::Result<Capture> {
        let mut c = Capture {
            out: std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?),
            maps: std::fs::File::from(maps),
            last_maps: String::new(),
            left: max,
        };
        let mut h = b"HPRSCAP1".to_vec();
        h.extend_from_slice(&hs.pid.to_le_bytes());
        c.chunk(b'H', &h)?;
        let mut t = hs.client_text_start.to_le_bytes().to_vec();
        t.extend_from_slice(&hs.client_text_end.to_le_bytes());
        c.chunk(b'T', &t)?;
        c.maps()?;
        Ok(c)
    }

    fn chunk(&mut self, tag: u8, bytes: &[u8]) -> std::io::Result<()> {
        self.out.write_all(&[tag])?;
        self.out.write_all(&(bytes.len() as u32).to_le_bytes())?;
        self.out.write_all(bytes)
    }

    /// Appends the maps if they changed (a process that exited reads as empty).
    fn maps(&mut self) -> std::io::Result<()> {
        use std::io::{Read, Seek};
        let mut text = String::new();
        self.maps.rewind()?;
        if self.maps.read_to_string(&mut text).is_err() || text.is_empty() || text == self.last_maps
        {
            return Ok(());
        }
        self.chunk(b'M', text.as_bytes())?;
        self.last_maps = text;
        Ok(())
    }

    fn record(&mut self, rec: &[u8]) -> std::io::Result<()> {
        if self.left == 0 {
            return Ok(());
        }
        self.left -= 1;
        self.chunk(b'R', rec)
    }
}

fn account(rec: &[u8], sum: &mut Summary, out: Option<&Out>) {
    match Record::decode(rec) {
        Ok(Record::Malloc(h, stack)) => {
            sum.mallocs += 1;
            sum.sample_bytes += h.sample_size;
            sum.alloc_bytes += h.alloc_size;
            sum.stack_bytes += stack.len() as u64;
            if h.flags & MallocHeader::FLAG_NO_STACK != 0 {
                sum.no_stack += 1;
            }
            if h.flags & MallocHeader::FLAG_STACK_TRUNCATED != 0 {
                sum.truncated += 1;
            }
            let (sp_slot, _) = h.arch.sp_ip_slots();
            if h.regs.0.get(sp_slot) != Some(&h.stack_pointer) {
                sum.sp_mismatch += 1;
            }
            if h.sequence != 0 {
                sum.seq_set += 1;
            }
            sum.last_seq += 1;
            if let Some(out) = out {
                say(
                    out,
                    &format!(
                        "rec pid={} seq={} kind=malloc addr={:#x} size={} sample={} stack={} flags={}",
                        sum.pid,
                        sum.last_seq,
                        h.address,
                        h.alloc_size,
                        h.sample_size,
                        stack.len(),
                        h.flags
                    ),
                );
            }
        }
        Ok(Record::Free(f)) => {
            sum.frees += 1;
            if f.sequence != 0 {
                sum.seq_set += 1;
            }
            sum.last_seq += 1;
            if let Some(out) = out {
                say(
                    out,
                    &format!(
                        "rec pid={} seq={} kind=free addr={:#x}",
                        sum.pid, sum.last_seq, f.address
                    ),
                );
            }
        }
        Ok(Record::HeapName(_)) => sum.heap_names += 1,
        // User context definitions: the context tests read them from traces.
        Ok(Record::Context(_)) => {}
        // Stack samples: the CPU-time tests read them from traces.
        Ok(Record::StackSample(..) | Record::EventName(_)) => {}
        Err(_) => sum.decode_errors += 1,
    }
}

fn summary_line(s: &Summary) -> String {
    format!(
        "session pid={} flags={} mallocs={} sample_bytes={} alloc_bytes={} frees={} heap_names={} \
         decode_errors={} corrupt={} overflow={} no_stack={} truncated={} stack_bytes={} \
         seq_set={} sp_mismatch={} pending_at_end={} client_error={}",
        s.pid,
        s.flags,
        s.mallocs,
        s.sample_bytes,
        s.alloc_bytes,
        s.frees,
        s.heap_names,
        s.decode_errors,
        s.corrupt,
        s.overflow,
        s.no_stack,
        s.truncated,
        s.stack_bytes,
        s.seq_set,
        s.sp_mismatch,
        s.pending_at_end,
        s.client_error
    )
}

fn main() {
    let opts = match parse_args() {
        Ok(o) => Arc::new(o),
        Err(e) => {
            eprintln!("heapprofd-test-receiver: {e}");
            std::process::exit(2);
        }
    };
    let _ = std::fs::remove_file(&opts.socket);
    let listener = UnixListener::bind(&opts.socket).unwrap_or_else(|e| {
        eprintln!("heapprofd-test-receiver: bind {}: {e}", opts.socket);
        std::process::exit(2);
    });
    let out: Out = Arc::new(Mutex::new(std::io::stdout()));
    say(&out, &format!("listening path={}", opts.socket));
    let summaries = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    loop {
        let mut pfds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds.
        if unsafe { libc::poll(pfds.as_mut_ptr(), 2, -1) } < 0 {
            continue;
        }
        if pfds[1].revents != 0 {
            let mut b = [0u8; 64];
            // SAFETY: reading stdin into our buffer.
            let n = unsafe { libc::read(0, b.as_mut_ptr().cast(), b.len()) };
            if n <= 0 {
                STOP.store(true, Ordering::SeqCst);
                break;
            }
        }
        if pfds[0].revents != 0 {
            let Ok((stream, _)) = listener.accept() else {
                continue;
            };
            let (opts, out, summaries) = (opts.clone(), out.clone(), summaries.clone());
            workers.push(std::thread::spawn(move || {
                match serve(stream, &opts, &out) {
                    Ok(s) => summaries.lock().unwrap_or_else(|e| e.into_inner()).push(s),
                    Err(e) => say(&out, &format!("error {e}")),
                }
            }));
        }
    }
    for w in workers {
        let _ = w.join();
    }
    let summaries = summaries.lock().unwrap_or_else(|e| e.into_inner());
    for s in summaries.iter() {
        say(&out, &summary_line(s));
    }
    say(&out, &format!("done sessions={}", summaries.len()));
    let _ = std::fs::remove_file(&opts.socket);
}
