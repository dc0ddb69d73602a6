//! Fuzz target: the trace reader on arbitrary bytes (a file given to
//! `report` or `convert`), and the reports on whatever it reads. Nothing
//! may panic or hang; a trace that reads must read the same again, and
//! its reports must be built.

#![no_main]

use heapprofd_model::trace::read_trace;
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
    let _ = build_report("fuzz", &trace, &all, 5);
    let _ = to_pprof(&trace, &all);
    for kind in [ValueKind::AllocSpace, ValueKind::UnreleasedObjects] {
        for line in folded_lines(&trace, &all, kind) {
            // `a;b;c value`: the value is a non-zero number.
            let value = line.rsplit(' ').next().unwrap_or("");
            assert!(value.parse::<u64>().is_ok_and(|v| v > 0), "{line}");
        }
    }
});
