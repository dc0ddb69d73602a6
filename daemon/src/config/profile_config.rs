//! What a `HeapprofdConfig` means for a heapprofd-rs profile: the fields
//! mapped onto a [`ProfileSpec`], with heapprofd's own checks (a zero
//! interval, `no_startup` with `no_running`, globs without `no_startup`) and
//! a warning for every field that has no effect here (Android-only fields,
//! options of heapprofd's client that ours does not have).

use super::heapprofd_config::HeapprofdConfig;
use crate::service::heaps::HeapSelection;
use crate::service::spec::{
    Continuous, DEFAULT_INTERVAL, DEFAULT_SHMEM, DEFAULT_SHMEM_ALL, Dumps, Guardrails, ProfileSpec,
    Sampling, Targets, is_glob,
};

/// A profile made from a config, and what the config asked for that has no
/// effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FromConfig {
    /// The profile.
    pub spec: ProfileSpec,
    /// One line per ignored field.
    pub warnings: Vec<String>,
}

/// Maps a config onto a profile; the error lists every problem.
pub fn profile_from(c: &HeapprofdConfig) -> Result<FromConfig, Vec<String>> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let interval = match (
        c.sampling_interval_bytes,
        c.heap_sampling_intervals.as_slice(),
    ) {
        (Some(0), _) => {
            errors.push("sampling_interval_bytes must not be 0 (heapprofd refuses it)".into());
            0
        }
        (Some(n), _) => n,
        (None, []) => {
            errors.push(
                "sampling_interval_bytes is missing (heapprofd refuses a config without it; \
                 4096 is the usual value)"
                    .into(),
            );
            0
        }
        (None, _) => 0,
    };
    // The heaps and their own intervals; the default for the others.
    let (interval, heaps) = heap_selection(c, interval, &mut errors);
    if c.no_startup && c.no_running {
        errors.push("no_startup and no_running exclude each other".into());
    }
    let mut names = Vec::new();
    for raw in &c.process_cmdline {
        let name = normalize_pattern(raw);
        if name.is_empty() {
            errors.push(format!("process_cmdline `{raw}` names no process"));
            continue;
        }
        if is_glob(&name) && !c.no_startup {
            errors.push(format!(
                "process_cmdline `{raw}` is a glob, which needs no_startup: true (as in Perfetto)"
            ));
        }
        names.push(name);
    }
    let mut pids = Vec::new();
    for &p in &c.pid {
        match u32::try_from(p) {
            Ok(p) if p > 0 => pids.push(p),
            _ => errors.push(format!("pid {p} is not a process id")),
        }
    }
    if names.is_empty() && pids.is_empty() && !c.all {
        errors.push("the config targets no process: set process_cmdline, pid or all".into());
    }
    let continuous = match c.continuous_dump_config {
        Some(d) if d.dump_interval_ms > 0 => Some(Continuous {
            phase_ms: d.dump_phase_ms,
            interval_ms: d.dump_interval_ms,
        }),
        _ => None,
    };
    if continuous.is_some() && c.dump_at_max {
        errors.push("dump_at_max and continuous_dump_config exclude each other".into());
    }
    let shmem_size = match c.shmem_size_bytes {
        Some(n) => match heapprofd_shmem::check_data_size(n) {
            Ok(_) => n,
            Err(e) => {
                errors.push(format!("shmem_size_bytes: {e}"));
                DEFAULT_SHMEM
            }
        },
        None if c.all => DEFAULT_SHMEM_ALL,
        None => DEFAULT_SHMEM,
    };
    ignored(c, &mut warnings);
    if !errors.is_empty() {
        return Err(errors);
    }
    let spec = ProfileSpec {
        targets: Targets {
            pids,
            names,
            all: c.all,
            startup: !c.no_startup,
            running: !c.no_running,
            command: None,
            min_anonymous_memory_kb: c.min_anonymous_memory_kb.filter(|&k| k > 0),
        },
        sampling: Sampling {
            interval,
            shmem_size,
            block_client: c.block_client,
            block_timeout_us: u64::from(c.block_client_timeout_us.unwrap_or(0)),
            seed: 0,
            heaps,
            contexts: Vec::new(),
            cpu_period_ns: 0,
            no_heap: false,
            perf_event: 0,
            perf_period: 0,
            no_stack_reuse: false,
            // heapprofd's interval is fixed unless the config asks.
            fixed_interval: c.adaptive_sampling_shmem_threshold.unwrap_or(0) == 0,
        },
        dumps: Dumps {
            continuous,
            dump_at_max: c.dump_at_max,
        },
        guardrails: Guardrails {
            max_heapprofd_memory_kb: c.max_heapprofd_memory_kb.filter(|&k| k > 0),
            max_heapprofd_cpu_secs: c.max_heapprofd_cpu_secs.filter(|&s| s > 0),
        },
        duration_ms: None,
        symbolize: true,
    };
    Ok(FromConfig { spec, warnings })
}

