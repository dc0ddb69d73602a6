//! Driving the profiling service in tests: a `heapprofd-rs daemon` in a
//! scratch `HEAPPROFD_SERVICE_DIR` whose log lines a test can wait for,
//! `record` requests against it, programs started with the dormant client
//! preloaded, and waiting for files and lines without timing assumptions
//! (generous timeouts only catch hangs).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heapprofd_proto::service::{CONTROL_SOCKET, DIR_ENV, TRIGGERS_FILE};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::record_harness::{heapprofd, record_programs, release_bins};

/// How long a wait may take before the test calls it a hang.
pub const HANG: Duration = Duration::from_secs(120);

/// Waits until `cond` holds; panics (naming `what`) after [`HANG`].
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child killed on drop if the test failed before it ended.
#[derive(Debug)]
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Sends `sig` to a child.
pub fn signal(child: &Child, sig: i32) {
    let sig = Signal::try_from(sig).expect("a signal");
    kill(Pid::from_raw(child.id() as i32), sig).expect("kill");
}

/// Waits for a child to exit: its exit code and its stderr. The stderr
/// is read while waiting: a child with more to say than a pipe holds (the
/// summary of a few hundred processes) would otherwise block on it.
pub fn wait_exit(child: &mut Child, what: &str) -> (i32, String) {
    let reader = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
            err
        })
    });
    wait_for(what, || child.try_wait().ok().flatten().is_some());
    let code = child.wait().expect("wait").code().unwrap_or(-1);
    let err = reader
        .map(|r| r.join().expect("the stderr reader"))
        .unwrap_or_default();
    (code, err)
}

/// A running service and the lines of its log so far.
#[derive(Debug)]
pub struct Service {
    /// The daemon.
    pub child: Reaped,
    /// Its directory.
    pub dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
}

impl Service {
    /// Starts `heapprofd-rs daemon` in `dir`; returns once its control
    /// socket exists.
    pub fn start(dir: &Path) -> Service {
        Service::start_with_env(dir, &[])
    }

    /// [`Service::start`] with more variables in its environment.
    pub fn start_with_env(dir: &Path, vars: &[(&str, &str)]) -> Service {
        let control = dir.join(CONTROL_SOCKET);
        let _ = std::fs::remove_file(&control);
        let mut child = heapprofd()
            .arg("daemon")
            .envs(vars.iter().copied())
            .env(DIR_ENV, dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start heapprofd-rs daemon");
        let log = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take().expect("stderr");
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().expect("log").push(l);
            }
        });
        wait_for("the control socket", || control.exists());
        Service {
            child: Reaped(child),
            dir: dir.to_path_buf(),
            log,
        }
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.log.lock().expect("log").join("\n")
    }

    /// Waits until a log line contains `text`.
    pub fn wait_log(&self, text: &str) {
        wait_for(&format!("`{text}` in the service's log"), || {
            self.log
                .lock()
                .expect("log")
                .iter()
                .any(|l| l.contains(text))
        });
    }

    /// Waits until the trigger store holds `line` (e.g. `name 2 x`).
    pub fn wait_store(&self, line: &str) {
        let store = self.dir.join(TRIGGERS_FILE);
        wait_for(&format!("`{line}` in the trigger store"), || {
            std::fs::read_to_string(&store).is_ok_and(|s| s.lines().any(|l| l == line))
        });
    }

    /// Starts `heapprofd-rs record ARGS -o TRACE` against this service.
    pub fn record(&self, args: &[&str], trace: &Path) -> Reaped {
        Reaped(
            heapprofd()
                .arg("record")
                .args(args)
                .arg("-o")
                .arg(trace)
                .env(DIR_ENV, &self.dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start record"),
        )
    }

    /// SIGTERM: the service writes what is open and stops; its exit code
    /// and the rest of its log.
    pub fn stop(mut self) -> (i32, String) {
        signal(&self.child.0, libc::SIGTERM);
        wait_for("the service to stop", || {
            self.child.0.try_wait().ok().flatten().is_some()
        });
        let code = self.child.0.wait().expect("wait").code().unwrap_or(-1);
        (code, self.log())
    }
}

/// A command for `prog` with the client preloaded (dormant unless the
/// service in `svc` wants it), named `name` (its `argv[0]`, which the
/// service matches).
pub fn preloaded(svc: &Path, prog: &Path, name: &str) -> Command {
    let mut c = Command::new(prog);
    std::os::unix::process::CommandExt::arg0(&mut c, name);
    c.env("LD_PRELOAD", &release_bins().client_so)
        .env(DIR_ENV, svc)
        .env_remove("HEAPPROFD_SOCKET");
    c
}

/// Runs `prog ARGS` preloaded and named `name` to its end; its pid.
pub fn run_preloaded(svc: &Path, prog: &Path, name: &str, args: &[&str]) -> u32 {
    let mut child = preloaded(svc, prog, name)
        .args(args)
        .stdin(Stdio::null())
        .spawn()
        .expect("start the program");
    let pid = child.id();
    let st = child.wait().expect("wait for the program");
    assert!(st.success(), "{} failed: {st}", prog.display());
    pid
}

/// `stepper` (tests/programs/record): a program reading commands on stdin, preloaded and named `name`.
#[derive(Debug)]
pub struct Stepper {
    child: Reaped,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Its pid.
    pub pid: u32,
}

impl Stepper {
    /// Starts it; returns after its own start-up allocations.
    pub fn start(svc: &Path, name: &str) -> Stepper {
        Stepper::start_command(preloaded(svc, &record_programs().path("stepper"), name))
    }

    /// Starts `cmd` (a stepper with its environment set by the caller);
    /// returns after its own start-up allocations.
    pub fn start_command(mut cmd: Command) -> Stepper {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start stepper");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let pid = child.id();
        let mut s = Stepper {
            child: Reaped(child),
            stdin,
            stdout,
            pid,
        };
        // Its own start-up allocations are done before anyone wakes it.
        s.say("grow 1");
        s
    }

    /// Sends a command and waits for its answer.
    pub fn say(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").expect("write to stepper");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read from stepper");
        assert_eq!(line.trim_end(), format!("ok {cmd}"));
    }

    /// Closes its input: it exits 0.
    pub fn finish(self) {
        let Stepper {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        let st = child.0.wait().expect("wait for stepper");
        assert!(st.success(), "stepper: {st}");
    }
}
