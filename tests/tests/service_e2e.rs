//! End-to-end tests of the profiling service: `heapprofd-rs daemon` and
//! `heapprofd-rs record -n NAME` (startup profiling by name through the
//! dormant client and the startup-trigger store).
//!
//! Each test runs its own service in a scratch `HEAPPROFD_SERVICE_DIR`.
//! The profiled programs are `tests/programs/record/*.c`, started with the
//! client preloaded (dormant unless the store names them) only after the
//! store names them. Traces are checked with `check_trace.py --strict`. No
//! assertion depends on timing: the test waits for files the service
//! writes (generous timeouts only catch hangs) and ends the profile with
//! SIGINT to `record`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use heapprofd_proto::service::{CONTROL_SOCKET, DIR_ENV, TRIGGERS_FILE};
use heapprofd_tests::record_harness::{
    check_trace, frame_is, heapprofd, record_programs, scratch_dir,
};
use heapprofd_tests::service_harness::{self, Reaped, signal, wait_exit, wait_for};

fn start_service(svc: &Path) -> Reaped {
    let control = svc.join(CONTROL_SOCKET);
    // A killed service's socket file: the new one's appearing is the sign.
    let _ = std::fs::remove_file(&control);
    let child = heapprofd()
        .arg("daemon")
        .env(DIR_ENV, svc)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start heapprofd-rs daemon");
    wait_for("the control socket", || control.exists());
    Reaped(child)
}

/// Runs `prog ARGS` with the client preloaded, dormant unless the service
/// wants it; returns its pid.
fn run_preloaded(svc: &Path, prog: &Path, args: &[&str]) -> u32 {
    let name = prog.file_name().expect("a file").to_string_lossy();
    service_harness::run_preloaded(svc, prog, &name, args)
}

