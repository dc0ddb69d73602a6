//! End-to-end tests of `libheapprofd_client.so`: real C, C++ and Rust
//! programs under `LD_PRELOAD`, talking to `heapprofd-test-receiver`.
//!
//! Every program prints a checksum of its own work; each test first runs the
//! program without the library and then checks that the output is identical
//! with it (dormant, active, receiver killed...). Every run has a timeout, so
//! a hang fails the test instead of stalling CI. No assertion depends on
//! timing.
//!
//! The library is found or built as described in
//! `heapprofd_tests::client_harness::client_so` (`HEAPPROFD_CLIENT_SO`
//! overrides).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use heapprofd_tests::client_harness::{
    Receiver, Session, client_so, fields, programs, run, sessions, unique_socket,
};

const RECEIVER: &str = env!("CARGO_BIN_EXE_heapprofd-test-receiver");
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

fn receiver(tag: &str, args: &[&str]) -> Receiver {
    Receiver::start(Path::new(RECEIVER), &unique_socket(tag), args)
}

/// A command for program `name` with `args`.
fn prog(name: &str, args: &[&str]) -> Command {
    let mut c = Command::new(programs().path(name));
    c.args(args).current_dir(&programs().dir);
    c
}

/// Program arguments for each test program (short runs).
fn workloads() -> Vec<(&'static str, Vec<String>)> {
    let dl = programs()
        .path("libdlalloc.so")
        .to_string_lossy()
        .into_owned();
    vec![
        ("churn", vec!["32".into(), "4000".into()]),
        ("cxx", vec![]),
        ("rust_churn", vec![]),
        ("dlopen_main", vec![dl]),
        ("signal", vec![]),
        ("forkexec", vec![]),
        ("exit_while_alloc", vec![]),
        ("exact", vec![]),
    ]
}

/// Runs `name` without the library and returns its output (the expected one).
fn baseline(name: &str, args: &[String]) -> String {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(prog(name, &args), RUN_TIMEOUT);
    assert_eq!(out.code, Some(0), "{name} baseline failed: {}", out.stderr);
    assert!(!out.stdout.is_empty());
    out.stdout
}

/// Runs `name` under the library with `env`, checks exit 0 and `expected` output.
fn run_preloaded(name: &str, args: &[String], env: &[(&str, &str)], expected: &str) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = prog(name, &args);
    c.env("LD_PRELOAD", client_so());
    c.env_remove("HEAPPROFD_SOCKET");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = run(c, RUN_TIMEOUT);
    assert_eq!(
        out.code,
        Some(0),
        "{name} under the client failed: stdout {}\nstderr {}",
        out.stdout,
        out.stderr
    );
    assert_eq!(
        out.stdout, expected,
        "{name}: output differs under the client"
    );
}

/// Sanity checks every session must pass.
fn check_clean(s: &Session) {
    for k in [
        "decode_errors",
        "corrupt",
        "seq_set",
        "sp_mismatch",
        "pending_at_end",
        "client_error",
    ] {
        assert_eq!(s.get(k), 0, "{k} in {s:?}");
    }
}

fn socket_env(r: &Receiver) -> String {
    r.socket.to_string_lossy().into_owned()
}

