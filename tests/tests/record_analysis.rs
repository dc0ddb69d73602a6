//! End-to-end tests of what `report` and `convert` tell about real runs
//! (issue 10 §4 and issue 17): counts that say what they are, sites past
//! allocator plumbing in C++ and Rust release programs, truncated traces,
//! the Perfetto UI's view (trace processor), and the analyses' ground
//! truth: `--diff` of two runs, `--peak` and `--timeline` of a `-c` run,
//! temporary allocations, `convert` to stdout.
//!
//! Programs: `tests/programs/record/analysis.c`, `sites.cpp`, `sites.rs`
//! (each documents its arguments). No assertion depends on timing: a test
//! that needs a dump at some point waits until the trace has it.

use std::path::Path;

use heapprofd_tests::record_harness::{check_trace, heapprofd, heapprofd_ok, record, scratch_dir};
use heapprofd_tests::report_harness::{
    TIMEOUT, cli_json as json, grown_sites, peak_trace, pprof_main_file, pprof_samples, prog,
    recorded, run_cli as run, s, stepped_trace,
};

#[test]
fn sampled_counts_are_samples_with_an_estimate() {
    let dir = scratch_dir("estimate");
    // 200,000 allocations of 32 bytes; a fixed seed makes the run repeatable.
    let trace = recorded(
        &dir,
        "t.pftrace",
        &["-i", "4096", "--seed", "42"],
        &[&prog("analysis"), "temp", "100000"],
    );
    let text = heapprofd_ok(&["report", &s(&trace)]).stdout;
    let line = text.lines().find(|l| l.contains("allocated:")).unwrap();
    assert!(
        line.contains(" samples, ~") && line.contains("allocations est."),
        "{line}"
    );
    let v = json(&["report", "--format", "json", &s(&trace)]);
    let t = &v["heaps"][0]["totals"];
    let (samples, est) = (
        t["alloc_count"].as_u64().unwrap(),
        t["estimated_allocations"].as_f64().unwrap(),
    );
    // The program makes 200,000 allocations of 32 bytes (and a few more):
    // samples are about 1 in 128 of them, the estimate is within 10%.
    assert!(samples < 10_000, "{samples} samples");
    assert!((est - 200_000.0).abs() < 20_000.0, "estimate {est}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sites_are_past_allocator_plumbing_in_cxx_and_rust() {
    let dir = scratch_dir("plumbing");
    for (program, want) in [
        ("sites_cpp", ["fill_vector", "make_strings", "new_objects"]),
        // Line tables only: the names are the functions' own (`fill_vec`),
        // with the crate path when the symbol table names them.
        ("sites_rs", ["fill_vec", "make_strings", "boxes"]),
    ] {
        let trace = recorded(
            &dir,
            &format!("{program}.pftrace"),
            &["-i", "1"],
            &[&prog(program)],
        );
        let v = json(&["report", "--format", "json", "--top", "20", &s(&trace)]);
        let sites: Vec<String> = v["heaps"][0]["top_self"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["function"].as_str().unwrap_or("").to_owned())
            .collect();
        for w in want {
            assert!(
                sites
                    .iter()
                    .any(|x| x.starts_with(w) || x.ends_with(&format!("::{w}"))),
                "{program}: no self site {w} in {sites:?}"
            );
        }
        let plumbing = |x: &str| {
            x.starts_with("operator new")
                || x.starts_with("alloc::")
                || x.starts_with("std::")
                || ["alloc", "__rust_alloc", "grow_one", "finish_grow"].contains(&x)
        };
        assert!(
            !sites.iter().take(3).any(|x| plumbing(x)),
            "{program}: plumbing among the top sites {sites:?}"
        );
        // The trace keeps every frame: the leaf is still the allocator's.
        let folded =
            heapprofd_ok(&["convert", &s(&trace), "--collapsed", "-", "--full-names"]).stdout;
        assert!(
            folded.contains("operator new") || folded.contains("alloc"),
            "{program}: the plumbing frames are in the stacks"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_truncated_trace_fails_after_what_it_could_read() {
    let dir = scratch_dir("cut");
    let trace = recorded(
        &dir,
        "t.pftrace",
        &["-i", "1"],
        &[&prog("many_stacks"), "600"],
    );
    // `convert ... - | head`: a reader that stops reading ends convert
    // quietly, as it does report (it said "cannot write stdout (disk
    // full?): Broken pipe" and exited 1 once the folded stacks outgrew
    // the 8 KiB output buffer).
    for out in [["convert", "--collapsed", "-"], ["report", "--top", "600"]] {
        let (closed, stdout) = closed_pipe();
        drop(closed);
        let o =
            std::process::Command::new(&heapprofd_tests::record_harness::release_bins().heapprofd)
                .args([out[0], &s(&trace), out[1], out[2]])
                .stdout(stdout)
                .output()
                .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{out:?} into a closed pipe: {stderr}"
        );
        assert!(!stderr.contains("error"), "{out:?}: {stderr}");
    }
    let bytes = std::fs::read(&trace).unwrap();
    assert!(bytes.len() > 5000);
    let cut = dir.join("cut.pftrace");
    std::fs::write(&cut, &bytes[..5000]).unwrap();
    let out = run(&["report", &s(&cut)]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("is truncated") && out.stderr.contains("of 5000"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stdout.contains("nothing was sampled"),
        "{}",
        out.stdout
    );
    let out = run(&["report", "/nonexistent.pftrace"]);
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr
            .contains("cannot read trace /nonexistent.pftrace: no such file"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn convert_writes_stdout_for_dash_and_names_the_program() {
    let dir = scratch_dir("convert");
    let trace = recorded(&dir, "t.pftrace", &["-i", "1"], &[&prog("alloc_truth")]);
    let here = std::env::current_dir().unwrap();
    let out = heapprofd_ok(&["convert", &s(&trace), "--collapsed", "-"]);
    assert!(
        out.stdout
            .lines()
            .any(|l| l.ends_with(";main;leak_malloc 100000")),
        "{}",
        out.stdout
    );
    assert!(!here.join("-").exists(), "a file named - was written");
    // The flame graph's default is allocated bytes, named in the title
    // with the program (it drew unreleased bytes, "heapprofd-...pftrace").
    let svg = dir.join("f.svg");
    heapprofd_ok(&["convert", &s(&trace), "--svg", &s(&svg)]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("alloc_truth: allocated bytes"), "title");
    // pprof's `File:` header is the first mapping: the program, not libc.
    let pprof = dir.join("p.pb.gz");
    heapprofd_ok(&["convert", &s(&trace), "--pprof", &s(&pprof)]);
    let file = pprof_main_file(&pprof);
    assert!(file.ends_with("/alloc_truth"), "pprof File: {file}");
    // The inclusive table is not filled by entry frames (it says what it
    // left out); unwinding time has the digits to be read.
    let text = heapprofd_ok(&["report", &s(&trace)]).stdout;
    let inclusive = text
        .split("TOP FUNCTIONS (inclusive")
        .nth(1)
        .unwrap()
        .split("TOP UNRELEASED")
        .next()
        .unwrap();
    let listed: Vec<&str> = inclusive
        .lines()
        .filter_map(|l| l.split("allocation").nth(1))
        .filter_map(|l| l.trim_start_matches('s').split_whitespace().next())
        .collect();
    assert!(listed.contains(&"leak_malloc"), "{inclusive}");
    for entry in ["_start", "__libc_start_main_impl", "__libc_start_call_main"] {
        assert!(!listed.contains(&entry), "{entry} in {listed:?}");
    }
    assert!(
        inclusive.contains("(left out: program entry frames"),
        "{inclusive}"
    );
    let unwinding = text.lines().find(|l| l.contains("unwinding:")).unwrap();
    assert!(!unwinding.contains("mean 0 us"), "{unwinding}");
    let mean: f64 = unwinding
        .split("mean ")
        .nth(1)
        .and_then(|m| m.split(' ').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("{unwinding}"));
    assert!(mean > 0.0, "{unwinding}");
    // An output that cannot be created is bad usage in convert as in record.
    let out = run(&["convert", &s(&trace), "--svg", "/no/such/dir/x.svg"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let out = record(&["-o", "/no/such/dir/t.pftrace"], &["true"], TIMEOUT);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_usage_starts_nothing_and_leaves_nothing() {
    let dir = scratch_dir("usage");
    let trace = dir.join("t.pftrace");
    // A unique argument, to look for a leftover `sleep` afterwards.
    let marker = "4242.125";
    std::fs::set_permissions(&dir, {
        let mut p = std::fs::metadata(&dir).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o700);
        p
    })
    .unwrap();
    let mut c = heapprofd();
    c.env("TMPDIR", &dir).env("XDG_RUNTIME_DIR", &dir);
    c.args(["record", "-c", "0", "-o", &s(&trace), "--", "sleep", marker]);
    let out = heapprofd_tests::client_harness::run(c, TIMEOUT);
    assert_eq!(out.code, Some(2), "exit 134 was a panic: {}", out.stderr);
    assert!(out.stderr.contains("continuous-dump"), "{}", out.stderr);
    let leftover = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).split('\0').any(|a| a == marker))
    });
    assert!(!leftover, "a sleep was left running");
    // The runtime directory (XDG_RUNTIME_DIR/heapprofd-rs: the scratch
    // directory is private) holds no socket.
    fn sockets(d: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                sockets(&e.path(), out);
            } else if e.file_name().to_string_lossy().ends_with(".sock") {
                out.push(e.path());
            }
        }
    }
    let mut socks = Vec::new();
    sockets(&dir, &mut socks);
    assert!(socks.is_empty(), "stale sockets: {socks:?}");
    assert!(!trace.exists());
    // A missing program: 127, as a shell; one that is not executable: 126.
    let out = record(&["-o", &s(&trace)], &["./no-such-program-xyz"], TIMEOUT);
    assert_eq!(out.code, Some(127), "{}", out.stderr);
    let out = record(&["-o", &s(&trace)], &["/etc/hostname"], TIMEOUT);
    assert_eq!(out.code, Some(126), "{}", out.stderr);
    // The command without `--`: the line to type.
    let out = run(&["record", "-i", "1", "ls", "-l"]);
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr.contains("heapprofd-rs record -i 1 -- ls -l"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_status_line_runs_into_the_programs_output() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!(
            "\n!!!!! SKIPPED: `script` (util-linux) is not installed: no pty to test with !!!!!\n"
        );
        return;
    }
    let dir = scratch_dir("status");
    let trace = dir.join("t.pftrace");
    // `script` gives record a terminal; the program prints a line every
    // 0.6 s (longer than the status line's 0.5 s refresh).
    let cmd = format!(
        "{} record -o {} -- sh -c 'for i in 1 2 3; do echo program output line $i; sleep 0.6; done'",
        heapprofd_tests::record_harness::release_bins()
            .heapprofd
            .display(),
        trace.display()
    );
    let mut c = std::process::Command::new("script");
    c.args(["-qefc", &cmd, "/dev/null"]);
    let out = heapprofd_tests::client_harness::run(c, TIMEOUT);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("program output line 3"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("[heapprofd-rs "),
        "a live status line on the program's terminal: {:?}",
        out.stdout
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn diff_puts_the_function_that_grew_first() {
    let dir = scratch_dir("diff");
    for (interval, tolerance) in [("1", 0.0), ("4096", 0.05)] {
        let args = ["-i", interval, "--seed", "7"];
        let base = recorded(
            &dir,
            "base.pftrace",
            &args,
            &[&prog("analysis"), "diff", "1"],
        );
        let new = recorded(
            &dir,
            "new.pftrace",
            &args,
            &[&prog("analysis"), "diff", "3"],
        );
        let v = json(&["report", "--format", "json", "--diff", &s(&base), &s(&new)]);
        let top = &v["grew"][0];
        assert_eq!(top["function"], "grow_site", "-i {interval}: {v}");
        let d = top["delta_allocated"].as_f64().unwrap();
        let want = f64::from(2 << 20);
        assert!(
            (d - want).abs() <= want * tolerance,
            "-i {interval}: grow_site grew {d}, want +2 MiB"
        );
        // steady_site allocates the same in both runs.
        let steady = v["grew"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["function"] == "steady_site");
        if interval == "1" {
            assert!(steady.is_none(), "{v}");
        }
        // Per function (inclusive): grow_site too, not the entry frames or
        // main (on every stack: its growth is the total's).
        let inclusive: Vec<&str> = v["grew_inclusive"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["function"].as_str().unwrap())
            .collect();
        assert_eq!(inclusive.first(), Some(&"grow_site"), "{inclusive:?}");
        for f in ["_start", "__libc_start_main_impl", "main"] {
            assert!(!inclusive.contains(&f), "{f} in {inclusive:?}");
        }
        let text = heapprofd_ok(&["report", "--diff", &s(&base), &s(&new)]).stdout;
        let first = text
            .split("GREW MOST (self")
            .nth(1)
            .unwrap()
            .lines()
            .nth(1)
            .unwrap();
        assert!(first.contains("grow_site"), "{text}");
        if interval == "1" {
            assert!(first.contains("+2.00 MiB"), "{first}");
        }
        // convert --diff: folded with both values, a differential flame
        // graph, a pprof of the growth.
        let (folded, svg, pprof) = (dir.join("d.txt"), dir.join("d.svg"), dir.join("d.pb.gz"));
        heapprofd_ok(&[
            "convert",
            "--diff",
            &s(&base),
            &s(&new),
            "--collapsed",
            &s(&folded),
            "--svg",
            &s(&svg),
            "--pprof",
            &s(&pprof),
        ]);
        let f = std::fs::read_to_string(&folded).unwrap();
        let line = f.lines().find(|l| l.contains(";grow_site ")).unwrap();
        let nums: Vec<u64> = line
            .rsplit(' ')
            .take(2)
            .map(|x| x.parse().unwrap())
            .collect();
        assert!(nums[0] > nums[1], "new > base: {line}");
        let svg = std::fs::read_to_string(&svg).unwrap();
        assert!(
            svg.contains("grow_site") && svg.contains("red grew"),
            "diff SVG"
        );
        // The pprof of the growth: grow_site's stacks add up to +2 MiB of
        // allocated bytes, steady_site's to nothing.
        let (types, samples) = pprof_samples(&pprof);
        let space = types
            .iter()
            .position(|t| t == "alloc_space/bytes")
            .unwrap_or_else(|| panic!("{types:?}"));
        let growth = |site: &str| -> i64 {
            samples
                .iter()
                .filter(|(names, _)| names.iter().any(|n| n == site))
                .map(|(_, v)| v[space])
                .sum()
        };
        let g = growth("grow_site") as f64;
        assert!(
            (g - want).abs() <= want * tolerance,
            "-i {interval}: pprof diff of grow_site {g}, want +2 MiB"
        );
        if interval == "1" {
            assert_eq!(growth("steady_site"), 0, "{samples:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn peak_and_timeline_of_a_continuous_dump_run() {
    let dir = scratch_dir("peak");
    let trace = peak_trace(&dir);
    let v = json(&["report", "--format", "json", "--peak", &s(&trace)]);
    let h = &v["heaps"][0];
    assert_eq!(h["as_of"]["why"], "peak of unreleased memory", "{h}");
    let peak = h["totals"]["unreleased"].as_f64().unwrap();
    assert!(
        (peak - f64::from(100 << 20)).abs() < f64::from(2 << 20),
        "peak {peak}"
    );
    assert_eq!(h["top_unreleased"][0]["function"], "peak_site");
    // The timeline rises to ~100 MiB, falls, ends at ~10 MiB.
    let t = json(&["report", "--format", "json", "--timeline", &s(&trace)]);
    let rows = t["heaps"][0]["rows"].as_array().unwrap();
    let un: Vec<f64> = rows
        .iter()
        .map(|r| r["unreleased"].as_f64().unwrap())
        .collect();
    let max_i = (0..un.len())
        .max_by(|&a, &b| un[a].total_cmp(&un[b]))
        .unwrap();
    assert!(un[max_i] > f64::from(98 << 20), "{un:?}");
    assert!(
        un[max_i + 1..].iter().any(|&u| u < f64::from(12 << 20)),
        "the fall: {un:?}"
    );
    let last = *un.last().unwrap();
    assert!(
        (last - f64::from(10 << 20)).abs() < f64::from(2 << 20),
        "{un:?}"
    );
    assert!(rows.iter().any(|r| r["grew_most"][0] == "peak_site"), "{t}");
    for r in rows {
        // `grew_most` (kept for old readers) is the first of the list.
        assert_eq!(r["grew_most"][0], r["grew_most_sites"][0]["site"], "{r}");
    }
    let text = heapprofd_ok(&["report", "--timeline", &s(&trace)]).stdout;
    assert!(text.contains("* peak: dump"), "{text}");
    // Two sites growing at different rates: each dump that saw both grow
    // lists both, the faster first (fast_site's blocks are 4 times
    // slow_site's and the two alternate, so between any two dumps it grew
    // more); across the dumps they grew by 4 MiB and 1 MiB.
    let two = stepped_trace(&dir, "two.pftrace", &["grow2"]);
    let t = json(&["report", "--format", "json", "--timeline", &s(&two)]);
    let rows = grown_sites(&t);
    let both: Vec<_> = rows
        .iter()
        .filter(|l| l.iter().any(|g| g.0 == "slow_site") && l.iter().any(|g| g.0 == "fast_site"))
        .collect();
    assert!(!both.is_empty(), "no dump saw both grow: {t}");
    for l in &both {
        let at = |site: &str| l.iter().position(|g| g.0 == site).unwrap();
        assert!(at("fast_site") < at("slow_site"), "{l:?}");
        assert!(l[at("fast_site")].1 > l[at("slow_site")].1, "{l:?}");
    }
    let total = |site: &str| -> i64 {
        rows.iter()
            .flatten()
            .filter(|g| g.0 == site)
            .map(|g| g.1)
            .sum()
    };
    assert_eq!(
        (total("fast_site"), total("slow_site")),
        (4 << 20, 1 << 20),
        "{t}"
    );
    // --top 1 lists one.
    let t1 = grown_sites(&json(&[
        "report",
        "--format",
        "json",
        "--timeline",
        "--top",
        "1",
        &s(&two),
    ]));
    assert!(
        t1.iter().all(|l| l.len() <= 1) && t1.iter().any(|l| l.len() == 1),
        "{t1:?}"
    );
    let text = heapprofd_ok(&["report", "--timeline", &s(&two)]).stdout;
    assert!(
        text.lines()
            .any(|l| l.contains("fast_site, +") && l.contains("slow_site")),
        "{text}"
    );
    let svg = dir.join("tl.svg");
    heapprofd_ok(&["convert", &s(&trace), "--timeline-svg", &s(&svg)]);
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.contains("<polyline") && plot.contains("analysis"),
        "plot"
    );
    // The PNG: its signature and, in the IHDR chunk, 960 × 420 pixels.
    let png = dir.join("tl.png");
    heapprofd_ok(&["convert", &s(&trace), "--timeline-png", &s(&png)]);
    let b = std::fs::read(&png).unwrap();
    assert!(
        b.starts_with(b"\x89PNG\r\n\x1a\n") && &b[12..16] == b"IHDR",
        "png"
    );
    let be = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    assert_eq!((be(16), be(20)), (960, 420));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn temporary_allocations_are_exact() {
    let dir = scratch_dir("temp");
    let n = 1_000_000u64;
    let trace = recorded(
        &dir,
        "t.pftrace",
        &["-i", "1"],
        &[&prog("analysis"), "temp", &n.to_string()],
    );
    let v = json(&["report", "--format", "json", "--top", "30", &s(&trace)]);
    let h = &v["heaps"][0];
    let site = |name: &str| {
        h["top_self"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["function"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no site {name}: {h}"))
    };
    let (temp, long) = (site("temp_site"), site("long_site"));
    assert_eq!(temp["alloc_count"], n);
    assert_eq!(
        temp["temporary"], n,
        "every temp_site allocation is temporary"
    );
    assert_eq!(long["alloc_count"], n);
    assert_eq!(long["temporary"], 0, "long_site's are not");
    // Short-lived (freed within N = 1023 allocations by default): every
    // temp_site allocation (freed within 0), none of long_site's (each
    // lives through temp_site's 1M allocations).
    assert_eq!(temp["short_lived"], n);
    assert_eq!(long["short_lived"], 0, "{long}");
    assert_eq!(h["short_lived_within"], 1023);
    // With N = 2^22 - 1 (more than the 2M allocations of the run),
    // long_site's are short-lived too.
    let wide = json(&[
        "report",
        "--format",
        "json",
        "--top",
        "30",
        "--short-lived",
        "4194303",
        &s(&trace),
    ]);
    let long_wide = wide["heaps"][0]["top_self"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["function"] == "long_site")
        .cloned()
        .unwrap();
    assert_eq!(long_wide["short_lived"], n, "{long_wide}");
    assert_eq!(wide["heaps"][0]["short_lived_within"], 4194303);
    // Size histograms: every allocation of both sites asked for 32 bytes;
    // the process's histogram has their 2M in the 32-63 bucket.
    for site in [&temp, &long] {
        let sizes = site["sizes"].as_array().unwrap();
        assert_eq!(sizes.len(), 1, "{site}");
        assert_eq!(
            (&sizes[0]["low"], &sizes[0]["high"]),
            (&32.into(), &63.into())
        );
        assert_eq!(sizes[0]["samples"], n);
    }
    let bucket = h["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["low"] == 32)
        .unwrap();
    assert!(bucket["samples"].as_u64().unwrap() >= 2 * n, "{bucket}");
    assert_eq!(h["top_temporary"][0]["function"], "temp_site");
    let text = heapprofd_ok(&["report", &s(&trace)]).stdout;
    assert!(text.contains("TOP TEMPORARY ALLOCATIONS"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_perfetto_ui_sees_the_window_and_the_process_tree() {
    let dir = scratch_dir("tp");
    let trace = recorded(
        &dir,
        "t.pftrace",
        &["-i", "1"],
        &[
            "sh",
            "-c",
            &format!("sleep 0.3; {}; true", prog("alloc_truth")),
        ],
    );
    // What the trace says, read with the official schema (always).
    let t = check_trace(&trace);
    let procs = t.json["summary"]["processes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let pid_of = |want: &dyn Fn(&[serde_json::Value]) -> bool| {
        procs
            .iter()
            .find(|p| want(p["cmdline"].as_array().map_or(&[], Vec::as_slice)))
            .map(|p| (p["pid"].as_u64(), p["ppid"].as_u64()))
    };
    // (A child that sh forks shows up as `sh` until it execs: look up the
    // parent by pid rather than the first `sh`.)
    let child = pid_of(&|c| {
        c.first()
            .and_then(|a| a.as_str())
            .is_some_and(|a| a.ends_with("alloc_truth"))
    })
    .unwrap_or_else(|| panic!("no alloc_truth in the process tree: {procs:?}"));
    let parent = procs
        .iter()
        .find(|p| p["pid"].as_u64().is_some() && p["pid"].as_u64() == child.1)
        .unwrap_or_else(|| {
            panic!(
                "alloc_truth's parent {:?} is not in the tree: {procs:?}",
                child.1
            )
        });
    assert_eq!(
        parent["cmdline"][0], "sh",
        "alloc_truth's parent is sh: {procs:?}"
    );
    let named = t.json["summary"]["threads"]
        .as_array()
        .map_or(0, |v| v.iter().filter(|t| t["name"].is_string()).count());
    assert!(
        named >= 2,
        "thread names in the trace: {}",
        t.json["summary"]["threads"]
    );
    // The time range. trace_processor bounds a trace by its events (its
    // `trace_bounds`: counters, heap profile allocations...), not by clock
    // snapshots: without the memory counters `record` writes when a
    // process's session starts, the range was the dumps' instants alone
    // (1 ns for one dump). sh slept 0.3 s, profiled, before the dump: the
    // first counter (sh's) comes at least 250 ms before the last dump.
    let first_counter = t.json["summary"]["process_stats"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["pids"]
                .as_array()
                .is_some_and(|v| v.iter().any(|x| x.as_u64() == child.1))
        })
        .filter_map(|p| p["timestamp"].as_u64())
        .min()
        .unwrap_or_else(|| {
            panic!(
                "no memory counters of sh (pid {:?}) in the trace: {}",
                child.1, t.json["summary"]["process_stats"]
            )
        });
    let last_dump = t
        .dumps
        .iter()
        .filter_map(|d| d["packet_timestamp"].as_u64())
        .max()
        .expect("a heap dump");
    assert!(
        last_dump.saturating_sub(first_counter) > 250_000_000,
        "the trace's events span {} ns, not the 0.3 s sh was profiled before the dump",
        last_dump.saturating_sub(first_counter)
    );

    // What the UI shows, through trace_processor (when it is on the machine:
    // it is built locally, never in CI).
    let tp = Path::new("/work/tools/bin/tp-query");
    if !tp.is_file() {
        eprintln!(
            "the_perfetto_ui_sees_the_window_and_the_process_tree: trace_processor \
             (/work/tools/bin/tp-query) is not on this machine; checked the trace's own \
             process tree only"
        );
        return;
    }
    let q = |sql: &str| {
        let out = std::process::Command::new(tp)
            .arg(&trace)
            .arg(sql)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let bounds = q("select end_ts - start_ts as dur from trace_bounds");
    let dur: u64 = bounds.lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(dur > 250_000_000, "the trace spans the session: {dur} ns");
    let procs = q(
        "select count(*) from process p join process q on p.parent_upid = q.upid \
                   where p.name like '%alloc_truth%' and q.name = 'sh'",
    );
    assert_eq!(
        procs.lines().nth(1).unwrap().trim(),
        "1",
        "alloc_truth's parent is sh"
    );
    let threads = q("select count(*) from thread where name is not null and tid != 0");
    assert!(
        threads
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
            >= 2
    );
    let slices = q("select count(*) from heap_profile_allocation");
    assert!(
        slices
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    let stats = q("select name from stats where value > 0 and severity != 'info'");
    assert_eq!(stats.lines().count(), 1, "error stats: {stats}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pipe's (read end, write end as a child's stdout).
fn closed_pipe() -> (std::os::fd::OwnedFd, std::process::Stdio) {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fresh descriptors, which we then own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: as above.
    let (r, w) = unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    (r, std::process::Stdio::from(w))
}
