//! The client behind other preloaded libraries, in the load order the
//! system-wide install gives without root: glibc loads `LD_PRELOAD` before
//! `/etc/ld.so.preload`, so `LD_PRELOAD=A:client.so` puts the client
//! where the installed one is when a program (or a test, or heaptrack)
//! preloads A.
//!
//! - A library before the client that forwards with `dlsym(RTLD_NEXT, ..)`
//!   (heaptrack's preload, glibc's `libmemusage.so`, the emulated bionic
//!   libc) reaches the client's hook; the hook must forward onwards, to
//!   glibc. It used to forward back to that library (its "first
//!   definition"): heaptrack's runs died of a stack overflow and hung
//!   heaptrack's script, the emulated libc spun at 100% CPU.
//! - Two copies of the client (the test's and the installed one): one
//!   does the work, the program runs, dormant and profiled.
//! - A library before the client that defines `malloc` is what the
//!   program's calls reach: a session of the client behind it could not
//!   see them, so it is refused and named (`EarlierAllocator`).
//!   A startup profile by name asked for it tells the service so, which
//!   names it in `record`'s summary.
//! - `HEAPPROFD_SOCKET` is for the library `LD_PRELOAD` names: with
//!   `record --client-lib` another front-end (the emulated bionic libc) is
//!   the one preloaded, and the installed copy, which `LD_PRELOAD` does not
//!   name, leaves the socket to it (it connected, or sent a notice, beside
//!   that front-end's session). The loader's `--preload` stands for
//!   `/etc/ld.so.preload` here: it loads the copy after `LD_PRELOAD`'s
//!   libraries and names it in no environment variable. A library that
//!   `LD_PRELOAD` names by its path is addressed whatever its file name
//!   (`record --client-lib` takes any).
//!
//! Every run has a timeout, so a loop fails the test instead of hanging.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use heapprofd_proto::service::DIR_ENV;
use heapprofd_tests::client_harness::{
    Output, Receiver, client_so, programs, run, sessions, unique_socket,
};
use heapprofd_tests::record_harness::scratch_dir;
use heapprofd_tests::service_harness::{Service, signal, wait_exit};

const RECEIVER: &str = env!("CARGO_BIN_EXE_heapprofd-test-receiver");
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const CHURN_ARGS: [&str; 2] = ["8", "2000"];

/// `churn` (8 threads of malloc/calloc/realloc/free) with `LD_PRELOAD` =
/// `preload` joined by `:`, and `env`.
fn churn(preload: &[&Path], env: &[(&str, &str)]) -> Output {
    run_churn(Command::new(programs().path("churn")), preload, env)
}

/// Runs `c` (`churn`, or a loader about to run it) with `churn`'s
/// arguments, `LD_PRELOAD` = `preload` joined by `:`, and `env`.
fn run_churn(mut c: Command, preload: &[&Path], env: &[(&str, &str)]) -> Output {
    c.args(CHURN_ARGS).current_dir(&programs().dir);
    let joined: Vec<String> = preload.iter().map(|p| p.display().to_string()).collect();
    c.env("LD_PRELOAD", joined.join(":"));
    c.env_remove("HEAPPROFD_SOCKET");
    for (k, v) in env {
        c.env(k, v);
    }
    run(c, RUN_TIMEOUT)
}

/// The dynamic loader this test runs under (glibc's `ld-linux-*.so.*`).
fn dynamic_loader() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("ld-linux"))
        })
        .map(PathBuf::from)
        .expect("no ld-linux in /proc/self/maps")
}

/// `churn` with `LD_PRELOAD` = `preload` and `behind` loaded after it the
/// way `/etc/ld.so.preload` loads the installed copy: by the loader
/// (`ld.so --preload`), named in no environment variable.
fn churn_behind(preload: &[&Path], behind: &Path, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(dynamic_loader());
    c.arg("--preload").arg(behind).arg(programs().path("churn"));
    run_churn(c, preload, env)
}

/// `churn`'s output without any preload.
fn expected() -> String {
    let out = churn(&[], &[]);
    assert_eq!(out.code, Some(0), "churn alone: {}", out.stderr);
    assert!(!out.stdout.is_empty());
    out.stdout
}

fn shim() -> PathBuf {
    programs().path("libchain_shim.so")
}

/// How many calls the shim forwarded (its `chain_shim: N calls` line).
fn shim_calls(out: &Output) -> u64 {
    out.stderr
        .lines()
        .find_map(|l| l.strip_prefix("chain_shim: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `chain_shim: N calls` line in:\n{}", out.stderr))
}

fn assert_ran(what: &str, out: &Output, want: &str) {
    assert_eq!(
        out.code,
        Some(0),
        "{what}: exit {:?}\nstdout {}\nstderr {}",
        out.code,
        out.stdout,
        out.stderr
    );
    assert_eq!(out.stdout, want, "{what}: output differs");
}

/// A copy of the client under its own file name in a directory of its
/// own (as `/usr/lib/heapprofd-rs/preload/libheapprofd_client.so` is).
fn second_copy(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "heapprofd-preload-order-{}-{tag}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let copy = dir.join("libheapprofd_client.so");
    std::fs::copy(client_so(), &copy).expect("copy the client");
    copy
}

