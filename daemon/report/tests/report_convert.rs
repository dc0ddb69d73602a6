//! `report` and `convert` on traces written from synthetic profiles with
//! known values: assertions on content (not whole-file snapshots).

#[path = "../../model/tests/core_support/mod.rs"]
mod core_support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use core_support::{CLOCKS, Program, at_ms, sample_profile};
use heapprofd_model::profile::{Alloc, Profile};
use heapprofd_model::trace::{TraceWriter, WriterConfig};
use heapprofd_report::pprof::{Profile as Pprof, SAMPLE_TYPES};
use heapprofd_report::{
    ConvertArgs, Format, ReportArgs, StackOptions, UsageError, ValueKind, convert, report_to,
};
use prost::Message;
use serde_json::Value;

fn write(dir: &Path, name: &str, prof: &mut Profile, p: &Program, cfg: WriterConfig) -> PathBuf {
    let path = dir.join(name);
    let f = std::fs::File::create(&path).unwrap();
    let mut w = TraceWriter::with_config(f, CLOCKS, cfg).unwrap();
    w.dump(prof, &p.interner, at_ms(10)).unwrap();
    w.finish().unwrap();
    path
}

fn sample_trace(dir: &Path) -> PathBuf {
    let p = Program::new();
    let mut prof = sample_profile(&p);
    write(
        dir,
        "sample.pftrace",
        &mut prof,
        &p,
        WriterConfig::default(),
    )
}

fn report(args: ReportArgs) -> anyhow::Result<String> {
    let (text, r) = report_and_text(args);
    r.map(|()| text)
}

/// The text written, and the result (a truncated trace writes, then fails).
fn report_and_text(args: ReportArgs) -> (String, anyhow::Result<()>) {
    let mut out = Vec::new();
    let r = report_to(&args, &mut out);
    (String::from_utf8(out).unwrap(), r)
}

fn report_args(trace: &Path) -> ReportArgs {
    ReportArgs {
        trace: trace.to_owned(),
        diff: None,
        timeline: false,
        peak: false,
        cpu: false,
        top: None,
        depth: 6,
        short_lived: 1023,
        format: Format::Text,
        pid: None,
        heap: None,
        by: None,
        stacks: StackOptions::default(),
    }
}

fn convert_args(trace: &Path) -> ConvertArgs {
    ConvertArgs {
        trace: trace.to_owned(),
        diff: None,
        pprof: None,
        cpu: false,
        collapsed: None,
        svg: None,
        html: None,
        timeline_svg: None,
        timeline_png: None,
        value: ValueKind::UnreleasedSpace,
        peak: false,
        depth: None,
        pid: None,
        heap: None,
        stacks: StackOptions::default(),
    }
}

#[test]
fn text_report_has_totals_and_top_sites() {
    let dir = tempfile::tempdir().unwrap();
    let trace = sample_trace(dir.path());
    let text = report(report_args(&trace)).unwrap();
    assert!(
        text.contains("PROCESS 100 `app --flag`, HEAP libc.malloc"),
        "{text}"
    );
    assert!(text.contains("PROCESS 100 `app --flag`, HEAP custom"));
    assert!(text.contains("PROCESS 200 `other`, HEAP libc.malloc"));
    assert!(text.contains("sampling: every allocation; 1 dump(s)"));
    // pid 100 libc.malloc: 2307 B allocated in 6, 2100 B freed in 3.
    assert!(
        text.contains("allocated: 2.25 KiB in 6 allocations (3 stacks)"),
        "{text}"
    );
    assert!(text.contains("freed:     2.05 KiB in 3 frees"));
    assert!(text.contains("unreleased: 207 B in 3 allocations"));
    assert!(text.contains("WARNING: ring buffer overran"));
    assert!(text.contains("unwinding: 2 samples, 1 errors (50.0%), mean 126 us"));
    // The first self site of pid 100 is alloc_b (2000 B), with its callers.
    let main_heap = text
        .split("PROCESS")
        .find(|s| s.starts_with(" 100 `app --flag`, HEAP libc.malloc"))
        .unwrap();
    let self_table = main_heap
        .split("TOP ALLOCATION SITES")
        .nth(1)
        .unwrap()
        .split("TOP FUNCTIONS")
        .next()
        .unwrap();
    let first = self_table.lines().nth(1).unwrap();
    assert!(
        first.contains("1.95 KiB") && first.contains("alloc_b (app.c:40)"),
        "{first}"
    );
    assert!(self_table.contains("from worker <- main <- __libc_start_main"));
    assert!(self_table.contains("in /usr/bin/app"));
    let unreleased = main_heap.split("TOP UNRELEASED").nth(1).unwrap();
    let first = unreleased.lines().nth(1).unwrap();
    assert!(
        first.contains("200 B") && first.contains("alloc_a"),
        "{first}"
    );
    assert!(unreleased.contains("ERROR MEMORY_INVALID"));
}

