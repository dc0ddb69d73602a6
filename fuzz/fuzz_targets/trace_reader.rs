//! Fuzz target: the trace reader on arbitrary bytes (a file given to
//! `report` or `convert`), and the reports on whatever it reads. Nothing
//! may panic or hang; a trace that reads must read the same again, and
//! its reports must be built: the summary, pprof, folded stacks, the
//! timeline of each heap, the HTML page, and a diff with itself (which
//! shows no growth).

#![no_main]

use heapprofd_model::trace::read_trace;
use heapprofd_report::summary::ReportOptions;
use heapprofd_report::{Filter, ValueKind, build_report, folded_lines, to_pprof};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(trace) = read_trace(data) else {
        return;
    };
    assert_eq!(
        read_trace(data).ok().as_ref(),
        Some(&trace),
        "reading is deterministic"
    );
    let all = Filter::default();
    let opts = ReportOptions {
        top: 5,
        short_lived: 1023,
    };
    let _ = build_report("fuzz", &trace, &all, &opts);
    for h in &trace.heaps {
        let _ = heapprofd_report::timeline::heap_timeline(&trace, h, 3);
    }
    let mut page = Vec::new();
    heapprofd_report::html::write_html(&trace, &all, std::path::Path::new("f"), &mut page)
        .expect("the page is written to memory");
    let d = heapprofd_report::diff::diff("a", &trace, "b", &trace, None, 5);
    assert!(
        d.grew.is_empty() && d.shrank.is_empty(),
        "a trace grew from itself"
    );
    let _ = to_pprof(&trace, &all);
    for kind in [ValueKind::AllocSpace, ValueKind::UnreleasedObjects] {
        for line in folded_lines(&trace, &all, kind) {
            // `a;b;c value`: the value is a non-zero number.
            let value = line.rsplit(' ').next().unwrap_or("");
            assert!(value.parse::<u64>().is_ok_and(|v| v > 0), "{line}");
        }
    }
});