/// The heaps of a config (`heaps` with `heap_sampling_intervals` in
/// parallel, `all_heaps`, `exclude_heaps`) and the default interval: the
/// config's, or (when only listed heaps with their own intervals are
/// sampled and it is missing) the usual 4096, which then serves no heap.
fn heap_selection(
    c: &HeapprofdConfig,
    default: u64,
    errors: &mut Vec<String>,
) -> (u64, HeapSelection) {
    let mut sel = HeapSelection {
        names: c.heaps.clone(),
        all: c.all_heaps,
        intervals: Vec::new(),
        exclude: c.exclude_heaps.clone(),
    };
    if !c.heap_sampling_intervals.is_empty() {
        if c.heap_sampling_intervals.len() != c.heaps.len() {
            errors.push(format!(
                "heap_sampling_intervals has {} entries for {} heaps",
                c.heap_sampling_intervals.len(),
                c.heaps.len()
            ));
        } else if c.heap_sampling_intervals.contains(&0) {
            errors.push("heap_sampling_intervals must all be more than 0".into());
        } else {
            sel.intervals = c
                .heaps
                .iter()
                .cloned()
                .zip(c.heap_sampling_intervals.iter().copied())
                .collect();
        }
    }
    let default = match default {
        0 if c.all_heaps || c.heaps.is_empty() => {
            if !c.heap_sampling_intervals.is_empty() {
                errors.push(
                    "sampling_interval_bytes is missing (the heaps not listed would get no interval)"
                        .into(),
                );
            }
            DEFAULT_INTERVAL
        }
        0 => DEFAULT_INTERVAL,
        n => n,
    };
    if let Err(e) = sel.check() {
        errors.push(e);
    }
    (default, sel)
}

/// A `process_cmdline` entry as heapprofd normalizes it: cut at the first
/// `@`, then the part after the last `/` (a glob keeps a leading `/`, which
/// makes it match the whole first argument).
pub fn normalize_pattern(raw: &str) -> String {
    if raw.starts_with('/') && is_glob(raw) {
        return raw.to_string();
    }
    let name = heapprofd_proto::triggers::process_name(raw.as_bytes());
    String::from_utf8_lossy(name).into_owned()
}