#[test]
fn a_shim_forwarding_to_rtld_next_before_the_client_runs() {
    let want = expected();
    // Dormant, behind the shim (where the installed client is when a
    // program preloads heaptrack), and in front of it (where `record`
    // puts the client it preloads).
    let shim = shim();
    let client = client_so();
    for (what, order) in [
        ("shim, then the client", [shim.as_path(), client.as_path()]),
        (
            "the client, then the shim",
            [client.as_path(), shim.as_path()],
        ),
    ] {
        let out = churn(&order, &[]);
        assert_ran(what, &out, &want);
        // 8 threads x 2000 iterations, each a malloc or calloc, a realloc
        // or a free: every one went through the shim.
        let calls = shim_calls(&out);
        assert!(
            calls >= 8 * 2000,
            "{what}: the shim forwarded {calls} calls"
        );
    }
}

#[test]
fn an_allocator_before_the_client_is_named_not_profiled() {
    // A session asked for (the socket is absent, so the notice cannot be
    // delivered and the client says it on stderr): the program's malloc is
    // the shim's, before the client, which the hooks do not forward to.
    let want = expected();
    let out = churn(
        &[&shim(), &client_so()],
        &[
            (
                "HEAPPROFD_SOCKET",
                "/nonexistent/heapprofd-preload-order.sock",
            ),
            ("HEAPPROFD_BLOCKING_INIT", "1"),
        ],
    );
    assert_ran("shim before an active client", &out, &want);
    assert!(
        out.stderr
            .contains("a library loaded before the client defines malloc"),
        "no refusal on stderr:\n{}",
        out.stderr
    );
    assert!(shim_calls(&out) >= 8 * 2000);
}

#[test]
fn two_copies_of_the_client_run_dormant_and_profiled() {
    let want = expected();
    let copy = second_copy("two");
    let client = client_so();
    for (what, order) in [
        (
            "test copy, then installed copy",
            [client.as_path(), copy.as_path()],
        ),
        (
            "installed copy, then test copy",
            [copy.as_path(), client.as_path()],
        ),
    ] {
        let out = churn(&order, &[]);
        assert_ran(&format!("{what}, dormant"), &out, &want);
        assert!(out.stderr.is_empty(), "{what}: {}", out.stderr);

        let r = Receiver::start(
            Path::new(RECEIVER),
            &unique_socket("two-copies"),
            &["--interval", "4096", "--seed", "7"],
        );
        let sock = r.socket.to_string_lossy().into_owned();
        let out = churn(
            &order,
            &[
                ("HEAPPROFD_SOCKET", &sock),
                ("HEAPPROFD_BLOCKING_INIT", "1"),
            ],
        );
        assert_ran(&format!("{what}, profiled"), &out, &want);
        let lines = r.finish(RUN_TIMEOUT);
        let ss = sessions(&lines);
        // One copy works: one session, with samples.
        assert_eq!(ss.len(), 1, "{what}: sessions:\n{}", lines.join("\n"));
        assert!(ss[0].get("mallocs") > 0, "{what}: no samples");
    }
    let _ = std::fs::remove_dir_all(copy.parent().expect("dir"));
}

#[test]
fn a_copy_that_ld_preload_does_not_name_leaves_the_socket_alone() {
    let want = expected();
    let installed = second_copy("behind");
    let dir = installed.parent().expect("dir").to_path_buf();
    let r = Receiver::start(
        Path::new(RECEIVER),
        &unique_socket("not-named"),
        &["--interval", "4096"],
    );
    let sock = r.socket.to_string_lossy().into_owned();
    let out = churn_behind(
        &[&shim()],
        &installed,
        &[
            ("HEAPPROFD_SOCKET", &sock),
            ("HEAPPROFD_BLOCKING_INIT", "1"),
        ],
    );
    assert_ran("a copy LD_PRELOAD does not name", &out, &want);
    // The copy was loaded (it forwarded the shim's calls) but stayed out.
    assert!(shim_calls(&out) > 0, "{}", out.stderr);
    assert!(
        out.stderr.lines().all(|l| l.starts_with("chain_shim: ")),
        "{}",
        out.stderr
    );
    // Nothing reached the socket: no session, no notice.
    let lines = r.finish(RUN_TIMEOUT);
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("listening ") || l == "done sessions=0"),
        "the receiver heard from the copy:\n{}",
        lines.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_startup_profile_names_a_program_whose_malloc_comes_first() {
    let want = expected();
    let dir = scratch_dir("preload-order-svc");
    let svc = Service::start(&dir.join("svc"));
    let trace = dir.join("t.pftrace");
    let mut rec = svc.record(&["-n", "churn", "-i", "4096"], &trace);
    svc.wait_store("name 1 churn");
    let out = churn(
        &[&shim(), &client_so()],
        &[(DIR_ENV, &svc.dir.to_string_lossy())],
    );
    assert_ran("shim before a client a startup profile wants", &out, &want);
    assert!(
        out.stderr.lines().all(|l| l.starts_with("chain_shim: ")),
        "{}",
        out.stderr
    );
    svc.wait_log(") runs unprofiled: a library loaded before the profiler");
    signal(&rec.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec.0, "record -n");
    assert_eq!(code, 0, "record -n failed:\n{err}");
    assert!(
        err.contains("not profiled: a library loaded before the profiler"),
        "record's summary:\n{err}"
    );
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "daemon failed:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
