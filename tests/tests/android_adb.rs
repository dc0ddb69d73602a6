//! `heapprofd-rs android` end to end against an emulated device: the
//! `adb` stand-in (`tests/programs/android/adb`) on `PATH` plays devices
//! whose filesystems are local directories and runs `adb shell` commands
//! on this host with `/data/...` mapped into them, so the "device" runs
//! the host's x86_64 binaries (ABI `x86_64`), or, for an `arm64-v8a`
//! device, the aarch64 build under `qemu-aarch64-static` (the stand-in
//! wraps pushed aarch64 executables). The profiled program is
//! pushed there and started through `adb shell` with the pushed client
//! preloaded once the profile wants its name; Ctrl-C (SIGINT) ends the
//! profile. Then the host's run directory is checked: the symbolized
//! trace (`check_trace.py --strict`, exact `-i 1` totals), the report,
//! the pprof file, `latest`. Each check of the workflow has its failure
//! test (no adb, no device, two devices, old Android, a build of the
//! wrong ABI, push failure, the device gone mid-profile), and
//! `--perfetto` is run against a stand-in `perfetto` on the device.
//! No assertion depends on timing.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use heapprofd_proto::service::TRIGGERS_FILE;
use heapprofd_tests::client_harness::workspace_root;
use heapprofd_tests::record_harness::{check_trace, heapprofd, record, record_programs};
use heapprofd_tests::service_harness::{Reaped, signal, wait_exit, wait_for};

const SERIAL: &str = "emulator-5554";
const DEVICE_DIR: &str = "data/local/tmp/heapprofd-rs";

/// The stand-ins' directory (put on PATH).
fn standins() -> PathBuf {
    workspace_root().join("tests/programs/android")
}

/// A stand-in home, removed at the end of a test that passed.
struct Home(PathBuf);

