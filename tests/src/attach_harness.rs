//! Helpers for the `record --pid` tests (`tests/tests/attach_e2e.rs`) and the
//! attach benchmark (`src/bin/heapprofd-attach-bench.rs`).
//!
//! * [`attach_programs`]: the programs of `tests/programs/attach/` compiled
//!   once per test process into a temporary directory (C, C++, Rust, a
//!   plugin library, a static and a 32-bit program), plus the paths of the
//!   Python and Node.js scripts.
//! * [`Target`]: a long-running target process with piped stdin/stdout,
//!   driven line by line (`cmd("work 1000")` returns its answer), killed
//!   (by its own pid) if a test fails.
//! * [`attach`]: runs `heapprofd-rs record --pid PID ARGS` to completion.
//! * [`client_thread`]: the profiler's thread in a process, if any.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use heapprofd_proto::attach::CLIENT_THREAD_NAME;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::client_harness::{Output, compile, run, workspace_root};
use crate::record_harness::heapprofd;

/// The compiled attach test programs.
#[derive(Debug)]
pub struct AttachPrograms {
    /// Directory holding the binaries.
    pub dir: PathBuf,
    /// Directory of the sources (scripts are run from there).
    pub src: PathBuf,
}

impl AttachPrograms {
    /// Path of a compiled program or library.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Path of a source file (the Python and Node.js targets).
    pub fn script(&self, name: &str) -> PathBuf {
        self.src.join(name)
    }
}

/// Compiles `tests/programs/attach/` once per process, with `-O2 -g` as a
/// normal build would (frame pointers omitted).
pub fn attach_programs() -> &'static AttachPrograms {
    static P: OnceLock<AttachPrograms> = OnceLock::new();
    P.get_or_init(|| {
        let src = workspace_root().join("tests/programs/attach");
        let dir =
            std::env::temp_dir().join(format!("heapprofd-attach-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let s = |f: &str| src.join(f).to_string_lossy().into_owned();
        let o = |f: &str| dir.join(f).to_string_lossy().into_owned();
        // (compiler, output, source, extra flags) with -O2 -g.
        let builds: [(&str, &str, &str, &[&str]); 10] = [
            ("gcc", "regs", "regs.c", &[]),
            ("gcc", "target", "target.c", &["-pthread", "-ldl"]),
            ("g++", "target_cxx", "target.cpp", &["-pthread"]),
            ("gcc", "busy", "busy.c", &["-pthread"]),
            ("gcc", "in_handler", "in_handler.c", &[]),
            ("gcc", "rounds", "rounds.c", &["-pthread"]),
            ("gcc", "libplugin.so", "plugin.c", &["-shared", "-fPIC"]),
            ("gcc", "sleeper", "sleeper.c", &[]),
            ("gcc", "sleeper_static", "sleeper.c", &["-static"]),
            ("rustc", "target_rs", "target.rs", &["--edition", "2021"]),
        ];
        for (cc, out, source, flags) in builds {
            let (out, source) = (o(out), s(source));
            let opt = if cc == "rustc" { "-O" } else { "-O2" };
            let mut args = vec![cc, opt, "-g", "-o", &out, &source];
            args.extend_from_slice(flags);
            compile(&args);
        }
        compile(&["as", "--32", "-o", &o("i386.o"), &s("i386.S")]);
        compile(&["ld", "-m", "elf_i386", "-o", &o("i386"), &o("i386.o")]);
        AttachPrograms { dir, src }
    })
}

/// A running target, driven through its stdin and stdout.
#[derive(Debug)]
pub struct Target {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Its pid.
    pub pid: u32,
}

/// Default timeout of one command (only against hangs).
pub const CMD_TIMEOUT: Duration = Duration::from_secs(120);

impl Target {
    /// Starts `cmd` with piped stdin and stdout and waits for its `ready`.
    pub fn start(cmd: Command) -> Target {
        Target::start_as(cmd, None)
    }

    /// [`Target::start`], running as user and group `uid` (root only).
    pub fn start_as(mut cmd: Command, uid: Option<u32>) -> Target {
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut t = Target {
            pid: child.id(),
            stdin: child.stdin.take(),
            child: Some(child),
            lines: rx,
        };
        let first = t.line(CMD_TIMEOUT);
        assert_eq!(first, "ready", "the target's first line");
        t
    }

    /// The next line of its stdout (panics after `timeout` or at EOF).
    pub fn line(&mut self, timeout: Duration) -> String {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => l,
            Err(e) => panic!("no line from target {} within {timeout:?}: {e}", self.pid),
        }
    }

    /// Sends a command and returns its one-line answer.
    pub fn cmd(&mut self, line: &str) -> String {
        self.send(line);
        self.line(CMD_TIMEOUT)
    }

    /// Sends one line.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write to the target's stdin");
        stdin.flush().expect("flush");
    }

    /// Sends `quit`, expects `bye` and exit status 0.
    pub fn quit(mut self) {
        self.send("quit");
        let bye = self.line(CMD_TIMEOUT);
        assert_eq!(bye, "bye");
        self.wait_exit(0);
    }

    /// Closes stdin and waits for the exit code `code`.
    pub fn wait_exit(&mut self, code: i32) {
        drop(self.stdin.take());
        let mut child = self.child.take().expect("child");
        let start = Instant::now();
        loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                assert_eq!(st.code(), Some(code), "exit status of target {}", self.pid);
                return;
            }
            if start.elapsed() > CMD_TIMEOUT {
                let _ = child.kill();
                panic!("target {} did not exit", self.pid);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends `sig` to the target.
    pub fn signal(&self, sig: i32) {
        // The pid is our child's.
        let _ = kill(
            Pid::from_raw(self.pid as i32),
            Signal::try_from(sig).expect("a signal"),
        );
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `heapprofd-rs record --pid PID ARGS` to completion.
pub fn attach(pid: u32, args: &[&str]) -> Output {
    attach_with(pid, args, &[])
}

/// [`attach`] with extra environment variables.
pub fn attach_with(pid: u32, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = heapprofd();
    c.arg("record").arg("--pid").arg(pid.to_string()).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    run(c, Duration::from_secs(300))
}

/// The thread of `pid` named `heapprofd-rs` (the client's), if any.
pub fn client_thread(pid: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|tid| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                .is_ok_and(|c| c.trim_end() == CLIENT_THREAD_NAME)
        })
}

/// A `kB` field of `/proc/PID/status` (`VmHWM`, `RssAnon`...), in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// Whether `path` is mapped in `pid`.
pub fn maps_contain(pid: u32, needle: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains(needle))
}

/// Whether we are root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether a program is on `PATH` (node may be missing on a dev machine).
pub fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `path` as a string.
pub fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}
