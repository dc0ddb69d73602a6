//! `heapprofd-rs install` / `uninstall`: the dormant client in every new
//! process through `/etc/ld.so.preload`.
//!
//! * Below a scratch root (`--root`, nothing of the real system touched):
//!   `--dry-run` changes nothing, a second install changes nothing,
//!   uninstall gives back every file byte for byte (with its mode), a
//!   library of another build is refused unless `--force`; without root the
//!   real install is refused (exit 1).
//! * On the real system (root only; skipped with a message otherwise, CI
//!   runs it as root): install, then real programs started afterwards load
//!   the client and work (bash, coreutils, dpkg, apt-get --simulate, git,
//!   gcc, python3, perl, sqlite3, node and sudo if present, a set-user-ID
//!   program as `nobody`, su, a
//!   static program, a second copy of the client in `LD_PRELOAD`); a
//!   startup profile by name through the service catches a program that
//!   has no `LD_PRELOAD` of its own; `record -- CMD` still works beside the
//!   installed client (it preloads the installed copy); then uninstall, and
//!   `/etc/ld.so.preload` and the install's directories are as before. A
//!   guard uninstalls on every exit (a panic included), and a stale install
//!   of a crashed run is removed first. The installed window lasts about a
//!   second: every process started on the machine meanwhile loads the
//!   client.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use heapprofd_proto::service::{CONTROL_SOCKET, DIR_ENV, TRIGGERS_FILE};
use heapprofd_tests::attach_harness::{have, is_root};
use heapprofd_tests::record_harness::{
    check_trace, frame_is, heapprofd, release_bins, scratch_dir,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const PRELOAD: &str = "/etc/ld.so.preload";
const LIB: &str = "/usr/lib/heapprofd-rs/preload/libheapprofd_client.so";
const STATE: &str = "/var/lib/heapprofd-rs/install.json";
const HANG: Duration = Duration::from_secs(60);

fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.stdin(Stdio::null()).output().expect(what);
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn hp(args: &[&str]) -> Output {
    heapprofd()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run heapprofd-rs")
}

/// Every file below `root`: path -> (mode, bytes).
fn tree(root: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    fn walk(d: &Path, out: &mut BTreeMap<PathBuf, (u32, Vec<u8>)>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).expect("metadata");
            if m.is_dir() {
                out.insert(p.clone(), (m.mode(), Vec::new()));
                walk(&p, out);
            } else {
                out.insert(p.clone(), (m.mode(), std::fs::read(&p).expect("read")));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, &mut out);
    out
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn install_below_a_root_is_idempotent_and_uninstall_restores_every_byte() {
    let dir = scratch_dir("install-root");
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("etc")).expect("mkdir");
    let preload = root.join("etc/ld.so.preload");
    // No final newline, a comment, an odd mode: all must come back.
    std::fs::write(&preload, b"# keep me\n/lib/other.so:/lib/more.so").expect("write");
    std::fs::set_permissions(
        &preload,
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .expect("chmod");
    let before = tree(&root);
    let r = root.to_string_lossy().into_owned();

    let o = hp(&["install", "--root", &r, "--dry-run"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("would add the line"), "{}", text(&o));
    assert_eq!(tree(&root), before, "--dry-run changed files");

    let o = hp(&["install", "--root", &r]);
    assert!(o.status.success(), "install failed: {}", text(&o));
    let written = std::fs::read(&preload).expect("read");
    assert_eq!(
        written,
        format!("# keep me\n/lib/other.so:/lib/more.so\n{LIB}\n").as_bytes()
    );
    let lib = root.join(LIB.trim_start_matches('/'));
    assert_eq!(
        std::fs::read(&lib).expect("installed library"),
        std::fs::read(&release_bins().client_so).expect("built library")
    );
    assert!(root.join(STATE.trim_start_matches('/')).is_file());
    let installed = tree(&root);
    let o = hp(&["install", "--root", &r]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("nothing changed"), "{}", text(&o));
    assert_eq!(tree(&root), installed, "a second install changed files");

    let o = hp(&["uninstall", "--root", &r, "--dry-run"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(tree(&root), installed, "uninstall --dry-run changed files");
    let o = hp(&["uninstall", "--root", &r]);
    assert!(o.status.success(), "uninstall failed: {}", text(&o));
    assert_eq!(tree(&root), before, "uninstall left the root changed");
    let o = hp(&["uninstall", "--root", &r]);
    assert!(text(&o).contains("not installed"), "{}", text(&o));

    // A preload file that is a symbolic link: refused, nothing changed.
    std::fs::rename(&preload, root.join("etc/real-preload")).expect("mv");
    std::os::unix::fs::symlink("real-preload", &preload).expect("ln -s");
    let linked = tree(&root);
    let o = hp(&["install", "--root", &r]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("symbolic link"), "{}", text(&o));
    assert_eq!(tree(&root), linked);
    std::fs::remove_file(&preload).expect("rm");
    std::fs::rename(root.join("etc/real-preload"), &preload).expect("mv");

    // No preload file at first: none after the uninstall.
    std::fs::remove_file(&preload).expect("rm");
    let before = tree(&root);
    assert!(hp(&["install", "--root", &r]).status.success());
    assert_eq!(
        std::fs::read(&preload).expect("read"),
        format!("{LIB}\n").as_bytes()
    );
    assert!(hp(&["uninstall", "--root", &r]).status.success());
    assert_eq!(tree(&root), before);

    // Four installs at once (they take turns): one line, then four
    // uninstalls at once: nothing left.
    let many = |cmd: &str| {
        let children: Vec<_> = (0..4)
            .map(|_| {
                heapprofd()
                    .args([cmd, "--root", &r])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn")
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().expect("wait");
            assert!(out.status.success(), "concurrent {cmd}: {}", text(&out));
        }
    };
    many("install");
    assert_eq!(
        std::fs::read(&preload).expect("read"),
        format!("{LIB}\n").as_bytes()
    );
    many("uninstall");
    assert_eq!(tree(&root), before);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A copy of the built library whose build tag says another build.
fn library_of_another_build(dir: &Path) -> PathBuf {
    let mut bytes = std::fs::read(&release_bins().client_so).expect("read the library");
    let tag = heapprofd_proto::BUILD_TAG.as_bytes();
    let at = bytes
        .windows(tag.len())
        .position(|w| w == tag)
        .expect("the build tag in the library");
    // The last hex digit of the protocol hash, changed.
    let last = at + tag.len() - 1;
    bytes[last] = if bytes[last] == b'0' { b'1' } else { b'0' };
    let p = dir.join("libheapprofd_client.so");
    std::fs::write(&p, bytes).expect("write");
    p
}

#[test]
fn a_library_of_another_build_is_refused_unless_forced() {
    let dir = scratch_dir("install-tag");
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("etc")).expect("mkdir");
    let r = root.to_string_lossy().into_owned();
    let other = library_of_another_build(&dir);
    let o = other.to_string_lossy().into_owned();

    // This binary installing another build's library.
    let out = hp(&["install", "--root", &r, "--client-lib", &o]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("was not built with this binary"),
        "{}",
        text(&out)
    );
    assert!(!root.join("etc/ld.so.preload").exists());

    // Another build's library installed already.
    assert!(
        hp(&["install", "--root", &r, "--client-lib", &o, "--force"])
            .status
            .success()
    );
    let out = hp(&["install", "--root", &r]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("--force"), "{}", text(&out));
    assert!(text(&out).contains("build tag"), "{}", text(&out));
    let out = hp(&["install", "--root", &r, "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read(root.join(LIB.trim_start_matches('/'))).expect("read"),
        std::fs::read(&release_bins().client_so).expect("read")
    );
    assert!(hp(&["uninstall", "--root", &r]).status.success());
    assert_eq!(
        tree(&root).keys().cloned().collect::<Vec<_>>(),
        vec![root.join("etc")]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_real_install_needs_root() {
    let mut c = heapprofd();
    if is_root() {
        c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&release_bins().heapprofd);
    }
    for cmd in ["install", "uninstall"] {
        let mut c2 = Command::new(c.get_program());
        c2.args(c.get_args()).arg(cmd);
        let out = c2.stdin(Stdio::null()).output().expect("run");
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(text(&out).contains("needs root"), "{}", text(&out));
    }
}

/// Two copies of the client in one process (another path or build in
/// `LD_PRELOAD` beside the installed one): the first interposes and
/// profiles, the second stays inert; once they forwarded calls to each
/// other for ever. No root needed: both copies come from `LD_PRELOAD`.
#[test]
fn two_copies_of_the_client_in_one_process_profile_once() {
    let dir = scratch_dir("two-copies");
    let copy_dir = dir.join("copy");
    std::fs::create_dir_all(&copy_dir).expect("mkdir");
    let copy = copy_dir.join("libheapprofd_client.so");
    std::fs::copy(&release_bins().client_so, &copy).expect("copy the library");
    let prog = dir.join("many_stacks");
    let src = heapprofd_tests::client_harness::workspace_root()
        .join("tests/programs/record/many_stacks.c");
    run_ok(
        Command::new("gcc")
            .args(["-O2", "-g", "-o"])
            .arg(&prog)
            .arg(&src),
        "gcc many_stacks",
    );
    let both = format!("{}:{}", release_bins().client_so.display(), copy.display());
    // Dormant: runs and ends.
    let child = Command::new(&prog)
        .arg("5")
        .env("LD_PRELOAD", &both)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let out = heapprofd_tests::client_harness::wait_output(child, HANG, "two copies, dormant");
    assert_eq!(out.code, Some(0), "two copies, dormant: {}", out.stderr);
    // Profiled: each allocation once.
    let trace = dir.join("two.pftrace");
    let out = hp_record(&trace, &both, &prog);
    assert!(
        out.status.success(),
        "record with two copies: {}",
        text(&out)
    );
    let n: u64 = check_trace(&trace)
        .samples
        .iter()
        .filter(|s| s.frames.iter().any(|f| frame_is(f, "stack_leaf")))
        .map(|s| s.alloc_count)
        .sum();
    assert_eq!(n, 7);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `record -i 1 -o TRACE -- env LD_PRELOAD=PRELOAD PROG 7`.
fn hp_record(trace: &Path, preload: &str, prog: &Path) -> Output {
    heapprofd()
        .args(["record", "-i", "1", "-o"])
        .arg(trace)
        .arg("--")
        .arg("env")
        .arg(format!("LD_PRELOAD={preload}"))
        .arg(prog)
        .arg("7")
        .stdin(Stdio::null())
        .output()
        .expect("record")
}

/// What the real install may change, as it is now.
#[derive(Debug, PartialEq, Eq)]
struct System {
    preload: Option<(u32, u32, Vec<u8>)>,
    lib_dir: bool,
    state_dir: bool,
}

fn system() -> System {
    System {
        preload: std::fs::metadata(PRELOAD).ok().map(|m| {
            (
                m.mode(),
                m.uid(),
                std::fs::read(PRELOAD).unwrap_or_default(),
            )
        }),
        lib_dir: Path::new("/usr/lib/heapprofd-rs").exists(),
        state_dir: Path::new("/var/lib/heapprofd-rs").exists(),
    }
}

/// Uninstalls when dropped (the test's end, or a panic).
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let out = hp(&["uninstall"]);
        if !out.status.success() {
            eprintln!("system_install: uninstall failed: {}", text(&out));
        }
    }
}

fn names_lib(maps_of: &str) -> bool {
    maps_of.contains(LIB)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn system_wide_install_keeps_the_machine_working_and_uninstall_leaves_no_trace() {
    if !is_root() {
        eprintln!("system_install: SKIPPED (needs root: it installs into /etc/ld.so.preload)");
        return;
    }
    // A crashed earlier run's install: removed before anything else.
    if Path::new(STATE).exists()
        || std::fs::read(PRELOAD).is_ok_and(|b| String::from_utf8_lossy(&b).contains(LIB))
    {
        eprintln!("system_install: removing a stale install of an earlier run");
        let out = hp(&["uninstall"]);
        assert!(out.status.success(), "stale uninstall: {}", text(&out));
    }
    let dir = scratch_dir("system-install");
    let before = system();
    // Everything compiled before the window opens.
    let many_stacks = dir.join("many_stacks");
    let src = heapprofd_tests::client_harness::workspace_root()
        .join("tests/programs/record/many_stacks.c");
    run_ok(
        Command::new("gcc")
            .args(["-O2", "-g", "-o"])
            .arg(&many_stacks)
            .arg(&src),
        "gcc many_stacks",
    );
    let hello_c = dir.join("hello.c");
    std::fs::write(
        &hello_c,
        "#include <stdio.h>\n#include <stdlib.h>\nint main(void){char*p=malloc(64);\
         snprintf(p,64,\"hello %d\",6*7);puts(p);free(p);return 0;}\n",
    )
    .expect("write hello.c");
    let hello_static = dir.join("hello-static");
    run_ok(
        Command::new("gcc")
            .args(["-O2", "-static", "-o"])
            .arg(&hello_static)
            .arg(&hello_c),
        "gcc -static hello.c",
    );
    let svc = dir.join("svc");
    let trace = dir.join("named.pftrace");
    let rec_trace = dir.join("record.pftrace");
    let start = Instant::now();

    let out = hp(&["install"]);
    let guard = Installed;
    assert!(out.status.success(), "install failed: {}", text(&out));
    let out = hp(&["install"]);
    assert!(text(&out).contains("nothing changed"), "{}", text(&out));

    // Every new process loads the client.
    let maps = run_ok(Command::new("cat").arg("/proc/self/maps"), "cat maps");
    assert!(
        names_lib(&maps),
        "a new process did not load {LIB}:\n{maps}"
    );
    let sh = |script: &str| run_ok(Command::new("bash").args(["-c", script]), script);
    assert_eq!(sh("echo $((6*7))"), "42\n");
    assert_eq!(
        sh("printf 'b\\na\\n' | sort | tr a-z A-Z | sha256sum | cut -c1-8"),
        run_ok(
            Command::new("sh").args(["-c", "printf 'A\\nB\\n' | sha256sum | cut -c1-8"]),
            "sha"
        )
    );
    assert!(sh("ls -d /etc /usr").contains("/usr"));
    assert!(
        sh("dpkg -l coreutils").contains("ii  coreutils"),
        "dpkg -l coreutils"
    );
    // apt-get, read-only: a simulated install of a package that is there.
    let coreutils = sh("dpkg-query -W -f='${Version}' coreutils");
    let apt = sh("apt-get --simulate install coreutils");
    assert!(
        apt.contains(&format!(
            "coreutils is already the newest version ({coreutils})"
        )),
        "apt-get --simulate install coreutils: {apt}"
    );
    let repo = dir.join("repo");
    let g = |args: &[&str]| {
        run_ok(
            Command::new("git")
                .arg("-C")
                .arg(&repo)
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args),
            "git",
        )
    };
    std::fs::create_dir_all(&repo).expect("mkdir repo");
    g(&["init", "-q"]);
    std::fs::write(repo.join("f"), "x\n").expect("write");
    g(&["add", "f"]);
    g(&["commit", "-q", "-m", "one"]);
    assert_eq!(g(&["log", "--format=%s"]), "one\n");
    assert_eq!(g(&["status", "--porcelain"]), "");
    let hello = dir.join("hello");
    run_ok(
        Command::new("gcc")
            .args(["-O2", "-o"])
            .arg(&hello)
            .arg(&hello_c),
        "gcc hello.c",
    );
    assert_eq!(run_ok(&mut Command::new(&hello), "hello"), "hello 42\n");
    // A second copy of the client in `LD_PRELOAD`: the program runs.
    let st = Command::new(&many_stacks)
        .arg("5")
        .env("LD_PRELOAD", &release_bins().client_so)
        .status()
        .expect("many_stacks with a second copy");
    assert!(st.success(), "many_stacks with a second copy: {st}");
    // A static program never reads the preload file: it just runs.
    assert_eq!(
        run_ok(&mut Command::new(&hello_static), "hello-static"),
        "hello 42\n"
    );
    assert_eq!(
        run_ok(
            Command::new("/usr/bin/python3").args([
                "-c",
                "import json,sqlite3;print(json.dumps(sum(range(100))))"
            ]),
            "python3"
        ),
        "4950\n"
    );
    assert_eq!(
        run_ok(
            Command::new("perl")
                .args(["-e", "print join(',', sort { $a <=> $b } (3,1,2)), qq(\\n)"]),
            "perl"
        ),
        "1,2,3\n"
    );
    assert_eq!(
        run_ok(
            Command::new("sqlite3").args([":memory:", "select 6*7;"]),
            "sqlite3"
        ),
        "42\n"
    );
    if have("node") {
        assert_eq!(
            run_ok(
                Command::new("node").args(["-e", "console.log([3,1,2].sort().join(','))"]),
                "node"
            ),
            "1,2,3\n"
        );
    } else {
        eprintln!("system_install: node not installed, not run");
    }
    // A set-user-ID program run by an unprivileged user (the dynamic linker
    // is in secure mode: /etc/ld.so.preload still applies).
    let mount = run_ok(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["/usr/bin/mount", "--version"]),
        "mount --version as nobody",
    );
    assert!(mount.contains("util-linux"), "{mount}");
    let su = run_ok(
        Command::new("su").args(["nobody", "-s", "/bin/sh", "-c", "id -un"]),
        "su nobody",
    );
    assert_eq!(su, "nobody\n");
    if have("sudo") {
        let sudo = run_ok(
            Command::new("sudo").args(["-n", "-u", "nobody", "id", "-un"]),
            "sudo -u nobody",
        );
        assert_eq!(sudo, "nobody\n");
    } else {
        eprintln!("system_install: sudo not installed, not run");
    }

    // A startup profile by name: the program has no LD_PRELOAD, only the
    // installed client.
    let mut service = heapprofd()
        .arg("daemon")
        .env(DIR_ENV, &svc)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the service");
    wait_for("the control socket", || svc.join(CONTROL_SOCKET).exists());
    let rec = heapprofd()
        .args(["record", "-n", "many_stacks", "-i", "1", "-o"])
        .arg(&trace)
        .env(DIR_ENV, &svc)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start record -n");
    wait_for("the trigger store", || {
        std::fs::read_to_string(svc.join(TRIGGERS_FILE)).is_ok_and(|s| s.contains("many_stacks"))
    });
    let mut prog = Command::new(&many_stacks);
    prog.arg("40").env(DIR_ENV, &svc).env_remove("LD_PRELOAD");
    let child = prog.spawn().expect("start many_stacks");
    let named = child.id();
    let st = child.wait_with_output().expect("wait many_stacks").status;
    assert!(st.success(), "many_stacks failed: {st}");
    // Our own children.
    let _ = kill(Pid::from_raw(rec.id() as i32), Signal::SIGINT);
    let rec_out = rec.wait_with_output().expect("wait record -n");
    assert!(rec_out.status.success(), "record -n: {}", text(&rec_out));
    // Our own child.
    let _ = kill(Pid::from_raw(service.id() as i32), Signal::SIGTERM);
    let _ = service.wait();

    // `record -- CMD` beside the installed client (its own copy preloaded).
    let out = heapprofd()
        .args(["record", "-i", "1", "-o"])
        .arg(&rec_trace)
        .arg("--")
        .arg(&many_stacks)
        .arg("7")
        .stdin(Stdio::null())
        .output()
        .expect("record -- many_stacks");
    assert!(out.status.success(), "record -- CMD: {}", text(&out));

    drop(guard);
    let window = start.elapsed();
    eprintln!("system_install: installed for {window:?}");
    assert_eq!(system(), before, "uninstall did not restore the system");
    let maps = run_ok(Command::new("cat").arg("/proc/self/maps"), "cat maps");
    assert!(!names_lib(&maps), "still loaded after uninstall");

    let count = |t: &Path, pid: Option<u32>| -> u64 {
        check_trace(t)
            .samples
            .iter()
            .filter(|s| pid.is_none_or(|p| s.pid == u64::from(p)))
            .filter(|s| s.frames.iter().any(|f| frame_is(f, "stack_leaf")))
            .map(|s| s.alloc_count)
            .sum()
    };
    assert_eq!(
        count(&trace, Some(named)),
        40,
        "the startup profile by name"
    );
    assert_eq!(
        count(&rec_trace, None),
        7,
        "record -- CMD with the client installed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
