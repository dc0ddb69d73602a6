//! The profile as a Perfetto `TraceConfig` text around an
//! `android.heapprofd` data source's `HeapprofdConfig`: what
//! `tools/heap_profile` writes for the device's `perfetto`, and what the
//! pushed `heapprofd-rs record --config` reads (one text for both ways).

use std::fmt::Write;

use super::args::AndroidArgs;

/// The config text for these options (`tools/heap_profile`'s layout:
/// buffers, the data source, then the session's fields).
pub fn trace_config(args: &AndroidArgs) -> String {
    let mut hp = String::new();
    let mut line = |s: String| {
        let _ = writeln!(hp, "      {s}");
    };
    line(format!("sampling_interval_bytes: {}", args.interval));
    for n in &args.name {
        line(format!("process_cmdline: {}", quoted(n)));
    }
    for p in &args.pid {
        line(format!("pid: {p}"));
    }
    if args.all {
        line("all: true".into());
    }
    for h in &args.heaps {
        line(format!("heaps: {}", quoted(h)));
    }
    if args.all_heaps {
        line("all_heaps: true".into());
    }
    if let Some(c) = args.continuous_dump {
        line(format!(
            "continuous_dump_config {{ dump_phase_ms: 0 dump_interval_ms: {} }}",
            c.as_millis()
        ));
    }
    if args.dump_at_max {
        line("dump_at_max: true".into());
    }
    line("block_client: true".into());
    let mut out = format!(
        "buffers {{\n  size_kb: 63488\n}}\n\ndata_sources {{\n  config {{\n    \
         name: \"android.heapprofd\"\n    heapprofd_config {{\n{hp}    }}\n  }}\n}}\n\n"
    );
    if let Some(d) = args.duration.filter(|d| !d.is_zero()) {
        let _ = writeln!(out, "duration_ms: {}", d.as_millis().max(1));
    }
    out.push_str("write_into_file: true\nflush_timeout_ms: 30000\nflush_period_ms: 604800000\n");
    out
}

/// A text-format string literal.
fn quoted(s: &str) -> String {
    let mut q = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: AndroidArgs,
    }

    fn args(line: &[&str]) -> AndroidArgs {
        let mut v = vec!["t"];
        v.extend(line);
        T::parse_from(v).a
    }

    /// The text is what this tool's own `--config` reader (which follows
    /// the official schema field for field) takes as the same profile.
    #[test]
    fn the_config_reads_back_as_the_profile() {
        let a = args(&[
            "-n",
            "surfaceflinger,com.x\"y",
            "-p",
            "7,9",
            "-i",
            "1",
            "-d",
            "3s",
            "-c",
            "250ms",
            "--heaps",
            "libc.malloc,pool",
        ]);
        let text = trace_config(&a);
        assert!(text.contains("name: \"android.heapprofd\""), "{text}");
        let got = crate::config::parse_config(&text).expect("valid");
        let s = &got.spec;
        assert_eq!(s.targets.names, ["surfaceflinger", "com.x\"y"]);
        assert_eq!(s.targets.pids, [7, 9]);
        assert_eq!(s.sampling.interval, 1);
        assert_eq!(s.duration_ms, Some(3000));
        assert_eq!(s.dumps.continuous.map(|c| c.interval_ms), Some(250));
        assert!(s.sampling.block_client);
        assert_eq!(s.sampling.heaps.names, ["libc.malloc", "pool"]);
        assert!(got.warnings.is_empty(), "{:?}", got.warnings);
    }

    #[test]
    fn all_dump_at_max_and_no_duration() {
        let text = trace_config(&args(&["--all", "--dump-at-max", "--all-heaps", "-d", "0"]));
        assert!(!text.contains("duration_ms"), "{text}");
        let got = crate::config::parse_config(&text).expect("valid");
        assert!(got.spec.targets.all && got.spec.dumps.dump_at_max);
        assert!(got.spec.sampling.heaps.all);
        assert_eq!(got.spec.duration_ms, None);
        assert_eq!(got.spec.sampling.interval, 4096);
    }
}
