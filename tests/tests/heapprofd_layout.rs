//! `report` and `convert` on traces laid out as Perfetto's own heapprofd
//! writes them (issue 17: "all of it reads traces written by Perfetto's
//! heapprofd too"). The traces are written by
//! `tests/scripts/heapprofd_layout_trace.py` with the official schema (the
//! `perfetto` PyPI package), not by our writer: fixed internings first,
//! samples before the interned data they use, a group ended by an empty
//! ProfilePacket, cumulative values, no heapprofd-rs extension, no process
//! names, traced's clock snapshot; heapprofd's one string interner for
//! function names, path components and build ids (disjoint iids), callstack
//! iids that are callstack-trie node ids (sparse, never the root's 1), raw
//! build ids, mapping offsets and load bias, ProcessStats with the unwinding
//! time histogram. No Perfetto-written trace can be made on this machine
//! (Perfetto's heapprofd needs libunwindstack from android.googlesource.com)
//! or fetched from a package registry (the `perfetto` PyPI package ships
//! none; Perfetto's own test traces are stored outside its repository); the
//! script follows `src/profiling/memory` and `src/profiling/common` as
//! documented in the research notes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use heapprofd_tests::client_harness::{Output, run, workspace_root};
use heapprofd_tests::record_harness::{heapprofd, scratch_dir};

const TIMEOUT: Duration = Duration::from_secs(120);

/// Writes the `base` or `new` trace of the script into `dir`.
fn trace(dir: &Path, variant: &str) -> PathBuf {
    let out = dir.join(format!("{variant}.pftrace"));
    let mut c = Command::new("python3");
    c.arg(workspace_root().join("tests/scripts/heapprofd_layout_trace.py"))
        .arg(&out)
        .arg(variant);
    let o = run(c, TIMEOUT);
    assert_eq!(o.code, Some(0), "heapprofd_layout_trace.py: {}", o.stderr);
    out
}

fn cli(args: &[&str]) -> Output {
    let mut c = heapprofd();
    c.args(args);
    let o = run(c, TIMEOUT);
    assert_eq!(
        o.code,
        Some(0),
        "heapprofd-rs {args:?} failed:\n{}",
        o.stderr
    );
    o
}

/// The text of one process's section of a report.
fn section(text: &str, pid: u32) -> &str {
    text.split("PROCESS ")
        .find(|s| s.starts_with(&format!("{pid},")) || s.starts_with(&format!("{pid} ")))
        .unwrap_or_else(|| panic!("no PROCESS {pid} in:\n{text}"))
}

#[test]
fn report_reads_the_latest_dump_of_each_process() {
    let dir = scratch_dir("hpd-layout-report");
    let base = trace(&dir, "base");
    let text = cli(&["report", base.to_str().unwrap()]).stdout;
    let p42 = section(&text, 42);
    assert!(p42.contains("2 dump(s) over 1.000 s"), "{p42}");
    assert!(
        p42.contains("allocated: 107.00 MiB in 107 samples (3 stacks)"),
        "{p42}"
    );
    assert!(p42.contains("unreleased: 7.00 MiB in 7 samples"), "{p42}");
    let first_site = p42
        .split("TOP ALLOCATION SITES")
        .nth(1)
        .and_then(|s| s.lines().nth(1))
        .unwrap_or_default();
    assert!(
        first_site.contains("100.00 MiB") && first_site.contains("grow_site"),
        "first site: {first_site}"
    );
    assert!(
        p42.contains("in /system/bin/app"),
        "mapping path from its parts"
    );
    let p43 = section(&text, 43);
    assert!(p43.contains("unreleased: 64.00 KiB in 1 sample\n"), "{p43}");
}

#[test]
fn timeline_and_peak_see_the_rise_and_fall() {
    let dir = scratch_dir("hpd-layout-timeline");
    let base = trace(&dir, "base");
    let text = cli(&["report", "--timeline", base.to_str().unwrap()]).stdout;
    let p42 = section(&text, 42);
    let rows: Vec<&str> = p42
        .lines()
        .filter(|l| l.contains(" s ") && l.contains("MiB"))
        .collect();
    assert_eq!(rows.len(), 2, "two dumps:\n{p42}");
    assert!(
        rows[0].contains("101.00 MiB") && rows[0].contains("grow_site"),
        "{}",
        rows[0]
    );
    assert!(
        rows[1].contains("7.00 MiB") && rows[1].contains("late_site"),
        "{}",
        rows[1]
    );
    assert!(p42.contains("peak: dump 1"), "{p42}");

    let text = cli(&["report", "--peak", base.to_str().unwrap()]).stdout;
    let p42 = section(&text, 42);
    assert!(p42.contains("dump 1 of 2"), "{p42}");
    assert!(p42.contains("unreleased: 101.00 MiB"), "{p42}");
    assert!(
        !p42.contains("over 0.000 s"),
        "the span is not the peak's: {p42}"
    );
}

#[test]
fn diff_finds_the_site_that_grew() {
    let dir = scratch_dir("hpd-layout-diff");
    let base = trace(&dir, "base");
    let new = trace(&dir, "new");
    let text = cli(&[
        "report",
        "--diff",
        base.to_str().unwrap(),
        new.to_str().unwrap(),
    ])
    .stdout;
    let grew = text
        .split("GREW MOST (self, allocated bytes)")
        .nth(1)
        .and_then(|s| s.lines().nth(1))
        .unwrap_or_default();
    assert!(
        grew.contains("+2.00 MiB") && grew.contains("grow_site"),
        "first growth: {grew}\n{text}"
    );
}

#[test]
fn convert_writes_every_format() {
    let dir = scratch_dir("hpd-layout-convert");
    let base = trace(&dir, "base");
    let b = base.to_str().unwrap();
    let folded = cli(&["convert", b, "--collapsed", "-", "--value", "alloc-space"]).stdout;
    let grow: u64 = folded
        .lines()
        .filter(|l| l.contains("grow_site"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(grow, 100 << 20, "grow_site's allocated bytes:\n{folded}");
    assert!(
        folded
            .lines()
            .any(|l| l.starts_with("pid 42;heap libc.malloc;__libc_init;main;grow_site;malloc ")),
        "process, heap, then frames root first:\n{folded}"
    );

    let html = dir.join("base.html");
    let svg = dir.join("base.svg");
    let pprof = dir.join("base.pb.gz");
    cli(&[
        "convert",
        b,
        "--html",
        html.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
        "--pprof",
        pprof.to_str().unwrap(),
    ]);
    let page = std::fs::read_to_string(&html).expect("the HTML page");
    assert!(page.contains("grow_site") && page.contains("late_site"));
    // Offline: the only URL is the SVG namespace (a name, never fetched).
    let urls: Vec<&str> = page
        .match_indices("http")
        .map(|(i, _)| &page[i..(i + 40).min(page.len())])
        .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
        .filter(|u| !u.starts_with("http://www.w3.org/2000/svg"))
        .collect();
    assert!(
        urls.is_empty(),
        "the page names outside resources: {urls:?}"
    );
    let svg_text = std::fs::read_to_string(&svg).expect("the SVG");
    assert!(svg_text.contains("grow_site"));
    assert!(std::fs::metadata(&pprof).expect("the pprof").len() > 100);
}