#[test]
fn json_report_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let trace = sample_trace(dir.path());
    let mut args = report_args(&trace);
    args.format = Format::Json;
    args.pid = Some(100);
    args.top = Some(2);
    let json: Value = serde_json::from_str(&report(args.clone()).unwrap()).unwrap();
    let heaps = json["heaps"].as_array().unwrap();
    assert_eq!(heaps.len(), 2);
    let h = &heaps[0];
    assert_eq!(h["pid"], 100);
    assert_eq!(h["heap"], "custom");
    let h = &heaps[1];
    assert_eq!(h["totals"]["allocated"], 2307);
    assert_eq!(h["totals"]["unreleased_count"], 3);
    assert_eq!(h["top_self"].as_array().unwrap().len(), 2);
    assert_eq!(h["top_self"][0]["function"], "alloc_b");
    assert_eq!(h["top_self"][0]["allocated"], 2000);
    assert_eq!(h["top_self"][0]["location"], "app.c:40");
    // Inclusive: entry frames and functions on every stack say nothing
    // (they used to fill the table: __libc_start_main 2307, main 2307...).
    assert_eq!(
        h["inclusive_omitted"],
        serde_json::json!(["__libc_start_main", "main"]),
        "{h}"
    );
    assert_eq!(h["top_inclusive"][0]["allocated"], 2000);
    assert_eq!(h["top_inclusive"][0]["function"], "alloc_b");
    assert_eq!(h["top_inclusive"][1]["function"], "worker");
    assert_eq!(h["top_unreleased"][0]["function"], "alloc_a");
    assert_eq!(
        h["top_unreleased"][0]["heaviest_stack"],
        serde_json::json!(["__libc_start_main", "main", "alloc_a"])
    );
    args.heap = Some("nope".into());
    let err = report(args).unwrap_err().to_string();
    assert!(err.contains("no heap profile matching"), "{err}");
    assert!(err.contains("pid 100 heap libc.malloc"), "{err}");
}

#[test]
fn bad_inputs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pftrace");
    let err = report(report_args(&missing)).unwrap_err().to_string();
    assert!(
        err.contains("missing.pftrace") && err.contains("check the path"),
        "{err}"
    );
    let junk = dir.path().join("junk.pftrace");
    std::fs::write(&junk, "definitely not a trace\n").unwrap();
    let err = report(report_args(&junk)).unwrap_err().to_string();
    assert!(
        err.contains("junk.pftrace") && err.contains("not a Perfetto trace"),
        "{err}"
    );
    let err = convert(&ConvertArgs {
        collapsed: Some(dir.path().join("x.txt")),
        ..convert_args(&junk)
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("junk.pftrace"), "{err}");
    // Truncated trace: what was read is reported, then it fails saying
    // where the trace ends (it used to exit 0, or say "nothing was
    // sampled" when the cut came early).
    let trace = sample_trace(dir.path());
    let bytes = std::fs::read(&trace).unwrap();
    let cut = dir.path().join("cut.pftrace");
    std::fs::write(&cut, &bytes[..bytes.len() - 5]).unwrap();
    let (text, r) = report_and_text(report_args(&cut));
    let err = format!("{:#}", r.unwrap_err());
    assert!(
        err.contains("cut.pftrace is truncated")
            && err.contains(&format!("of {}", bytes.len() - 5)),
        "{err}"
    );
    assert!(
        text.contains("PROCESS 100") && text.contains("TRUNCATED"),
        "{text}"
    );
    std::fs::write(&cut, &bytes[..200.min(bytes.len())]).unwrap();
    let (text, r) = report_and_text(report_args(&cut));
    assert!(r.is_err());
    assert!(
        text.contains("no heap dump could be read before the trace ends"),
        "{text}"
    );
    // Unwritable output: a usage error (exit 2), as in `record`.
    let err = convert(&ConvertArgs {
        svg: Some(dir.path().join("no/such/dir/x.svg")),
        ..convert_args(&trace)
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("cannot create"), "{err:#}");
    assert!(err.downcast_ref::<UsageError>().is_some(), "{err:#}");
    // Two outputs on stdout.
    let err = convert(&ConvertArgs {
        svg: Some("-".into()),
        collapsed: Some("-".into()),
        ..convert_args(&trace)
    })
    .unwrap_err();
    assert!(err.downcast_ref::<UsageError>().is_some(), "{err:#}");
}

fn gunzip(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut out)
        .unwrap();
    out
}

