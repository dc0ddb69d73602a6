//! The profiling service run by root for every user, with two unprivileged
//! users the test creates (`useradd`) and removes again (a guard removes
//! them on every exit, a panic included; users left by a crashed run are
//! removed first). Root only; skipped with a message otherwise (CI runs it
//! as root).
//!
//! What must hold: the directory is 0755 and the control socket 0666 (every
//! user may ask); the trigger store is root's, 0644 (a user cannot write
//! it); a user's `record -n` profiles only that user's processes (another
//! user's and root's, started with the same name and the client, run
//! normally, silently, and are not in the trace); the trace is owned by the user,
//! mode 0600 (the other user cannot read it); root's `record -n` profiles
//! every user's processes.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use heapprofd_proto::service::{CONTROL_SOCKET, DIR_ENV, TRIGGERS_FILE};
use heapprofd_tests::attach_harness::is_root;
use heapprofd_tests::record_harness::{check_trace, frame_is, release_bins, scratch_dir};
use heapprofd_tests::test_users::{TestUsers, uid_of};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const USERS: [&str; 2] = ["heapprofd-t13a", "heapprofd-t13b"];
const HANG: Duration = Duration::from_secs(60);

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `cmd` run as `user` (None: root), with the service directory set.
fn as_user(user: Option<&str>, svc: &Path, program: &Path) -> Command {
    let mut c = match user {
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={u}"))
                .arg(format!("--regid={u}"))
                .arg("--init-groups")
                .arg(program);
            c
        }
        None => Command::new(program),
    };
    c.env(DIR_ENV, svc)
        .env_remove("HEAPPROFD_SOCKET")
        .stdin(Stdio::null());
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `many_stacks N` as `user` with the client preloaded; its pid.
fn run_many_stacks(user: Option<&str>, svc: &Path, prog: &Path, n: u32) -> u32 {
    let child = as_user(user, svc, prog)
        .arg(n.to_string())
        .env("LD_PRELOAD", &release_bins().client_so)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start many_stacks");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait many_stacks");
    assert!(
        out.status.success(),
        "many_stacks as {user:?}: {}",
        text(&out)
    );
    // Profiled or refused, the program itself notices nothing.
    assert!(
        out.stderr.is_empty(),
        "many_stacks as {user:?} wrote to stderr: {}",
        text(&out)
    );
    pid
}

/// Starts `record -n many_stacks -i 1 -o TRACE` as `user`; waits until the
/// store names it.
fn start_record(user: Option<&str>, svc: &Path, trace: &Path) -> Child {
    let child = as_user(user, svc, &release_bins().heapprofd)
        .args(["record", "-n", "many_stacks", "-i", "1", "-o"])
        .arg(trace)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start record -n");
    wait_for("the trigger store", || {
        std::fs::read_to_string(svc.join(TRIGGERS_FILE)).is_ok_and(|s| s.contains("many_stacks"))
    });
    child
}

fn stop_record(child: Child) {
    // Our own child (setpriv execs record in place).
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGINT);
    let out = child.wait_with_output().expect("wait record -n");
    assert!(out.status.success(), "record -n: {}", text(&out));
}

/// Allocations of `stack_leaf` per pid in the trace.
fn leaf_count(trace: &Path, pid: u32) -> u64 {
    check_trace(trace)
        .samples
        .iter()
        .filter(|s| s.pid == u64::from(pid))
        .filter(|s| s.frames.iter().any(|f| frame_is(f, "stack_leaf")))
        .map(|s| s.alloc_count)
        .sum()
}

/// Kills the service when dropped.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        // Our own child.
        let _ = kill(Pid::from_raw(self.0.id() as i32), Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

#[test]
fn a_root_service_serves_each_user_only_their_own_processes() {
    if !is_root() {
        eprintln!("service_users: SKIPPED (needs root: it creates users and runs root's service)");
        return;
    }
    let users = TestUsers::create(&USERS);
    let [a, b] = USERS;
    let a_uid = uid_of(a);
    let dir = scratch_dir("service-users");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let shared: PathBuf = dir.join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let prog = dir.join("many_stacks");
    let src = heapprofd_tests::client_harness::workspace_root()
        .join("tests/programs/record/many_stacks.c");
    let st = Command::new("gcc")
        .args(["-O2", "-g", "-o"])
        .arg(&prog)
        .arg(&src)
        .status()
        .expect("gcc");
    assert!(st.success());

    let svc = dir.join("svc");
    let service = Service(
        Command::new(&release_bins().heapprofd)
            .arg("daemon")
            .env(DIR_ENV, &svc)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the service"),
    );
    wait_for("the control socket", || svc.join(CONTROL_SOCKET).exists());
    let mode = |p: &Path| std::fs::symlink_metadata(p).expect("metadata").mode() & 0o7777;
    assert_eq!(mode(&svc), 0o755, "service directory");
    assert_eq!(mode(&svc.join(CONTROL_SOCKET)), 0o666, "control socket");

    // User a's profile: only a's process is in it.
    let trace_a = shared.join("a.pftrace");
    let rec = start_record(Some(a), &svc, &trace_a);
    let store = std::fs::metadata(svc.join(TRIGGERS_FILE)).expect("store");
    assert_eq!(
        (store.uid(), store.mode() & 0o777),
        (0, 0o644),
        "the trigger store"
    );
    let write = as_user(Some(b), &svc, Path::new("/bin/sh"))
        .args(["-c", "echo 'name 1 x' >> \"$0\"/triggers || exit 1; exit 0"])
        .arg(&svc)
        .output()
        .expect("sh");
    assert!(!write.status.success(), "user b wrote the trigger store");
    let pid_a = run_many_stacks(Some(a), &svc, &prog, 40);
    let pid_b = run_many_stacks(Some(b), &svc, &prog, 30);
    let pid_root = run_many_stacks(None, &svc, &prog, 20);
    stop_record(rec);
    let meta = std::fs::metadata(&trace_a).expect("a's trace");
    assert_eq!(
        (meta.uid(), meta.mode() & 0o777),
        (a_uid, 0o600),
        "a's trace"
    );
    let read = as_user(Some(b), &svc, Path::new("/bin/cat"))
        .arg(&trace_a)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("cat");
    assert!(!read.success(), "user b read user a's trace");
    assert_eq!(leaf_count(&trace_a, pid_a), 40, "a's own process");
    assert_eq!(leaf_count(&trace_a, pid_b), 0, "b's process in a's profile");
    assert_eq!(
        leaf_count(&trace_a, pid_root),
        0,
        "root's process in a's profile"
    );

    // Root's profile: every user's process.
    let trace_root = dir.join("root.pftrace");
    let rec = start_record(None, &svc, &trace_root);
    let pid_b = run_many_stacks(Some(b), &svc, &prog, 30);
    let pid_root = run_many_stacks(None, &svc, &prog, 20);
    stop_record(rec);
    assert_eq!(
        leaf_count(&trace_root, pid_b),
        30,
        "b's process in root's profile"
    );
    assert_eq!(
        leaf_count(&trace_root, pid_root),
        20,
        "root's process in root's profile"
    );

    drop(service);
    drop(users);
    let _ = std::fs::remove_dir_all(&dir);
}