#[test]
fn record_by_name_profiles_a_program_started_after_the_request() {
    let dir = scratch_dir("service-name");
    let svc: PathBuf = dir.join("svc");
    let trace = dir.join("named.pftrace");
    let mut service = start_service(&svc);

    let mut rec = Reaped(
        heapprofd()
            .args([
                "record",
                "-n",
                "many_stacks,not-running-here",
                "-i",
                "1",
                "-o",
            ])
            .arg(&trace)
            .env(DIR_ENV, &svc)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start record -n"),
    );
    let store = svc.join(TRIGGERS_FILE);
    wait_for("the trigger store", || {
        std::fs::read_to_string(&store).is_ok_and(|s| s.contains("name 1 many_stacks\n"))
    });

    // Started after the request: the named one from its first allocation,
    // the other (same client, not named) stays dormant.
    let named = run_preloaded(&svc, &record_programs().path("many_stacks"), &["40"]);
    let other = run_preloaded(&svc, &record_programs().path("exit_now"), &["3"]);

    signal(&rec.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec.0, "record -n to end");
    assert_eq!(code, 0, "record -n failed:\n{err}");
    assert!(err.contains("1 process"), "summary: {err}");
    assert!(!store.exists(), "the trigger store outlived the profile");

    let summary = check_trace(&trace);
    let leaf: Vec<_> = summary
        .samples
        .iter()
        .filter(|s| s.pid == u64::from(named) && s.frames.iter().any(|f| frame_is(f, "stack_leaf")))
        .collect();
    // -i 1 from the first allocation: every one of the 40 blocks, 32 bytes
    // each, none freed.
    let count: u64 = leaf.iter().map(|s| s.alloc_count).sum();
    let bytes: u64 = leaf.iter().map(|s| s.allocated).sum();
    assert_eq!((count, bytes), (40, 40 * 32), "samples: {leaf:?}");
    assert!(
        summary.samples.iter().all(|s| s.pid != u64::from(other)),
        "a program that was not named was profiled"
    );

    // SIGTERM: the service stops and removes its control socket.
    signal(&service.0, libc::SIGTERM);
    let (code, err) = wait_exit(&mut service.0, "the service to stop");
    assert_eq!(code, 0, "daemon failed:\n{err}");
    assert!(!svc.join(CONTROL_SOCKET).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts `record -n NAMES -i 1 -o TRACE` against the service in `svc`
/// and waits until the trigger store names the first name.
fn start_record(svc: &Path, names: &str, trace: &Path) -> Reaped {
    start_record_with(svc, &["-n", names, "-i", "1"], names, trace)
}

/// Starts `record ARGS -o TRACE`; waits until the store names `names`'s first.
fn start_record_with(svc: &Path, args: &[&str], names: &str, trace: &Path) -> Reaped {
    let rec = Reaped(
        heapprofd()
            .arg("record")
            .args(args)
            .arg("-o")
            .arg(trace)
            .env(DIR_ENV, svc)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start record -n"),
    );
    let first = names.split(',').next().unwrap_or(names);
    let store = svc.join(TRIGGERS_FILE);
    wait_for("the trigger store", || {
        std::fs::read_to_string(&store).is_ok_and(|s| s.contains(&format!("name 1 {first}\n")))
    });
    rec
}

#[test]
fn sigterm_writes_the_open_profile_and_sigkill_leaves_programs_working() {
    let dir = scratch_dir("service-signals");
    let svc = dir.join("svc");
    let many_stacks = record_programs().path("many_stacks");

    // SIGTERM of the service while a profile runs: the profile is written
    // and `record` gets its summary.
    let mut service = start_service(&svc);
    let trace = dir.join("term.pftrace");
    let mut rec = start_record(&svc, "many_stacks", &trace);
    let pid = run_preloaded(&svc, &many_stacks, &["10"]);
    signal(&service.0, libc::SIGTERM);
    let (code, err) = wait_exit(&mut service.0, "the service to stop");
    assert_eq!(code, 0, "daemon failed:\n{err}");
    let (code, err) = wait_exit(&mut rec.0, "record -n to end");
    assert_eq!(code, 0, "record -n failed:\n{err}");
    let summary = check_trace(&trace);
    let count: u64 = summary
        .samples
        .iter()
        .filter(|s| s.pid == u64::from(pid) && s.frames.iter().any(|f| frame_is(f, "stack_leaf")))
        .map(|s| s.alloc_count)
        .sum();
    assert_eq!(count, 10);

    // SIGKILL: the store stays behind, naming many_stacks, and `record`
    // fails; a program started then runs normally (its connect is refused,
    // it stays dormant), and the next service removes the stale store.
    let mut service = start_service(&svc);
    let mut rec = start_record(&svc, "many_stacks", &dir.join("kill.pftrace"));
    service.0.kill().expect("SIGKILL the service");
    let _ = service.0.wait();
    let (code, err) = wait_exit(&mut rec.0, "record -n to end");
    assert_eq!(
        code, 1,
        "record -n should fail when its service dies:\n{err}"
    );
    let store = svc.join(TRIGGERS_FILE);
    assert!(store.exists());
    run_preloaded(&svc, &many_stacks, &["10"]);
    let mut service = start_service(&svc);
    assert!(
        !store.exists(),
        "the new service kept a stale trigger store"
    );
    signal(&service.0, libc::SIGTERM);
    let (code, _) = wait_exit(&mut service.0, "the service to stop");
    assert_eq!(code, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn record_config_takes_a_perfetto_heapprofd_config() {
    let dir = scratch_dir("service-config");
    let svc = dir.join("svc");
    let config = dir.join("heapprofd.cfg");
    std::fs::write(
        &config,
        "process_cmdline: \"many_stacks\"\nsampling_interval_bytes: 1\nno_running: true\n",
    )
    .expect("write the config");
    let mut service = start_service(&svc);
    let trace = dir.join("config.pftrace");
    let cfg = config.to_string_lossy().into_owned();
    let mut rec = start_record_with(&svc, &["--config", &cfg], "many_stacks", &trace);
    let pid = run_preloaded(&svc, &record_programs().path("many_stacks"), &["7"]);
    signal(&rec.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec.0, "record --config to end");
    assert_eq!(code, 0, "record --config failed:\n{err}");
    let count: u64 = check_trace(&trace)
        .samples
        .iter()
        .filter(|s| s.pid == u64::from(pid) && s.frames.iter().any(|f| frame_is(f, "stack_leaf")))
        .map(|s| s.alloc_count)
        .sum();
    assert_eq!(count, 7);

    // Running processes too (Perfetto's default): taken (none runs here).
    std::fs::write(
        &config,
        "process_cmdline: \"many_stacks\"\nsampling_interval_bytes: 4096\n",
    )
    .expect("write the config");
    let out = heapprofd()
        .args(["record", "--config", &cfg, "-d", "200ms", "-o"])
        .arg(dir.join("running.pftrace"))
        .env(DIR_ENV, &svc)
        .stdin(Stdio::null())
        .output()
        .expect("run record --config");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    check_trace(&dir.join("running.pftrace"));
    // An unknown field is bad usage that names it.
    std::fs::write(
        &config,
        "process_cmdline: \"x\"\nsampling_intervl_bytes: 1\n",
    )
    .expect("write");
    let out = heapprofd()
        .args(["record", "--config", &cfg])
        .env(DIR_ENV, &svc)
        .output()
        .expect("run record --config");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("sampling_intervl_bytes"), "{err}");

    signal(&service.0, libc::SIGTERM);
    let (code, _) = wait_exit(&mut service.0, "the service to stop");
    assert_eq!(code, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn service_survives_bad_control_peers() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let dir = scratch_dir("service-peers");
    let svc = dir.join("svc");
    let mut service = start_service(&svc);
    let control = svc.join(CONTROL_SOCKET);
    // Garbage; a header promising more than it sends, without the trace
    // descriptor; a length far beyond the limit; a peer that connects and
    // leaves at once.
    for bytes in [
        &b"garbage!"[..],
        &16u32.to_le_bytes()[..],
        &u32::MAX.to_le_bytes()[..],
        b"",
    ] {
        let mut s = UnixStream::connect(&control).expect("connect to the control socket");
        let _ = s.write_all(bytes);
    }
    // Still serving: a real request gets a trace.
    let trace = dir.join("after.pftrace");
    let out = heapprofd()
        .args(["record", "-n", "nothing-runs-this", "-d", "300ms", "-o"])
        .arg(&trace)
        .env(DIR_ENV, &svc)
        .stdin(Stdio::null())
        .output()
        .expect("run record -n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("0 processes") || err.contains("no process"),
        "{err}"
    );
    check_trace(&trace);
    assert!(
        service.0.try_wait().expect("try_wait").is_none(),
        "the service exited"
    );
    signal(&service.0, libc::SIGTERM);
    let (code, err) = wait_exit(&mut service.0, "the service to stop");
    assert_eq!(code, 0, "daemon failed:\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `record -n` carries the heap selection to the service: a program
/// started after the request reports into its custom heap "pool" (the
/// slab pool of tests/programs/heaps/pool.c, 12000 slots of 96 bytes, 5000
/// freed), exact at -i 1.
#[test]
fn record_by_name_samples_the_custom_heaps_it_names() {
    let dir = scratch_dir("service-heaps");
    let svc: PathBuf = dir.join("svc");
    let trace = dir.join("heaps.pftrace");
    let mut service = start_service(&svc);
    let mut rec = start_record_with(
        &svc,
        &["-n", "pool", "-i", "1", "--heaps", "pool"],
        "pool",
        &trace,
    );
    let pid = run_preloaded(&svc, &record_programs().path("pool"), &["10000"]);
    signal(&rec.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec.0, "record -n to end");
    assert_eq!(code, 0, "record -n failed:\n{err}");
    let summary = check_trace(&trace);
    let mut pool = (0, 0, 0, 0);
    let mut malloc = 0;
    for s in summary.samples.iter().filter(|s| s.pid == u64::from(pid)) {
        match s.heap.as_str() {
            "pool" => {
                pool.0 += s.alloc_count;
                pool.1 += s.allocated;
                pool.2 += s.free_count;
                pool.3 += s.freed;
            }
            _ => malloc += s.alloc_count,
        }
    }
    assert_eq!(pool, (12_000, 12_000 * 96, 5_000, 5_000 * 96));
    assert_eq!(malloc, 0, "libc.malloc was not asked for");
    signal(&service.0, libc::SIGTERM);
    let (code, err) = wait_exit(&mut service.0, "the service to stop");
    assert_eq!(code, 0, "daemon failed:\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `record -n --context` through the service: the filter crosses the
/// control socket into the client configuration. contexts/endpoints.c with
/// 200 requests: only the 100 /b requests' 8 blocks each are recorded, all
/// under their `endpoint=/b; request=N` root frame.
#[test]
fn record_by_name_samples_only_the_contexts_it_names() {
    let dir = scratch_dir("service-contexts");
    let svc: PathBuf = dir.join("svc");
    let trace = dir.join("contexts.pftrace");
    let mut service = start_service(&svc);
    let mut rec = start_record_with(
        &svc,
        &["-n", "endpoints", "-i", "1", "--context", "endpoint=/b"],
        "endpoints",
        &trace,
    );
    let pid = run_preloaded(&svc, &record_programs().path("endpoints"), &["200"]);
    signal(&rec.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec.0, "record -n to end");
    assert_eq!(code, 0, "record -n failed:\n{err}");
    let summary = check_trace(&trace);
    let mut allocs = 0;
    for s in summary.samples.iter().filter(|s| s.pid == u64::from(pid)) {
        let root = s.frames.first().map(String::as_str).unwrap_or("");
        assert!(root.starts_with("endpoint=/b; request="), "{:?}", s.frames);
        allocs += s.alloc_count;
    }
    assert_eq!(allocs, 100 * 8);
    signal(&service.0, libc::SIGTERM);
    let (code, err) = wait_exit(&mut service.0, "the service to stop");
    assert_eq!(code, 0, "daemon failed:\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn record_by_name_without_a_service_says_to_start_one() {
    let dir = scratch_dir("service-none");
    let trace = dir.join("none.pftrace");
    let out = heapprofd()
        .args(["record", "-n", "x", "-o"])
        .arg(&trace)
        .env(DIR_ENV, dir.join("svc"))
        .stdin(Stdio::null())
        .output()
        .expect("run record -n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("heapprofd-rs daemon"), "{err}");
    assert!(!trace.exists(), "a trace file was left behind");
    // A name the service could never match (longer than a file name) is
    // bad usage.
    let out = heapprofd()
        .args(["record", "-n", &"x".repeat(300)])
        .env(DIR_ENV, dir.join("svc"))
        .output()
        .expect("run record -n");
    assert_eq!(out.status.code(), Some(2));
    // Options the service does not take yet are refused, not ignored.
    let out = heapprofd()
        .args(["record", "-n", "x", "-c", "1s"])
        .env(DIR_ENV, dir.join("svc"))
        .output()
        .expect("run record -n");
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