/// A warning for every field set that has no effect here.
fn ignored(c: &HeapprofdConfig, warnings: &mut Vec<String>) {
    let mut warn = |field: &str, why: &str| {
        warnings.push(format!("{field} is ignored: {why}"));
    };
    if !c.target_installed_by.is_empty() {
        warn("target_installed_by", "Android packages only");
    }
    if !c.skip_symbol_prefix.is_empty() {
        warn("skip_symbol_prefix", "every frame is symbolized");
    }
    if c.stream_allocations {
        warn(
            "stream_allocations",
            "heapprofd's test mode, not implemented",
        );
    }
    if c.adaptive_sampling_shmem_threshold.is_some_and(|n| n > 0)
        || c.adaptive_sampling_max_sampling_interval_bytes
            .is_some_and(|n| n > 0)
    {
        warn(
            "adaptive sampling's threshold and cap",
            "a client doubles its interval while its ring is nearly full, up to 1024 times \
             (on when adaptive_sampling_shmem_threshold is set)",
        );
    }
    if c.disable_fork_teardown {
        warn(
            "disable_fork_teardown",
            "a forked child always stops writing to its parent's ring",
        );
    }
    if c.disable_vfork_detection {
        warn(
            "disable_vfork_detection",
            "vfork children are always recorded as part of their parent",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> HeapprofdConfig {
        HeapprofdConfig {
            sampling_interval_bytes: Some(4096),
            process_cmdline: vec!["/usr/bin/python3@3.11".into()],
            ..HeapprofdConfig::default()
        }
    }

    #[test]
    fn maps_fields() {
        let mut c = config();
        c.pid = vec![42];
        c.shmem_size_bytes = Some(1 << 22);
        c.block_client = true;
        c.block_client_timeout_us = Some(500);
        c.max_heapprofd_memory_kb = Some(1000);
        c.max_heapprofd_cpu_secs = Some(9);
        c.continuous_dump_config = Some(super::super::heapprofd_config::ContinuousDumpConfig {
            dump_phase_ms: 10,
            dump_interval_ms: 250,
        });
        let got = profile_from(&c).expect("valid");
        assert!(got.warnings.is_empty(), "{:?}", got.warnings);
        let s = got.spec;
        assert_eq!(s.targets.names, ["python3"]);
        assert_eq!(s.targets.pids, [42]);
        assert!(s.targets.startup && s.targets.running);
        assert_eq!(s.sampling.shmem_size, 1 << 22);
        assert!(s.sampling.block_client);
        assert_eq!(s.sampling.block_timeout_us, 500);
        assert_eq!(s.guardrails.max_heapprofd_memory_kb, Some(1000));
        assert_eq!(s.guardrails.max_heapprofd_cpu_secs, Some(9));
        assert_eq!(
            s.dumps.continuous,
            Some(Continuous {
                phase_ms: 10,
                interval_ms: 250
            })
        );
        assert_eq!(s.check(), Ok(()));
    }

    #[test]
    fn heaps() {
        let mut c = config();
        c.heaps = vec!["libc.malloc".into(), "custom".into()];
        c.heap_sampling_intervals = vec![512, 4096];
        let got = profile_from(&c).expect("valid");
        assert_eq!(got.spec.sampling.interval, 4096);
        assert!(got.warnings.is_empty(), "{:?}", got.warnings);
        let mut cc = heapprofd_proto::wire::ClientConfig::new(4096, 1 << 20);
        got.spec.sampling.heaps.apply(4096, &mut cc).expect("apply");
        assert_eq!(cc.interval_for("libc.malloc"), 512);
        assert_eq!(cc.interval_for("custom"), 4096);
        assert_eq!(cc.interval_for("other"), 0);
        c.heaps = vec!["custom".into()];
        c.heap_sampling_intervals = vec![512, 1];
        let e = profile_from(&c).unwrap_err().join("\n");
        assert!(e.contains("2 entries for 1 heaps"), "{e}");
        c.heap_sampling_intervals.clear();
        c.all_heaps = true;
        c.exclude_heaps = vec!["libc.malloc".into()];
        let got = profile_from(&c).expect("valid");
        let mut cc = heapprofd_proto::wire::ClientConfig::new(4096, 1 << 20);
        got.spec.sampling.heaps.apply(4096, &mut cc).expect("apply");
        assert_eq!(cc.interval_for("libc.malloc"), 0);
        assert_eq!(cc.interval_for("any"), 4096);
    }

    #[test]
    fn refusals() {
        for (change, want) in [
            (
                (|c: &mut HeapprofdConfig| c.sampling_interval_bytes = Some(0)) as fn(&mut _),
                "must not be 0",
            ),
            (|c| c.sampling_interval_bytes = None, "missing"),
            (
                |c| {
                    c.no_startup = true;
                    c.no_running = true;
                },
                "exclude each other",
            ),
            (
                |c| c.process_cmdline = vec!["py*".into()],
                "needs no_startup",
            ),
            (|c| c.process_cmdline.clear(), "targets no process"),
            (|c| c.shmem_size_bytes = Some(5000), "shmem_size_bytes"),
            (|c| c.pid = vec![1 << 40], "not a process id"),
            (
                |c| c.process_cmdline = vec!["/usr/bin/".into()],
                "names no process",
            ),
        ] {
            let mut c = config();
            change(&mut c);
            let e = profile_from(&c).unwrap_err().join("\n");
            assert!(e.contains(want), "{want}: {e}");
        }
        let mut c = config();
        c.process_cmdline = vec!["/usr/bin/py*".into(), "py?hon".into()];
        c.no_startup = true;
        let got = profile_from(&c).expect("globs with no_startup");
        assert_eq!(got.spec.targets.names, ["/usr/bin/py*", "py?hon"]);
        let mut c = config();
        c.all = true;
        c.process_cmdline.clear();
        assert_eq!(
            profile_from(&c).expect("all").spec.sampling.shmem_size,
            DEFAULT_SHMEM_ALL
        );
    }
}
