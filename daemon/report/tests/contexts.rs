//! User contexts through the trace: a profile whose samples are charged
//! under context root frames (`Profile::context_callsite`), written, read
//! back (the root frame becomes `CallstackValues::context`), then pprof's
//! labels and `report --by`.

#[path = "../../model/tests/core_support/mod.rs"]
mod core_support;

use std::io::Read;

use core_support::{CLOCKS, Program, at_ms};
use heapprofd_model::profile::context::{ContextLabels, intern_context_frame};
use heapprofd_model::profile::{Alloc, Profile};
use heapprofd_model::trace::{TraceWriter, read_trace};
use heapprofd_report::pprof::Profile as Pprof;
use heapprofd_report::{
    ConvertArgs, Format, ReportArgs, StackOptions, ValueKind, convert, report_to,
};
use prost::Message;
use serde_json::Value;

fn labels(pairs: &[(&str, &str)]) -> ContextLabels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// alloc_a: 300 bytes under endpoint=/a (request 1), 100 under
/// endpoint=/b, 7 outside any context; the same stack each time.
fn write_trace(path: &std::path::Path) {
    let p = Program::new();
    let mut prof = Profile::new(&p.interner);
    prof.set_heap(100, 0, None, 1);
    let stack = prof.intern_callsite(&[p.start, p.main, p.alloc_a]);
    let a = intern_context_frame(
        &p.interner,
        &labels(&[("endpoint", "/a"), ("request", "1")]),
    );
    let b = intern_context_frame(&p.interner, &labels(&[("endpoint", "/b")]));
    let under_a = prof.context_callsite(stack, Some(a));
    let under_b = prof.context_callsite(stack, Some(b));
    for (seq, (callsite, size)) in [(under_a, 300), (under_b, 100), (stack, 7)]
        .into_iter()
        .enumerate()
    {
        let alloc = Alloc {
            heap: 0,
            seq: seq as u64 + 1,
            address: 0x1000 * (seq as u64 + 1),
            sample_size: size,
            size,
            tid: 1,
            timestamp_ns: at_ms(1),
        };
        prof.malloc_at(100, alloc, callsite);
    }
    prof.flush_all();
    let mut w = TraceWriter::new(std::fs::File::create(path).unwrap(), CLOCKS).unwrap();
    w.dump(&mut prof, &p.interner, at_ms(10)).unwrap();
    w.finish().unwrap();
}

#[test]
fn the_reader_takes_the_root_frame_off_into_the_context() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.pftrace");
    write_trace(&trace);
    let data = read_trace(std::fs::File::open(&trace).unwrap()).unwrap();
    let h = &data.heaps[0];
    let mut got: Vec<(Option<&str>, Option<&str>, u64, usize)> = h
        .callstacks
        .iter()
        .map(|c| {
            (
                c.context_value("endpoint"),
                c.context_value("request"),
                c.self_allocated,
                c.frames.len(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (None, None, 7, 3),
            (Some("/a"), Some("1"), 300, 3),
            (Some("/b"), None, 100, 3)
        ],
        "three stacks of the same three frames, told apart by context"
    );
}

#[test]
fn pprof_labels_and_report_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.pftrace");
    write_trace(&trace);
    let out = dir.path().join("p.pb.gz");
    convert(&ConvertArgs {
        trace: trace.clone(),
        diff: None,
        pprof: Some(out.clone()),
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
    })
    .unwrap();
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&out).unwrap())
        .read_to_end(&mut bytes)
        .unwrap();
    let p = Pprof::decode(bytes.as_slice()).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    let mut per_sample: Vec<(i64, Vec<(&str, &str)>)> = p
        .sample
        .iter()
        .map(|x| {
            let l = x
                .label
                .iter()
                .filter(|l| !matches!(s(l.key), "pid" | "heap"))
                .map(|l| (s(l.key), s(l.str)))
                .collect();
            (x.value[1], l)
        })
        .collect();
    per_sample.sort();
    assert_eq!(
        per_sample,
        [
            (7, vec![]),
            (100, vec![("endpoint", "/b")]),
            (300, vec![("endpoint", "/a"), ("request", "1")]),
        ]
    );
    let args = ReportArgs {
        trace,
        diff: None,
        timeline: false,
        peak: false,
        cpu: false,
        top: None,
        depth: 6,
        short_lived: 1023,
        format: Format::Json,
        pid: None,
        heap: None,
        by: Some("endpoint".into()),
        stacks: StackOptions::default(),
    };
    let mut text = Vec::new();
    report_to(&args, &mut text).unwrap();
    let v: Value = serde_json::from_slice(&text).unwrap();
    let rows: Vec<(Option<&str>, u64)> = v["heaps"][0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["value"].as_str(), r["allocated"].as_u64().unwrap()))
        .collect();
    assert_eq!(rows, [(Some("/a"), 300), (Some("/b"), 100), (None, 7)]);
}