/// The malloc family, every C++ `operator new`/`delete` (the allocator's
/// own are recorded, libstdc++'s forwarded) and the exec family with
/// `posix_spawn`, `system`, `popen` (children keep the profiler),
/// `dlclose` (samples unwound before an object goes), `dlopen` (the walk's
/// tables take in what it loads), the custom heap,
/// user context and in-process walk APIs, nothing else.
#[test]
fn exports_exactly_the_hooks() {
    let out = run(
        {
            let mut c = Command::new("nm");
            c.args(["-D", "--defined-only"]).arg(client_so());
            c
        },
        RUN_TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let mut names: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    names.sort_unstable();
    let mut want = vec![
        "aligned_alloc",
        "calloc",
        "free",
        "malloc",
        "malloc_usable_size",
        "memalign",
        "posix_memalign",
        "pvalloc",
        "realloc",
        "reallocarray",
        "valloc",
        "_Znwm",
        "_Znam",
        "_ZnwmSt11align_val_t",
        "_ZnamSt11align_val_t",
        "_ZnwmRKSt9nothrow_t",
        "_ZnamRKSt9nothrow_t",
        "_ZnwmSt11align_val_tRKSt9nothrow_t",
        "_ZnamSt11align_val_tRKSt9nothrow_t",
        "_ZdlPv",
        "_ZdaPv",
        "_ZdlPvm",
        "_ZdaPvm",
        "_ZdlPvRKSt9nothrow_t",
        "_ZdaPvRKSt9nothrow_t",
        "_ZdlPvSt11align_val_t",
        "_ZdaPvSt11align_val_t",
        "_ZdlPvmSt11align_val_t",
        "_ZdaPvmSt11align_val_t",
        "_ZdlPvSt11align_val_tRKSt9nothrow_t",
        "_ZdaPvSt11align_val_tRKSt9nothrow_t",
        "execve",
        "execveat",
        "fexecve",
        "execv",
        "execvp",
        "execvpe",
        "execl",
        "execle",
        "execlp",
        "posix_spawn",
        "posix_spawnp",
        "system",
        "popen",
        "dlclose",
        "dlopen",
        "_exit",
        "_Exit",
        "AHeapInfo_create",
        "AHeapInfo_setEnabledCallback",
        "AHeapInfo_setDisabledCallback",
        "AHeapProfile_registerHeap",
        "AHeapProfile_reportAllocation",
        "AHeapProfile_reportSample",
        "AHeapProfile_reportFree",
        "AHeapProfileEnableCallbackInfo_getSamplingInterval",
        "heapprofd_context_create",
        "heapprofd_context_activate",
        "heapprofd_context_deactivate",
        "heapprofd_context_current",
        "heapprofd_context_release",
        "heapprofd_request_stack",
        "heapprofd_register_event",
        "pthread_create",
        // The stack-request API's in-process walk.
        "heapprofd_walk_prepare",
        "heapprofd_walk_stack",
    ];
    want.sort_unstable();
    assert_eq!(names, want);
}

/// The library uses initial-exec TLS for its own state (`STATIC_TLS`, a
/// `TPOFF64` relocation), and nothing reachable from the exported hooks
/// calls `__tls_get_addr`.
///
/// The precompiled std inside the library still holds a few global-dynamic
/// TLS accesses (`R_X86_64_DTPMOD64`): the panic machinery (panic count,
/// default hook, output capture). They can only run while a panic is
/// already aborting the process. This test walks the direct-call graph from
/// every exported hook, stopping at panic entry points, and asserts that no
/// function it reaches calls `__tls_get_addr`.
#[test]
#[cfg(target_arch = "x86_64")]
fn no_global_dynamic_tls_on_hook_paths() {
    let so = client_so();
    let dynamic = run(
        {
            let mut c = Command::new("readelf");
            c.arg("-d").arg(&so);
            c
        },
        RUN_TIMEOUT,
    );
    assert!(
        dynamic
            .stdout
            .lines()
            .any(|l| l.contains("(FLAGS)") && l.contains("STATIC_TLS")),
        "DT_FLAGS lacks STATIC_TLS:\n{}",
        dynamic.stdout
    );
    let relocs = run(
        {
            let mut c = Command::new("readelf");
            c.arg("-rW").arg(&so);
            c
        },
        RUN_TIMEOUT,
    );
    assert!(
        relocs.stdout.contains("R_X86_64_TPOFF64"),
        "no initial-exec TLS relocation"
    );
    let dis = run(
        {
            let mut c = Command::new("objdump");
            c.args(["-d", "--no-show-raw-insn", "-C"]).arg(&so);
            c
        },
        RUN_TIMEOUT,
    );
    assert_eq!(dis.code, Some(0));
    let mut calls: HashMap<String, Vec<String>> = HashMap::new();
    let mut cur = String::new();
    for line in dis.stdout.lines() {
        if let Some(name) = line
            .strip_suffix(">:")
            .and_then(|l| l.split_once(" <"))
            .map(|x| x.1)
        {
            cur = name.to_string();
            continue;
        }
        if let (Some(i), true) = (
            line.find('<'),
            line.contains("call") || line.contains("jmp"),
        ) {
            let target = &line[i + 1..line.rfind('>').unwrap_or(line.len())];
            let target = target.split("+0x").next().unwrap_or(target);
            if target != cur {
                calls
                    .entry(cur.clone())
                    .or_default()
                    .push(target.to_string());
            }
        }
    }
    let is_panic = |f: &str| {
        [
            "panic",
            "unwrap_failed",
            "expect_failed",
            "rust_begin_unwind",
            "abort_internal",
        ]
        .iter()
        .any(|p| f.contains(p))
    };
    let roots = [
        "malloc",
        "free",
        "calloc",
        "realloc",
        "reallocarray",
        "posix_memalign",
        "memalign",
        "aligned_alloc",
        "valloc",
        "pvalloc",
        "malloc_usable_size",
    ];
    let mut seen: std::collections::HashSet<String> = roots.iter().map(|s| s.to_string()).collect();
    let mut stack: Vec<String> = seen.iter().cloned().collect();
    while let Some(f) = stack.pop() {
        for t in calls.get(&f).into_iter().flatten() {
            assert!(
                !t.contains("__tls_get_addr"),
                "{f} (reachable from a hook) calls __tls_get_addr"
            );
            if !is_panic(t) && seen.insert(t.clone()) {
                stack.push(t.clone());
            }
        }
    }
    assert!(seen.len() > roots.len(), "call graph not parsed");
}

#[test]
fn dormant_programs_run_unchanged() {
    for (name, args) in workloads() {
        let expected = baseline(name, &args);
        run_preloaded(name, &args, &[], &expected);
        // The signal handler is optional; the programs do not care.
        run_preloaded(name, &args, &[("HEAPPROFD_NO_SIGNAL", "1")], &expected);
    }
}

/// Every program, profiled at 4 KiB, in drop and in block mode.
#[test]
fn active_programs_produce_correct_output_and_clean_records() {
    for (mode, extra) in [
        ("drop", vec![]),
        ("block", vec!["--block", "--block-timeout-us", "0"]),
    ] {
        for (name, args) in workloads() {
            let expected = baseline(name, &args);
            let mut rargs = vec!["--interval", "4096", "--seed", "7"];
            rargs.extend(extra.iter());
            let r = receiver(name, &rargs);
            let sock = socket_env(&r);
            run_preloaded(
                name,
                &args,
                &[
                    ("HEAPPROFD_SOCKET", &sock),
                    ("HEAPPROFD_BLOCKING_INIT", "1"),
                ],
                &expected,
            );
            let lines = r.finish(RUN_TIMEOUT);
            let ss = sessions(&lines);
            assert!(
                !ss.is_empty(),
                "{name} ({mode}): no session:\n{}",
                lines.join("\n")
            );
            for s in &ss {
                if name == "exit_while_alloc" {
                    // exit() kills threads between reserving and committing a
                    // record; the reader must (and does) stop at it.
                    let mut s = s.clone();
                    s.0.insert("pending_at_end".into(), 0);
                    check_clean(&s);
                } else {
                    check_clean(s);
                }
            }
            let total: u64 = ss.iter().map(|s| s.get("mallocs")).sum();
            assert!(total > 0, "{name} ({mode}): no samples");
            if mode == "block" {
                let dropped: u64 = ss.iter().map(|s| s.get("overflow")).sum();
                assert_eq!(dropped, 0, "{name}: block mode dropped records");
            }
        }
    }
}

/// One parsed `rec` line.
#[derive(Debug, Clone)]
struct Rec {
    seq: u64,
    malloc: bool,
    addr: u64,
    size: u64,
    sample: u64,
}

fn records(lines: &[String], pid: u64) -> Vec<Rec> {
    let mut v: Vec<Rec> = lines
        .iter()
        .filter(|l| l.starts_with("rec "))
        .map(|l| (l.contains("kind=malloc"), fields(l)))
        .filter(|(_, f)| f.get("pid") == Some(&pid))
        .map(|(malloc, f)| Rec {
            seq: f["seq"],
            malloc,
            addr: f["addr"],
            size: f.get("size").copied().unwrap_or(0),
            sample: f.get("sample").copied().unwrap_or(0),
        })
        .collect();
    v.sort_by_key(|r| r.seq);
    v
}

/// The program's pid: the session whose mallocs include the magic sizes.
fn session_with(lines: &[String], pred: impl Fn(&[Rec]) -> bool) -> (u64, Vec<Rec>) {
    for s in sessions(lines) {
        let recs = records(lines, s.get("pid"));
        if pred(&recs) {
            check_clean(&s);
            return (s.get("pid"), recs);
        }
    }
    panic!("no matching session in:\n{}", lines.join("\n"));
}

#[test]
fn interval_one_is_exact() {
    let r = receiver("exact", &["--interval", "1", "--block", "--records"]);
    let sock = socket_env(&r);
    run_preloaded(
        "exact",
        &[],
        &[
            ("HEAPPROFD_SOCKET", &sock),
            ("HEAPPROFD_BLOCKING_INIT", "1"),
        ],
        "exact ok\n",
    );
    let lines = r.finish(RUN_TIMEOUT);
    // The handshake carries the library's executable segment.
    for c in lines.iter().filter(|l| l.starts_with("connected")) {
        let f = fields(c);
        assert!(
            f["text_start"] > 0 && f["text_end"] > f["text_start"],
            "{c}"
        );
    }
    let magic = |s: u64| (90_000..1_000_000).contains(&s);
    let (_, recs) = session_with(&lines, |recs| {
        recs.iter().any(|r| r.malloc && magic(r.size))
    });
    let mut want: Vec<u64> = Vec::new();
    want.extend((0..1000).map(|i| 100_000 + i));
    want.extend((0..200).map(|i| 200_000 + i));
    want.extend((0..200).map(|i| 300_000 + i));
    want.extend((0..50).map(|i| 400_000 + i));
    want.extend((0..10).map(|i| 500_000 + i));
    want.extend((0..10).map(|i| 600_000 + i * 256));
    want.extend((20..30).map(|i| 700_000 + i));
    want.extend((30..40).map(|i| 800_000 + i));
    want.extend((40..50).map(|i| 10 * (90_000 + i)));
    want.sort_unstable();
    let sampled: Vec<&Rec> = recs.iter().filter(|r| r.malloc && magic(r.size)).collect();
    let mut got: Vec<u64> = sampled.iter().map(|r| r.size).collect();
    got.sort_unstable();
    assert_eq!(got, want, "malloc samples differ");
    for r in &sampled {
        assert_eq!(r.sample, r.size, "interval 1 sample size");
    }
    // Each sampled block has a free after it, before any reuse of its address.
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut frees_of_magic = 0;
    for r in &recs {
        if r.malloc {
            if magic(r.size) {
                assert!(
                    live.insert(r.addr, r.seq).is_none(),
                    "address reused before its free: {r:?}"
                );
            }
        } else if live.remove(&r.addr).is_some() {
            frees_of_magic += 1;
        }
    }
    assert!(live.is_empty(), "{} sampled blocks never freed", live.len());
    assert_eq!(frees_of_magic, want.len());
}

#[test]
fn forked_children_never_write_into_the_parent_session_clone_vm_children_do() {
    let expected = baseline("forkexec", &[]);
    let r = receiver("fork", &["--interval", "1", "--block", "--records"]);
    let sock = socket_env(&r);
    run_preloaded(
        "forkexec",
        &[],
        &[
            ("HEAPPROFD_SOCKET", &sock),
            ("HEAPPROFD_BLOCKING_INIT", "1"),
        ],
        &expected,
    );
    let lines = r.finish(RUN_TIMEOUT);
    // The parent's session: the one that saw its 555555+i blocks.
    let (pid, recs) = session_with(&lines, |recs| {
        recs.iter().any(|r| r.malloc && r.size == 555_555)
    });
    assert!(
        !recs.iter().any(|r| r.malloc && r.size == 777_777),
        "a forked child (of {pid}) wrote into the parent's session"
    );
    // A clone(CLONE_VM) child allocates in the parent's heap: its 100 blocks
    // are the parent's memory and are recorded, each with its free (a child
    // that does not share memory, above, never is).
    let clone_blocks: Vec<&Rec> = recs
        .iter()
        .filter(|r| r.malloc && r.size == 666_666)
        .collect();
    assert_eq!(
        clone_blocks.len(),
        5 * 100,
        "clone(CLONE_VM) allocations of {pid}'s heap"
    );
    for b in &clone_blocks {
        assert!(
            recs.iter()
                .any(|r| !r.malloc && r.addr == b.addr && r.seq > b.seq),
            "no free after the clone child's block {b:?}"
        );
    }
    // The exec'd children had sessions of their own (fork+exec, vfork, posix_spawn: 15).
    assert!(sessions(&lines).len() >= 16, "{}", lines.len());
}

/// SIGKILL the receiver while the program runs: the program must finish
/// normally with the right output (drop mode, and block mode waiting forever).
#[test]
fn receiver_killed_mid_run() {
    let args: Vec<String> = vec!["8".into(), "200000".into()];
    let expected = baseline("churn", &args);
    for extra in [vec![], vec!["--block", "--block-timeout-us", "0"]] {
        let mut rargs = vec!["--interval", "512", "--shmem-size", "65536"];
        rargs.extend(extra.iter());
        let r = receiver("kill", &rargs);
        let sock = socket_env(&r);
        let killer = std::thread::spawn(move || {
            r.wait_line(|l| l.starts_with("connected"), Duration::from_secs(60));
            std::thread::sleep(Duration::from_millis(100));
            r.kill();
        });
        run_preloaded(
            "churn",
            &args,
            &[
                ("HEAPPROFD_SOCKET", &sock),
                ("HEAPPROFD_BLOCKING_INIT", "1"),
            ],
            &expected,
        );
        killer.join().unwrap();
    }
}

/// The library loaded with `dlopen` (as an attach will load it): its TLS
/// block fits in glibc's static TLS surplus, its constructor connects, and
/// its malloc/free, called through `dlsym`, record samples and frees from
/// the main thread and from a thread created afterwards.
#[test]
fn works_when_dlopened_after_start() {
    let so = client_so().to_string_lossy().into_owned();
    let r = receiver("dlopened", &["--interval", "1", "--block"]);
    let sock = socket_env(&r);
    let mut c = prog("dlopen_client", &[&so]);
    c.env("HEAPPROFD_SOCKET", &sock)
        .env("HEAPPROFD_BLOCKING_INIT", "1");
    let out = run(c, RUN_TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let sum: u64 = (0..1000u64).map(|i| i & 0xff).sum();
    assert_eq!(out.stdout, format!("dlopen_client sums={sum},{sum}\n"));
    let lines = r.finish(RUN_TIMEOUT);
    let ss = sessions(&lines);
    assert_eq!(ss.len(), 1, "{lines:?}");
    check_clean(&ss[0]);
    // 2000 calls through the handle, every one sampled and freed.
    assert!(ss[0].get("mallocs") >= 2000, "{lines:?}");
    assert!(ss[0].get("frees") >= 2000, "{lines:?}");
}

/// Block mode with a reader that does not read: the writer waits for the
/// configured timeout, then the session ends with `HitTimeout` recorded,
/// and the program finishes normally, unprofiled.
#[test]
fn block_mode_timeout_ends_the_session_with_an_error() {
    let args: Vec<String> = vec!["4".into(), "20000".into()];
    let expected = baseline("churn", &args);
    let r = receiver(
        "stall",
        &[
            "--interval",
            "1",
            "--block",
            "--block-timeout-us",
            "1000",
            "--shmem-size",
            "4096",
            "--stall-ms",
            "1500",
        ],
    );
    let sock = socket_env(&r);
    run_preloaded(
        "churn",
        &args,
        &[
            ("HEAPPROFD_SOCKET", &sock),
            ("HEAPPROFD_BLOCKING_INIT", "1"),
        ],
        &expected,
    );
    let lines = r.finish(RUN_TIMEOUT);
    let ss = sessions(&lines);
    // ClientError::HitTimeout = 1, in the session of the program (the
    // `timeout`-less run has exactly one).
    assert_eq!(ss.len(), 1, "{lines:?}");
    assert_eq!(ss[0].get("client_error"), 1, "{lines:?}");
    assert!(ss[0].get("overflow") >= 1);
    assert_eq!(ss[0].get("decode_errors"), 0);
    assert_eq!(ss[0].get("corrupt"), 0);
}

/// Loaded without a socket, the library is dormant; signal 36 with a
/// `sigqueue` value starts a session with
/// `/tmp/heapprofd-rs-<euid>/<value>.sock` (the attach ABI's rule).
/// After that receiver goes away, a second signal starts a second session.
#[test]
fn dormant_then_activated_by_signal_twice() {
    use std::io::{BufRead, BufReader, Write};
    let id = 900_000 + std::process::id() % 100_000;
    let uid = nix::unistd::geteuid();
    let dir = PathBuf::from(format!("/tmp/heapprofd-rs-{uid}"));
    if std::fs::create_dir(&dir).is_ok() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let sock = dir.join(format!("{id}.sock"));
    let mut child = prog("dormant", &[])
        .env("LD_PRELOAD", client_so())
        .env_remove("HEAPPROFD_SOCKET")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut ready = String::new();
    stdout.read_line(&mut ready).unwrap();
    assert_eq!(ready, "ready\n");
    for round in 0..2 {
        let r = Receiver::start(Path::new(RECEIVER), &sock, &["--interval", "1", "--block"]);
        // The handler may not be installed yet if the program just started:
        // retry the signal until the session appears.
        let mut connected = None;
        for _ in 0..100 {
            // SAFETY: sigqueue with a plain integer value.
            let rc = unsafe {
                let v = libc::sigval {
                    sival_ptr: id as usize as *mut libc::c_void,
                };
                libc::sigqueue(pid, heapprofd_proto::attach::ACTIVATION_SIGNAL, v)
            };
            assert_eq!(rc, 0, "sigqueue");
            connected = r.wait_line(|l| l.starts_with("connected"), Duration::from_millis(300));
            if connected.is_some() {
                break;
            }
        }
        let connected = connected.expect("no session after signal 36");
        assert_eq!(fields(&connected)["pid"], pid as u64);
        assert_eq!(fields(&connected)["flags"], 2, "FLAG_FROM_SIGNAL");
        // The session becomes active just after the receiver answers; the
        // program allocates every millisecond throughout, so samples flow.
        std::thread::sleep(Duration::from_millis(200));
        writeln!(stdin, "go").unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let want = (0..100u64).map(|i| 8 * i).sum::<u64>() * (round + 1);
        assert_eq!(line, format!("go done sum={want}\n"));
        // Ending the receiver ends the session (EOF on the socket).
        let lines = r.finish(RUN_TIMEOUT);
        let ss = sessions(&lines);
        assert_eq!(ss.len(), 1, "{lines:?}");
        check_clean(&ss[0]);
        assert!(
            ss[0].get("mallocs") > 0,
            "no samples after activation: {lines:?}"
        );
        let _ = std::fs::remove_file(&sock);
    }
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(rest, "bye\n");
    assert!(child.wait().unwrap().success());
}