#[test]
fn pprof_has_the_four_sample_types_and_the_values() {
    let dir = tempfile::tempdir().unwrap();
    let trace = sample_trace(dir.path());
    let out = dir.path().join("heap.pb.gz");
    let written = convert(&ConvertArgs {
        pprof: Some(out.clone()),
        cpu: false,
        ..convert_args(&trace)
    })
    .unwrap();
    assert_eq!(written.len(), 1);
    let p = Pprof::decode(gunzip(&out).as_slice()).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(s(0), "");
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(types, SAMPLE_TYPES);
    assert_eq!(s(p.default_sample_type), "inuse_space");
    assert_eq!(p.period, 1);
    // Totals over every sample: alloc_objects, alloc_space, inuse_*.
    let mut sums = [0i64; 4];
    for x in &p.sample {
        for (k, v) in x.value.iter().enumerate() {
            sums[k] += v;
        }
    }
    assert_eq!(sums, [6 + 1 + 5, 2307 + 64 + 50, 3 + 1 + 1, 207 + 64 + 10]);
    // Leaf first; locations resolve to functions; labels name pid and heap.
    let func_of = |loc: u64| {
        let l = p.location.iter().find(|l| l.id == loc).unwrap();
        let f = p
            .function
            .iter()
            .find(|f| f.id == l.line[0].function_id)
            .unwrap();
        s(f.name).to_owned()
    };
    let b = p.sample.iter().find(|x| x.value[1] == 2000).unwrap();
    let names: Vec<String> = b.location_id.iter().map(|&l| func_of(l)).collect();
    assert_eq!(names, ["alloc_b", "worker", "main", "__libc_start_main"]);
    let labels: Vec<(&str, i64, &str)> = b
        .label
        .iter()
        .map(|l| (s(l.key), l.num, s(l.str)))
        .collect();
    assert_eq!(labels, [("pid", 100, ""), ("heap", 0, "libc.malloc")]);
    let loc = p
        .location
        .iter()
        .find(|l| l.id == b.location_id[0])
        .unwrap();
    assert_eq!(loc.address, 0x1400);
    assert_eq!(loc.line[0].line, 40);
    let m = p.mapping.iter().find(|m| m.id == loc.mapping_id).unwrap();
    assert_eq!(s(m.filename), "/usr/bin/app");
    assert_eq!(s(m.build_id), "deadbeef");
    // Ids are unique and non-zero.
    for (i, l) in p.location.iter().enumerate() {
        assert_eq!(l.id, i as u64 + 1);
    }
}

#[test]
fn folded_stacks_and_flame_graph() {
    let dir = tempfile::tempdir().unwrap();
    let trace = sample_trace(dir.path());
    let folded = dir.path().join("out.txt");
    let svg = dir.path().join("out.svg");
    convert(&ConvertArgs {
        collapsed: Some(folded.clone()),
        svg: Some(svg.clone()),
        value: ValueKind::AllocSpace,
        ..convert_args(&trace)
    })
    .unwrap();
    let text = std::fs::read_to_string(&folded).unwrap();
    let mut total = 0;
    for line in text.lines() {
        let (stack, v) = line.rsplit_once(' ').expect("stack and value");
        let v: u64 = v.parse().expect("numeric value");
        assert!(v > 0);
        total += v;
        let frames: Vec<&str> = stack.split(';').collect();
        assert!(frames[0].starts_with("pid "), "{line}");
        assert!(frames[1].starts_with("heap "), "{line}");
    }
    assert_eq!(total, 2307 + 64 + 50);
    assert!(
        text.contains(
            "pid 100 (app);heap libc.malloc;__libc_start_main;main;worker;alloc_b 2000\n"
        )
    );
    // One process and heap: no prefix frames.
    let only = dir.path().join("only.txt");
    convert(&ConvertArgs {
        collapsed: Some(only.clone()),
        pid: Some(200),
        ..convert_args(&trace)
    })
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(&only).unwrap(),
        "__libc_start_main;main;worker;alloc_b 10\n"
    );
    // The SVG is well-formed XML with the frames in it.
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.contains("<svg") && svg_text.contains("alloc_b"));
    let status = Command::new("python3")
        .args([
            "-c",
            "import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])",
        ])
        .arg(&svg)
        .status()
        .expect("python3");
    assert!(status.success(), "SVG does not parse as XML");
}

#[test]
fn dump_at_max_traces_report_the_peak() {
    let dir = tempfile::tempdir().unwrap();
    let p = Program::new();
    let mut prof = Profile::new(&p.interner);
    prof.set_heap(5, 0, None, 1);
    prof.malloc(
        5,
        Alloc {
            heap: 0,
            seq: 1,
            address: 0x10,
            sample_size: 100,
            size: 100,
            tid: 1,
            timestamp_ns: at_ms(1),
        },
        &p.stack_a(),
    );
    prof.malloc(
        5,
        Alloc {
            heap: 0,
            seq: 2,
            address: 0x20,
            sample_size: 200,
            size: 200,
            tid: 1,
            timestamp_ns: at_ms(2),
        },
        &p.stack_b(),
    );
    prof.free(5, 0, 3, 0x10);
    prof.free(5, 0, 4, 0x20);
    let cfg = WriterConfig {
        dump_at_max: true,
        ..Default::default()
    };
    let trace = write(dir.path(), "max.pftrace", &mut prof, &p, cfg);
    let text = report(report_args(&trace)).unwrap();
    assert!(text.contains("live heap at its peak"), "{text}");
    assert!(
        text.contains("unreleased: 300 B in 2 allocations"),
        "{text}"
    );
    let folded = dir.path().join("max.txt");
    convert(&ConvertArgs {
        collapsed: Some(folded.clone()),
        ..convert_args(&trace)
    })
    .unwrap();
    let text = std::fs::read_to_string(&folded).unwrap();
    assert!(
        text.contains("alloc_b 200\n") && text.contains("alloc_a 100\n"),
        "{text}"
    );
}
