//! `record --pid` and `record -n` of running programs through root's
//! service, which loads the client with ptrace, with two unprivileged users
//! the test creates (`useradd`) and removes again (a guard removes them on
//! every exit; users left by a crashed run are removed first). Root only;
//! skipped with a message otherwise (CI runs it as root). The users are not
//! `service_users.rs`'s, so both tests may run at once.
//!
//! What must hold: user c's `record --pid` of c's own process is profiled
//! (exact at `-i 1` after the attach) into a trace owned by c, mode 0600;
//! c's `record --pid` of user d's process is refused (exit 1, named as
//! another user's) and d's process is left untouched (no client mapped);
//! c's `record -n NAME` loads the client into c's process of that name
//! only, not into d's.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use heapprofd_proto::service::DIR_ENV;
use heapprofd_tests::attach_harness::{Target, attach_programs, is_root};
use heapprofd_tests::record_harness::{check_trace, frame_is, release_bins, scratch_dir};
use heapprofd_tests::service_harness::{Service, signal, wait_exit, wait_for};
use heapprofd_tests::test_users::{TestUsers, uid_of};

const USERS: [&str; 2] = ["heapprofd-t13c", "heapprofd-t13d"];
const NAME: &str = "usrpid_target";

/// `heapprofd-rs record ARGS -o TRACE` as `user`, against the service in
/// `svc`.
fn record_as(user: &str, svc: &Path, args: &[&str], trace: &Path) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={user}"))
        .arg(format!("--regid={user}"))
        .arg("--init-groups")
        .arg(&release_bins().heapprofd)
        .arg("record")
        .args(args)
        .arg("-o")
        .arg(trace)
        .env(DIR_ENV, svc)
        .env_remove("HEAPPROFD_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `target 0` as user `uid`, named [`NAME`], without the client, its
/// environment pointing at the service in `svc`.
fn start_target(svc: &Path, uid: u32) -> Target {
    let mut c = Command::new(attach_programs().path("target"));
    std::os::unix::process::CommandExt::arg0(&mut c, NAME);
    c.arg("0")
        .env(DIR_ENV, svc)
        .env_remove("LD_PRELOAD")
        .env_remove("HEAPPROFD_SOCKET");
    Target::start_as(c, Some(uid))
}

/// Whether process `pid` has the client mapped.
fn has_client(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .expect("maps")
        .contains(heapprofd_proto::attach::CLIENT_FILE_NAME)
}

/// (allocations, bytes) of `pid` under `c_prealloc`; `keep n` makes
/// (n + 1, n * 1008): the array of n pointers and n blocks of 1000 bytes.
fn kept(trace: &Path, pid: u32) -> (u64, u64) {
    check_trace(trace)
        .latest()
        .iter()
        .filter(|s| s.pid == u64::from(pid) && s.frames.iter().any(|f| frame_is(f, "c_prealloc")))
        .fold((0, 0), |(n, b), s| (n + s.alloc_count, b + s.allocated))
}

#[test]
fn a_user_profiles_their_own_running_process_through_root_s_service_and_no_other() {
    if !is_root() {
        eprintln!(
            "service_users_pid: SKIPPED (needs root: it creates users and runs root's service)"
        );
        return;
    }
    let users = TestUsers::create(&USERS);
    let [c, d] = USERS;
    let (c_uid, d_uid) = (uid_of(c), uid_of(d));
    let dir = scratch_dir("service-users-pid");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let svc = Service::start(&dir.join("svc"));
    let mut mine = start_target(&svc.dir, c_uid);
    let mut theirs = start_target(&svc.dir, d_uid);

    // c's own process, by pid: profiled, the trace c's.
    let trace = shared.join("c.pftrace");
    let pid = mine.pid.to_string();
    let mut rec = record_as(c, &svc.dir, &["--pid", &pid, "-i", "1"], &trace)
        .spawn()
        .expect("record --pid as c");
    svc.wait_log(&format!("pid {pid} records"));
    assert_eq!(mine.cmd("keep 12"), "kept 12");
    signal(&rec, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec, "c's record --pid");
    assert_eq!(code, 0, "{err}\n{}", svc.log());
    assert!(err.contains("profiling through the service"), "{err}");
    let meta = std::fs::metadata(&trace).expect("c's trace");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (c_uid, 0o600));
    assert_eq!(kept(&trace, mine.pid), (13, 12 * 1008));

    // d's process, by pid: refused, untouched.
    let out = record_as(
        c,
        &svc.dir,
        &["--pid", &theirs.pid.to_string(), "-d", "300ms"],
        &shared.join("cd.pftrace"),
    )
    .output()
    .expect("record --pid of d's process as c");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "pid {} ({NAME}) belongs to another user: not profiled",
            theirs.pid
        )),
        "{}",
        text(&out)
    );

    // By name: c's process only.
    let trace = shared.join("c-name.pftrace");
    let mut rec = record_as(c, &svc.dir, &["-n", NAME, "-i", "1"], &trace)
        .spawn()
        .expect("record -n as c");
    // The service ended the first session inside it: this is a new one.
    wait_for("c's second session", || {
        svc.log().matches(&format!("pid {pid} records")).count() == 2
    });
    assert_eq!(mine.cmd("keep 5"), "kept 5");
    signal(&rec, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec, "c's record -n");
    assert_eq!(code, 0, "{err}\n{}", svc.log());
    assert_eq!(kept(&trace, mine.pid), (6, 5 * 1008));
    assert!(
        !has_client(theirs.pid),
        "the client was loaded into d's process"
    );
    assert_eq!(theirs.cmd("got"), "malloc=libc");
    assert_eq!(mine.cmd("got"), "malloc=libc");
    mine.quit();
    theirs.quit();
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "daemon failed:\n{log}");
    drop(users);
    let _ = std::fs::remove_dir_all(&dir);
}
