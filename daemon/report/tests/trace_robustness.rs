//! Robustness of the trace writer and reader: a disk that fills up in the
//! middle of a dump, files that are not traces, and random corruption of a
//! valid trace fed to the reader and the reports (none may panic).

#[path = "../../model/tests/core_support/mod.rs"]
mod core_support;

use std::io::{self, Write};

use core_support::{CLOCKS, Program, at_ms, big_profile, check_trace, sample_profile, write_trace};
use heapprofd_model::trace::{TraceError, TraceWriter, WriterConfig, read_trace};
use serde_json::Value;

/// Fails every write once `limit` bytes have been accepted, after taking
/// part of the failing write (like a disk filling up).
struct DiskFull<'a> {
    data: &'a mut Vec<u8>,
    limit: usize,
}

impl Write for DiskFull<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = self.limit.saturating_sub(self.data.len());
        if room == 0 {
            return Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"));
        }
        let n = room.min(buf.len());
        self.data.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_write_error_surfaces_and_leaves_a_valid_prefix() {
    let p = Program::new();
    let mut prof = big_profile(&p, 2000);
    let mut data = Vec::new();
    let out = DiskFull {
        data: &mut data,
        limit: 30_000,
    };
    let cfg = WriterConfig {
        packet_size_threshold: 4000,
        ..Default::default()
    };
    let mut w = TraceWriter::with_config(out, CLOCKS, cfg).unwrap();
    let err = w.dump(&mut prof, &p.interner, at_ms(5)).unwrap_err();
    assert!(matches!(&err, TraceError::Io(e) if e.kind() == io::ErrorKind::StorageFull));
    assert!(err.to_string().contains("disk full"));
    let valid = w.valid_len() as usize;
    assert!(matches!(
        w.dump(&mut prof, &p.interner, at_ms(6)),
        Err(TraceError::Failed)
    ));
    assert!(w.finish().is_err());
    assert!(data.len() > valid, "the failing packet was partly written");
    // Packets are self-delimiting: the reader takes the partial one as a
    // warning, and the prefix of complete packets is a clean trace.
    let t = read_trace(data.as_slice()).unwrap();
    assert!(
        t.warnings.iter().any(|w| w.contains("partial packet")),
        "{:?}",
        t.warnings
    );
    data.truncate(valid);
    let t = read_trace(data.as_slice()).unwrap();
    assert!(
        t.warnings.iter().any(|w| w.contains("not finished")),
        "{:?}",
        t.warnings
    );
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&data).unwrap();
    let (_, json) = check_trace(f.path());
    assert_eq!(json["unknown_fields"], Value::Array(vec![]));
    assert!(json["packet_count"].as_u64().unwrap() > 2);
}

#[test]
fn the_reader_rejects_what_is_not_a_trace() {
    for (bytes, what) in [
        (&b""[..], "no trace packets"),
        (b"hello, this is text\n", "not a Perfetto trace"),
        (&[0x1f, 0x8b, 0x08, 0x00][..], "gunzip"),
        (
            &[0x0a, 0x05, 0xff, 0xff, 0xff, 0xff, 0xff][..],
            "undecodable",
        ),
        (&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x7f][..], "too large"),
    ] {
        let err = read_trace(bytes).unwrap_err();
        assert!(
            err.to_string().contains(what),
            "{bytes:?}: {err} (wanted {what:?})"
        );
    }
}

use heapprofd_report::summary::ReportOptions;
use heapprofd_report::text::TextOptions;
use heapprofd_report::{
    Filter, StackOptions, ValueKind, build_report, folded_lines, to_pprof, write_text,
};
use proptest::prelude::*;

fn valid_trace() -> Vec<u8> {
    let p = Program::new();
    let mut prof = sample_profile(&p);
    write_trace(WriterConfig::default(), |w| {
        w.dump(&mut prof, &p.interner, at_ms(10)).map(|_| ())
    })
}

/// Whatever the reader accepts, the reports must digest.
fn digest(bytes: &[u8]) {
    if let Ok(t) = read_trace(bytes) {
        let f = Filter::default();
        let o = ReportOptions {
            top: 5,
            short_lived: 7,
        };
        let r = build_report("x", &t, &f, &o);
        write_text(&r, &mut Vec::new(), &TextOptions::default()).unwrap();
        folded_lines(&t, &f, ValueKind::UnreleasedObjects);
        to_pprof(&t, &f);
        let folded = StackOptions {
            fold_lib: vec!["libc".into()],
            focus: vec!["main".into()],
            ..Default::default()
        }
        .apply(&t, Some(2));
        heapprofd_report::timeline::timelines(&folded, &f, 3);
        let (peak, _) = heapprofd_report::timeline::at_peak(&t);
        build_report("x", &peak, &f, &o);
        heapprofd_report::diff::diff("a", &t, "b", &folded, None, 3);
        heapprofd_report::diff::diff_folded(&t, &peak, None, ValueKind::AllocSpace);
        heapprofd_report::pprof::to_pprof_diff(&t, &folded, None);
        heapprofd_report::html::write_html(&t, &f, std::path::Path::new("x"), &mut Vec::new())
            .unwrap();
        heapprofd_report::timeline_svg::write_timeline_svg(&t, &f, "t", &mut Vec::new()).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        digest(&bytes);
    }

    #[test]
    fn corrupted_traces_never_panic(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = valid_trace();
        for (i, b) in flips {
            let i = i.index(bytes.len());
            bytes[i] = b;
        }
        digest(&bytes);
        let end = cut.index(bytes.len());
        digest(&bytes[..end]);
    }
}
