//! `--config FILE`: Perfetto's `HeapprofdConfig` in protobuf text format,
//! with the same field names, so a config written for Perfetto's heapprofd
//! works here.
//!
//! The file holds either a bare `HeapprofdConfig` (`sampling_interval_bytes:
//! 4096 process_cmdline: "python3"`) or a whole `TraceConfig` as
//! `tools/heap_profile --print-config` writes it (the `android.heapprofd`
//! data source's `heapprofd_config`, and `duration_ms`). Unknown fields are
//! errors, all of them named with their line and column; fields that have
//! no effect here are warnings.
//!
//! [`textproto`] parses the text format into an untyped tree;
//! [`heapprofd_config`] is the schema and the typed message;
//! [`trace_config`] takes a `TraceConfig` apart; [`profile_config`] says
//! what the fields mean for a profile.

pub mod heapprofd_config;
pub mod profile_config;
pub mod textproto;
pub mod trace_config;

use std::path::Path;

use anyhow::{Result, anyhow};

use heapprofd_config::{HeapprofdConfig, Problems};
pub use profile_config::FromConfig;

/// Reads and checks a config file; the profile it describes.
pub fn load(path: &Path) -> Result<FromConfig> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow!("cannot read the config {}: {e}", path.display()))?;
    parse_config(&text).map_err(|problems| {
        anyhow!(
            "the config {} is not valid:\n  {}",
            path.display(),
            problems.join("\n  ")
        )
    })
}

/// Parses a config's text; every problem on failure.
pub fn parse_config(text: &str) -> Result<FromConfig, Vec<String>> {
    let (config, duration_ms, mut warnings) = decode_text(text)?;
    let mut from = profile_config::profile_from(&config)?;
    from.spec.duration_ms = duration_ms;
    warnings.append(&mut from.warnings);
    from.warnings = warnings;
    Ok(from)
}

/// The `HeapprofdConfig` of a text (bare or in a `TraceConfig`), the
/// `TraceConfig`'s duration, and warnings.
pub fn decode_text(text: &str) -> Result<(HeapprofdConfig, Option<u64>, Vec<String>), Vec<String>> {
    let message = textproto::parse(text).map_err(|e| vec![e.to_string()])?;
    let mut problems = Problems::default();
    let (config, duration, warnings) = if trace_config::is_trace_config(&message) {
        let parts = trace_config::parts(&message, &mut problems);
        let Some(h) = parts.heapprofd else {
            let mut all = problems.into_sorted();
            all.push(format!(
                "the TraceConfig has no {} data source",
                trace_config::HEAPPROFD_DATA_SOURCE
            ));
            return Err(all);
        };
        let c = heapprofd_config::decode(h, "data_sources.config.heapprofd_config", &mut problems);
        (c, parts.duration_ms, parts.warnings)
    } else {
        let c = heapprofd_config::decode(&message, "HeapprofdConfig", &mut problems);
        (c, None, Vec::new())
    };
    if problems.is_empty() {
        Ok((config, duration, warnings))
    } else {
        Err(problems.into_sorted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `tools/heap_profile -n python3 -d 10000 -c 1000
    /// --print-config` writes (Perfetto's host script).
    const HEAP_PROFILE_CONFIG: &str = r#"
buffers {
  size_kb: 63488
}

data_sources {
  config {
    name: "android.heapprofd"
    heapprofd_config {

      shmem_size_bytes: 8388608
      sampling_interval_bytes: 4096
      block_client: true
      process_cmdline: "python3"
      continuous_dump_config {
        dump_phase_ms: 0
        dump_interval_ms: 1000
      }
    }
  }
}

data_sources {
  config {
    name: "android.packages_list"
  }
}

duration_ms: 10000
write_into_file: true
flush_timeout_ms: 30000
flush_period_ms: 604800000
"#;

    #[test]
    fn a_heap_profile_trace_config() {
        let got = parse_config(HEAP_PROFILE_CONFIG).expect("valid");
        assert_eq!(got.spec.duration_ms, Some(10_000));
        assert_eq!(got.spec.targets.names, ["python3"]);
        assert!(got.spec.sampling.block_client);
        assert_eq!(got.spec.dumps.continuous.map(|c| c.interval_ms), Some(1000));
        assert_eq!(got.warnings.len(), 1, "{:?}", got.warnings);
        assert!(got.warnings[0].contains("android.packages_list"));
    }

    #[test]
    fn unknown_fields_anywhere() {
        let bad = HEAP_PROFILE_CONFIG
            .replace("block_client: true", "block_clients: true")
            .replace("write_into_file", "write_to_file");
        let e = parse_config(&bad).unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains("`block_clients`") && e[0].contains("did you mean `block_client`"));
        assert!(e[1].contains("`write_to_file` in TraceConfig"), "{e:?}");
        let e = parse_config("duration_ms: 5").unwrap_err();
        assert!(e[0].contains("no android.heapprofd data source"), "{e:?}");
    }

    #[test]
    fn a_bare_heapprofd_config() {
        let got =
            parse_config("sampling_interval_bytes: 1 pid: 7 no_startup: true").expect("valid");
        assert_eq!(got.spec.targets.pids, [7]);
        assert!(!got.spec.targets.startup && got.spec.targets.running);
        assert_eq!(got.spec.duration_ms, None);
    }
}
