//! Helpers for running real programs under the client library.
//!
//! * [`client_so`]: the library to preload. `HEAPPROFD_CLIENT_SO=/path` wins;
//!   otherwise it is built with `cargo build -p heapprofd-client --release
//!   --lib` into the same target directory the tests run from
//!   (`CARGO_TARGET_DIR`, or the directory holding the test binary), which
//!   is a no-op after CI's `cargo build --release`.
//! * [`programs`]: the C, C++ and Rust test programs of
//!   `tests/programs/client/`, compiled once per test process with
//!   gcc/g++/rustc into a temporary directory.
//! * [`Receiver`]: a running `heapprofd-test-receiver`, with its output
//!   lines collected as they come.
//! * [`run`]: runs a command with a timeout (a hang is a test failure, not a
//!   stuck CI job).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The workspace root (parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The cargo target directory this process was built into.
pub fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("current_exe");
    exe.ancestors()
        .find(|a| a.join("CACHEDIR.TAG").exists())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Path of `libheapprofd_client.so` (built in release mode if needed).
pub fn client_so() -> PathBuf {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        if let Some(p) = std::env::var_os("HEAPPROFD_CLIENT_SO") {
            return PathBuf::from(p);
        }
        let target = target_dir();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "heapprofd-client", "--release", "--lib"])
            .env("CARGO_TARGET_DIR", &target)
            .current_dir(workspace_root())
            .status()
            .expect("run cargo build for the client library");
        assert!(status.success(), "building heapprofd-client failed");
        let so = target.join("release/libheapprofd_client.so");
        assert!(so.exists(), "{} missing", so.display());
        so
    })
    .clone()
}

/// Compiled test programs.
#[derive(Debug)]
pub struct Programs {
    /// Directory holding the binaries (and `libdlalloc.so`).
    pub dir: PathBuf,
}

impl Programs {
    /// Path of program `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Runs a compiler (or assembler, linker) command; panics with its stderr
/// if it fails. Shared by every harness.
pub fn compile(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "run {}: {e} (scripts/install-deps.sh installs the tools)",
                args[0]
            )
        });
    assert!(
        out.status.success(),
        "compiling failed: {args:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds every program in `tests/programs/client` (once per process).
pub fn programs() -> &'static Programs {
    static P: OnceLock<Programs> = OnceLock::new();
    P.get_or_init(|| {
        let src = workspace_root().join("tests/programs/client");
        let dir =
            std::env::temp_dir().join(format!("heapprofd-client-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let s = |f: &str| src.join(f).to_string_lossy().into_owned();
        let o = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let c_progs = [
            "churn",
            "forkexec",
            "signal",
            "exit_while_alloc",
            "exact",
            "dormant",
            "bench",
        ];
        for p in c_progs {
            let (src_f, out_f) = (s(&format!("{p}.c")), o(p));
            compile(&["gcc", "-O2", "-g", "-pthread", "-o", &out_f, &src_f]);
        }
        for p in ["dlopen_main", "dlopen_client"] {
            let (src_f, out_f) = (s(&format!("{p}.c")), o(p));
            compile(&["gcc", "-O2", "-g", "-pthread", "-o", &out_f, &src_f, "-ldl"]);
        }
        compile(&[
            "gcc",
            "-O2",
            "-g",
            "-shared",
            "-fPIC",
            "-o",
            &o("libdlalloc.so"),
            &s("dlalloc.c"),
        ]);
        compile(&[
            "gcc",
            "-O2",
            "-g",
            "-shared",
            "-fPIC",
            "-o",
            &o("libchain_shim.so"),
            &s("chain_shim.c"),
            "-ldl",
        ]);
        compile(&[
            "g++",
            "-O2",
            "-g",
            "-pthread",
            "-o",
            &o("cxx"),
            &s("cxx.cpp"),
        ]);
        compile(&[
            "rustc",
            "-O",
            "--edition",
            "2021",
            "-o",
            &o("rust_churn"),
            &s("rust_churn.rs"),
        ]);
        Programs { dir }
    })
}

/// A unique socket path for one test (short: `sun_path` holds 107 bytes).
pub fn unique_socket(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    PathBuf::from(format!(
        "/tmp/hpc-{}-{}-{tag}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Result of [`run`].
#[derive(Debug)]
pub struct Output {
    /// Exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Waits for `child` up to `timeout`; kills it and panics on a hang. Its
/// piped stdout and stderr are read concurrently, so a chatty child cannot
/// block on a full pipe.
pub fn wait_output(mut child: Child, timeout: Duration, what: &str) -> Output {
    fn drain<R: std::io::Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut s);
            }
            String::from_utf8_lossy(&s).into_owned()
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let start = Instant::now();
    let status = loop {
        match child.try_wait().expect("try_wait") {
            Some(st) => break st,
            None if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{what} hung for {timeout:?}; stdout:\n{}\nstderr:\n{}",
                    out.join().unwrap_or_default(),
                    err.join().unwrap_or_default()
                );
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    Output {
        code: status.code(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Runs `cmd` to completion (stdin closed) with a timeout.
pub fn run(mut cmd: Command, timeout: Duration) -> Output {
    let what = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    wait_output(child, timeout, &what)
}

/// A running `heapprofd-test-receiver`.
#[derive(Debug)]
pub struct Receiver {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// The socket it listens on.
    pub socket: PathBuf,
}

impl Receiver {
    /// Starts the receiver binary `bin` on `socket` with extra `args`, and
    /// waits until it listens.
    pub fn start(bin: &Path, socket: &Path, args: &[&str]) -> Receiver {
        let mut child = Command::new(bin)
            .arg("--socket")
            .arg(socket)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn receiver");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let r = Receiver {
            child,
            lines,
            socket: socket.to_path_buf(),
        };
        r.wait_line(|l| l.starts_with("listening"), Duration::from_secs(30))
            .expect("receiver did not start listening");
        r
    }

    /// Waits for a line matching `pred`.
    pub fn wait_line(&self, pred: impl Fn(&str) -> bool, timeout: Duration) -> Option<String> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(l) = self.lines.lock().unwrap().iter().find(|l| pred(l)) {
                return Some(l.clone());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Closes its stdin, waits for the summary, and returns every line.
    pub fn finish(mut self, timeout: Duration) -> Vec<String> {
        drop(self.child.stdin.take());
        let done = self.wait_line(|l| l.starts_with("done "), timeout);
        if done.is_none() {
            let _ = self.child.kill();
            panic!(
                "receiver did not finish; lines:\n{}",
                self.lines.lock().unwrap().join("\n")
            );
        }
        let _ = self.child.wait();
        self.lines.lock().unwrap().clone()
    }

    /// SIGKILLs the receiver.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One `session ...` summary line, as a map of its `key=value` fields.
#[derive(Debug, Clone)]
pub struct Session(pub HashMap<String, u64>);

impl Session {
    /// Field `k` (panics if missing: the line format is ours).
    pub fn get(&self, k: &str) -> u64 {
        *self
            .0
            .get(k)
            .unwrap_or_else(|| panic!("no field {k} in {self:?}"))
    }
}

/// Parses `key=value` fields of a line (numbers only; hex with `0x`).
pub fn fields(line: &str) -> HashMap<String, u64> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| {
            let n = match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => v.parse().ok(),
            };
            n.map(|n| (k.to_string(), n))
        })
        .collect()
}

/// Every session summary in the receiver's output.
pub fn sessions(lines: &[String]) -> Vec<Session> {
    lines
        .iter()
        .filter(|l| l.starts_with("session "))
        .map(|l| Session(fields(l)))
        .collect()
}