impl std::ops::Deref for Home {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A fresh stand-in home, with a short path under /tmp (the device's
/// socket paths live under it and must fit a `sun_path`).
fn home(tag: &str) -> Home {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let h = PathBuf::from(format!("/tmp/hadb{}-{n}{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&h);
    std::fs::create_dir_all(h.join("devices")).expect("mkdir");
    Home(h)
}

/// Adds a device to the stand-in; its directory.
fn add_device(home: &Path, serial: &str, sdk: u32, abi: &str) -> PathBuf {
    let d = home.join("devices").join(serial);
    std::fs::create_dir_all(d.join("fs/data/local/tmp")).expect("mkdir");
    std::fs::create_dir_all(d.join("fs/system/bin")).expect("mkdir");
    std::fs::write(
        d.join("props"),
        format!("ro.build.version.sdk={sdk}\nro.product.cpu.abi={abi}\n"),
    )
    .expect("props");
    d
}

/// `heapprofd-rs android ARGS` with the stand-in adb on PATH.
fn android(home: &Path, args: &[&str]) -> Command {
    let mut c = heapprofd();
    c.arg("android")
        .args(args)
        .env("PATH", format!("{}:/usr/bin:/bin", standins().display()))
        .env("FAKE_ADB_HOME", home)
        .env_remove("ANDROID_SERIAL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs it to its end: exit code and stderr.
fn android_run(mut c: Command) -> (i32, String) {
    let mut child = c.spawn().expect("start heapprofd-rs android");
    wait_exit(&mut child, "heapprofd-rs android")
}

/// `adb ARGS` of the stand-in, to its end; asserts success.
fn adb(home: &Path, args: &[&str]) -> String {
    let out = Command::new(standins().join("adb"))
        .args(args)
        .env("FAKE_ADB_HOME", home)
        .env_remove("ANDROID_SERIAL")
        .output()
        .expect("run the adb stand-in");
    assert!(
        out.status.success(),
        "adb {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The run directory `DIR/latest` points at (checking it is a relative
/// link to a `heapprofd-*` directory in DIR).
fn latest(out: &Path) -> PathBuf {
    let target = std::fs::read_link(out.join("latest")).expect("DIR/latest is a symlink");
    assert!(target.is_relative(), "{}", target.display());
    assert!(
        target.to_string_lossy().starts_with("heapprofd-"),
        "{}",
        target.display()
    );
    out.join(target)
}

/// (allocations, bytes) of the samples whose frames (names, or offline
/// symbols) hold `frame`.
fn totals(trace: &Path, frame: &str) -> (u64, u64) {
    let t = check_trace(trace);
    let mut got = (0, 0);
    for s in t.json["summary"]["heap_samples"]
        .as_array()
        .expect("samples")
    {
        let frames = s["frames"].as_array().expect("frames");
        let named = frames.iter().any(|f| {
            f["function"].as_str() == Some(frame)
                || f["symbols"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x.as_str() == Some(frame)))
        });
        if named {
            got.0 += s["alloc_count"].as_u64().unwrap_or(0);
            got.1 += s["self_allocated"].as_u64().unwrap_or(0);
        }
    }
    got
}

/// The names in a gzipped pprof file's string table hold `name`.
fn pprof_names(file: &Path, name: &str) -> bool {
    let mut gz = Command::new("gzip")
        .arg("-dc")
        .arg(file)
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip");
    let mut bytes = Vec::new();
    gz.stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut bytes)
        .expect("read");
    assert!(
        gz.wait().expect("gzip").success(),
        "{} is not gzip",
        file.display()
    );
    bytes.windows(name.len()).any(|w| w == name.as_bytes())
}

/// Pushes `prog` to the device as /data/local/tmp/many_stacks, runs
/// `android TARGET... -i 1 -o OUT --symbols DIR`, starts the program
/// (`many_stacks N`, the pushed client preloaded) once the device's
/// service's trigger store holds the line `wanted` (the profile is live),
/// then Ctrl-C; asserts exit 0. Its stderr and OUT.
fn profile_on_device(
    h: &Home,
    dev: &Path,
    prog: &Path,
    target: &[&str],
    wanted: &str,
    n: u32,
) -> (String, PathBuf) {
    adb(
        h,
        &[
            "push",
            prog.to_str().unwrap(),
            "/data/local/tmp/many_stacks",
        ],
    );
    adb(h, &["shell", "chmod 755 /data/local/tmp/many_stacks"]);
    let out = h.join("out");
    let symbols = prog.parent().unwrap().to_str().unwrap().to_owned();
    let mut args = target.to_vec();
    args.extend([
        "-i",
        "1",
        "-o",
        out.to_str().unwrap(),
        "--symbols",
        &symbols,
    ]);
    let mut c = android(h, &args);
    let mut run = Reaped(c.spawn().expect("start heapprofd-rs android"));
    // The profile is live on the device once the service's trigger store wants it.
    let store = dev
        .join("fs")
        .join(DEVICE_DIR)
        .join("service")
        .join(TRIGGERS_FILE);
    wait_for("the profile on the device", || {
        std::fs::read_to_string(&store).is_ok_and(|s| s.lines().any(|l| l == wanted))
            || run.0.try_wait().ok().flatten().is_some()
    });
    if run.0.try_wait().ok().flatten().is_some() {
        let (code, err) = wait_exit(&mut run.0, "heapprofd-rs android");
        panic!("android ended early (exit {code}):\n{err}");
    }
    adb(
        h,
        &[
            "shell",
            &format!(
                "LD_PRELOAD=/data/local/tmp/heapprofd-rs/libheapprofd_client.so \
                 HEAPPROFD_SERVICE_DIR=/data/local/tmp/heapprofd-rs/service \
                 /data/local/tmp/many_stacks {n}"
            ),
        ],
    );
    signal(&run.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut run.0, "heapprofd-rs android");
    assert_eq!(code, 0, "{err}");
    (err, out)
}

#[test]
fn profiles_a_program_on_the_device_and_writes_the_run() {
    let h = home("e2e");
    let dev = add_device(&h, SERIAL, 33, "x86_64");
    let (err, out) = profile_on_device(
        &h,
        &dev,
        &record_programs().path("many_stacks"),
        &["-n", "many_stacks"],
        "name 1 many_stacks",
        40,
    );
    assert!(
        err.contains("device emulator-5554: Android SDK 33, ABI x86_64"),
        "{err}"
    );
    assert!(err.contains("pushing the x86_64 build"), "{err}");
    assert!(
        err.contains("profiling many_stacks on emulator-5554 until Ctrl-C"),
        "{err}"
    );
    assert!(err.contains("stopping the profile"), "{err}");

    let run_dir = latest(&out);
    // The trace as the device wrote it has no names of the program's
    // functions; the symbolized one has them, every allocation of -i 1.
    assert_eq!(totals(&run_dir.join("raw.pftrace"), "stack_leaf"), (0, 0));
    assert_eq!(
        totals(&run_dir.join("trace.pftrace"), "stack_leaf"),
        (40, 40 * 32),
        "{err}"
    );
    let report = std::fs::read_to_string(run_dir.join("report")).expect("report");
    assert!(report.contains("stack_leaf"), "{report}");
    let pprofs: Vec<PathBuf> = std::fs::read_dir(&run_dir)
        .expect("run dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("heap_dump.")
        })
        .collect();
    assert_eq!(pprofs.len(), 1, "{pprofs:?}");
    let name = pprofs[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(name.ends_with(".libc.malloc.pb.gz"), "{name}");
    assert!(pprof_names(&pprofs[0], "stack_leaf"), "{name}");
    // The device's command line: the pushed binary as service and recorder.
    let log = std::fs::read_to_string(h.join("log")).expect("log");
    assert!(log.contains(&format!("-s {SERIAL} push")), "{log}");
    assert!(
        log.contains("heapprofd-rs daemon") && log.contains("record --config"),
        "{log}"
    );
}

/// An `arm64-v8a` device: the aarch64 build (found in the target
/// directory) pushed, and everything on the device (the pushed service,
/// `record`, the profiled aarch64 program) run by `qemu-aarch64-static`
/// (the stand-in wraps pushed aarch64 executables).
#[test]
fn profiles_on_an_arm64_device_under_qemu() {
    let build =
        heapprofd_tests::client_harness::target_dir().join("aarch64-unknown-linux-gnu/release");
    assert!(
        build.join("heapprofd-rs").is_file() && build.join("libheapprofd_client.so").is_file(),
        "{} lacks the aarch64 build: run `cargo build --release --target \
         aarch64-unknown-linux-gnu -p heapprofd-daemon -p heapprofd-client` (scripts/test.sh does)",
        build.display()
    );
    let h = home("arm64");
    let dev = add_device(&h, SERIAL, 34, "arm64-v8a");
    std::fs::write(
        dev.join("qemu"),
        "qemu-aarch64-static -L /usr/aarch64-linux-gnu",
    )
    .unwrap();
    let dir = h.join("prog");
    std::fs::create_dir_all(&dir).unwrap();
    let prog = dir.join("many_stacks");
    let src = workspace_root().join("tests/programs/record/many_stacks.c");
    heapprofd_tests::client_harness::compile(&[
        "aarch64-linux-gnu-gcc",
        "-O2",
        "-g",
        "-o",
        prog.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    // On the device the stand-in keeps it as many_stacks.elf (behind its
    // qemu wrapper): the symbol directory has it under that name too.
    std::fs::copy(&prog, dir.join("many_stacks.elf")).unwrap();
    // --all: the service under qemu reads a process's name from the
    // host's /proc/PID/cmdline, which for an emulated one is qemu's
    // command line, so `-n NAME` does not find emulated programs (said in
    // README); every process with the client does.
    let (err, out) = profile_on_device(&h, &dev, &prog, &["--all"], "all 1", 25);
    assert!(err.contains("ABI arm64-v8a"), "{err}");
    assert!(err.contains("pushing the aarch64 build"), "{err}");
    let run_dir = latest(&out);
    assert_eq!(
        totals(&run_dir.join("trace.pftrace"), "stack_leaf"),
        (25, 25 * 32),
        "{err}"
    );
}

#[test]
fn use_the_devices_perfetto() {
    let h = home("pf");
    let dev = add_device(&h, SERIAL, 30, "arm64-v8a");
    std::fs::copy(
        standins().join("perfetto"),
        dev.join("fs/system/bin/perfetto"),
    )
    .expect("cp");
    // What the device's heapprofd would have written: a trace without symbols.
    let prog = record_programs().path("many_stacks");
    let trace = h.join("device.pftrace");
    let rec = record(
        &["-i", "1", "--no-symbolize", "-o", trace.to_str().unwrap()],
        &[prog.to_str().unwrap(), "7"],
        std::time::Duration::from_secs(300),
    );
    assert_eq!(rec.code, Some(0), "{}", rec.stderr);
    let out = h.join("out");
    let symbols = record_programs().dir.to_str().unwrap().to_owned();
    let mut c = android(
        &h,
        &[
            "--perfetto",
            "-n",
            "many_stacks",
            "-i",
            "1",
            "-d",
            "2s",
            "-o",
            out.to_str().unwrap(),
            "--symbols",
            &symbols,
        ],
    );
    c.env("FAKE_PERFETTO_TRACE", &trace);
    let (code, err) = android_run(c);
    assert_eq!(code, 0, "{err}");
    let log = std::fs::read_to_string(h.join("log")).expect("log");
    assert!(
        log.lines().any(|l| l.starts_with(&format!(
            "-s {SERIAL} shell perfetto --txt -c - -o /data/misc/perfetto-traces/heapprofd-rs-"
        )) && l.ends_with(" -d")),
        "{log}"
    );
    assert!(
        !log.contains(" push "),
        "nothing pushed with --perfetto:\n{log}"
    );
    let config = std::fs::read_to_string(dev.join("fs/perfetto-config.txt")).expect("config");
    for want in [
        "name: \"android.heapprofd\"",
        "process_cmdline: \"many_stacks\"",
        "sampling_interval_bytes: 1",
        "duration_ms: 2000",
    ] {
        assert!(config.contains(want), "{want} not in\n{config}");
    }
    let run_dir = latest(&out);
    assert_eq!(
        totals(&run_dir.join("trace.pftrace"), "stack_leaf"),
        (7, 7 * 32)
    );
    assert!(run_dir.join("report").is_file());
}

/// Runs `android -n x` against `home`; asserts exit 1 and that stderr
/// holds every one of `want`; the stderr.
fn fails_with(home: &Path, env: &[(&str, &str)], want: &[&str]) -> String {
    let mut c = android(home, &["-n", "x", "-o", home.join("out").to_str().unwrap()]);
    for (k, v) in env {
        c.env(k, v);
    }
    let (code, err) = android_run(c);
    assert_eq!(code, 1, "{err}");
    for w in want {
        assert!(err.contains(w), "`{w}` not in:\n{err}");
    }
    err
}

#[test]
fn no_adb_on_path() {
    let h = home("noadb");
    let empty = h.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    fails_with(
        &h,
        &[("PATH", empty.to_str().unwrap())],
        &["adb was not found on PATH", "platform-tools"],
    );
}

#[test]
fn no_device() {
    let h = home("nodev");
    fails_with(&h, &[], &["no device", "adb devices"]);
}

#[test]
fn two_devices_need_android_serial() {
    let h = home("two");
    add_device(&h, SERIAL, 33, "x86_64");
    add_device(&h, "emulator-5556", 28, "x86_64");
    fails_with(
        &h,
        &[],
        &[
            "2 devices are connected",
            "emulator-5554 device, emulator-5556 device",
            "ANDROID_SERIAL=SERIAL",
        ],
    );
    // ANDROID_SERIAL picks one: here the old one, which the next check refuses.
    fails_with(
        &h,
        &[("ANDROID_SERIAL", "emulator-5556")],
        &["device emulator-5556 runs Android SDK 28"],
    );
}

#[test]
fn old_android() {
    let h = home("old");
    add_device(&h, SERIAL, 28, "x86_64");
    fails_with(
        &h,
        &[],
        &["runs Android SDK 28", "needs Android 10 (SDK 29) or later"],
    );
}

#[test]
fn a_build_of_another_abi() {
    let h = home("abi");
    add_device(&h, SERIAL, 33, "arm64-v8a");
    let x86 = heapprofd_tests::record_harness::release_bins()
        .heapprofd
        .parent()
        .unwrap()
        .to_owned();
    let c = android(
        &h,
        &[
            "-n",
            "x",
            "-o",
            h.join("out").to_str().unwrap(),
            "--device-build",
            x86.to_str().unwrap(),
        ],
    );
    let (code, err) = android_run(c);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("does not hold heapprofd-rs and libheapprofd_client.so built for aarch64"),
        "{err}"
    );
    assert!(
        err.contains("cargo build --release --target aarch64-linux-android"),
        "{err}"
    );
}

#[test]
fn push_failure() {
    let h = home("push");
    let dev = add_device(&h, SERIAL, 33, "x86_64");
    std::fs::write(dev.join("faults"), "push-fails\n").unwrap();
    fails_with(
        &h,
        &[],
        &[
            "pushing",
            "to emulator-5554:/data/local/tmp/heapprofd-rs/heapprofd-rs failed",
            "No space left on device",
        ],
    );
}

/// The device goes away once the profile has written its first bytes:
/// exit 1, the partial trace pulled and flagged when the device comes
/// back, nothing when it does not.
#[test]
fn device_gone_mid_profile() {
    let h = home("gone");
    let dev = add_device(&h, SERIAL, 33, "x86_64");
    std::fs::write(dev.join("faults"), "gone-mid-profile\n").unwrap();
    let err = fails_with(
        &h,
        &[],
        &[
            "the device went away during the profile",
            "pulled the partial trace",
            "reconnect it",
        ],
    );
    let run = std::fs::read_dir(h.join("out"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("heapprofd-")
        })
        .expect("the run's directory");
    let partial = run.join("trace.partial.pftrace");
    assert!(
        std::fs::metadata(&partial).is_ok_and(|m| m.len() > 0),
        "{err}"
    );
    assert!(
        std::fs::read_to_string(run.join("PARTIAL"))
            .unwrap()
            .contains("device")
    );
    assert!(
        !h.join("out/latest").exists(),
        "a lost run is not the latest"
    );

    let h = home("gone2");
    let dev = add_device(&h, SERIAL, 33, "x86_64");
    std::fs::write(dev.join("faults"), "gone-for-good\n").unwrap();
    fails_with(
        &h,
        &[],
        &[
            "the device went away during the profile",
            "no trace could be pulled",
        ],
    );
}

#[test]
fn bad_usage() {
    let h = home("usage");
    let (code, err) = android_run(android(&h, &[]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("-n NAME"), "{err}");
    let (code, err) = android_run(android(&h, &["-n", "x", "-i", "0"]));
    assert_eq!(code, 2, "{err}");
}

#[test]
fn print_config_needs_no_device() {
    let h = home("print");
    let mut c = android(
        &h,
        &["-n", "x,y", "-i", "1", "-c", "500ms", "--print-config"],
    );
    c.env("PATH", "/nonexistent");
    let out = c.output().expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "name: \"android.heapprofd\"",
        "process_cmdline: \"x\"",
        "process_cmdline: \"y\"",
        "sampling_interval_bytes: 1",
        "dump_interval_ms: 500",
    ] {
        assert!(text.contains(want), "{want} not in\n{text}");
    }
}

/// A pushed binary that fails on the device (here `/bin/false` as
/// `heapprofd-rs`): the device's own failure, not a lost device; exit 1,
/// nothing partial.
#[test]
fn the_service_fails_on_the_device() {
    let h = home("false");
    add_device(&h, SERIAL, 33, "x86_64");
    let build = h.join("build");
    std::fs::create_dir_all(&build).unwrap();
    std::fs::copy("/bin/false", build.join("heapprofd-rs")).unwrap();
    let client = &heapprofd_tests::record_harness::release_bins().client_so;
    std::fs::copy(client, build.join("libheapprofd_client.so")).unwrap();
    let c = android(
        &h,
        &[
            "-n",
            "x",
            "-o",
            h.join("out").to_str().unwrap(),
            "--device-build",
            build.to_str().unwrap(),
        ],
    );
    let (code, err) = android_run(c);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("device: heapprofd-rs: the profiling service did not start on the device"),
        "{err}"
    );
    assert!(
        err.contains("the profile failed on the device (exit 1)"),
        "{err}"
    );
    assert!(!err.contains("went away"), "{err}");
}
