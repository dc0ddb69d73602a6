//! What a profile is: which processes it wants, how they are sampled, when
//! it dumps, its guardrails. The command line builds a [`ProfileSpec`] from
//! its options (or from a Perfetto `HeapprofdConfig`, see `crate::config`)
//! and sends it to the service, which checks it again ([`ProfileSpec::check`]):
//! nothing a peer sends is trusted.

use serde::{Deserialize, Serialize};

use heapprofd_proto::triggers::valid_name;

use super::heaps::HeapSelection;

/// The default mean sampling interval (Perfetto's).
pub const DEFAULT_INTERVAL: u64 = 4096;
/// The default ring size of one process sampling heaps (at the default
/// interval and finer).
pub const DEFAULT_SHMEM: u64 = 2 << 20;
/// The default ring size of one process whose ring CPU-time or
/// perf-event samples share: those are written from signal handlers,
/// which cannot wait for room and drop instead.
pub const DEFAULT_SHMEM_SHARED: u64 = 8 << 20;
/// The default ring size of a process under `--all` (many processes at
/// once: 1 MiB each).
pub const DEFAULT_SHMEM_ALL: u64 = 1 << 20;
/// The smallest ring [`default_shmem_for`] picks.
pub const MIN_DEFAULT_SHMEM: u64 = 1 << 20;

/// The ring size of one process when none is asked for:
/// [`DEFAULT_SHMEM`] at the default interval and finer, and
/// [`DEFAULT_SHMEM_SHARED`] whenever CPU-time or perf-event samples share
/// the ring (their rate does not follow the interval); at coarser
/// sampling a program writes fewer records per byte it allocates, so the
/// ring shrinks with the finest interval it samples at, down to
/// [`MIN_DEFAULT_SHMEM`] (from 8 KiB).
///
/// A ring's pages are all allocated before its program writes (so a write
/// can never fault for want of memory), mapped by the client, and freed
/// at the end: `record -- /bin/true` took 11.6 ms more than `/bin/true`
/// with an 8 MiB ring, 7.7 ms with 4 MiB, 5.9 ms with 2 MiB and 5.2 ms with
/// 1 MiB (medians of 25). What a bigger ring buys is room for a burst
/// while the daemon is busy or descheduled; at the default interval
/// sqlite3, cc1, python3 and node were never blocked with 2 MiB (cc1 at
/// most 0.6 ms in 1.6 s), node was with 1 MiB (7-20 ms), and the programs
/// that are blocked (generated ones sampling 2-9 million times a second)
/// were blocked as long with 8 MiB as with 2 (docs/PERFORMANCE.md, tenth
/// pass).
pub fn default_shmem_for(finest_interval: u64, other_samples: bool) -> u64 {
    if other_samples {
        return DEFAULT_SHMEM_SHARED;
    }
    let coarser = (finest_interval / DEFAULT_INTERVAL).max(1);
    (DEFAULT_SHMEM >> coarser.ilog2().min(63)).max(MIN_DEFAULT_SHMEM)
}

/// Most names and pids one profile may list.
pub const MAX_TARGETS: usize = 1024;

/// Which processes a profile wants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Targets {
    /// Processes by id.
    pub pids: Vec<u32>,
    /// Processes by name (bionic's normalized name; `*` `?` `[...]` globs,
    /// a leading `/` matching the whole first argument; globs only for
    /// running processes, as Perfetto requires).
    pub names: Vec<String>,
    /// Every process that has the client.
    pub all: bool,
    /// Processes that start while the profile runs (by name or all).
    pub startup: bool,
    /// Processes already running when the profile starts.
    pub running: bool,
    /// The processes of one command (`record -- CMD` through the service):
    /// those whose environment holds [`PROFILE_ENV`]`=<this token>`, which
    /// `record` gives CMD and every process CMD starts inherits.
    pub command: Option<String>,
    /// Skip running processes whose anonymous memory plus swap is below
    /// this (Perfetto's `min_anonymous_memory_kb`).
    pub min_anonymous_memory_kb: Option<u32>,
}

/// How a wanted process is sampled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sampling {
    /// Mean bytes between samples of `libc.malloc`.
    pub interval: u64,
    /// Ring-buffer size per process.
    pub shmem_size: u64,
    /// Writers wait for room instead of dropping samples.
    pub block_client: bool,
    /// How long they wait (0: forever).
    pub block_timeout_us: u64,
    /// Sampler seed (0: random).
    pub seed: u64,
    /// Which heaps, at which intervals.
    #[serde(default)]
    pub heaps: HeapSelection,
    /// User context filters (`record --context`; empty: every context).
    #[serde(default)]
    pub contexts: Vec<String>,
    /// CPU-time profiling's period per thread in ns (0: off).
    #[serde(default)]
    pub cpu_period_ns: u64,
    /// No heap is sampled (`--no-heap`).
    #[serde(default)]
    pub no_heap: bool,
    /// The perf event sampled on (`--event`; 0: none) and its period.
    #[serde(default)]
    pub perf_event: u32,
    /// Events per sample.
    #[serde(default)]
    pub perf_period: u64,
    /// Malloc samples carry their whole stack (`record --no-stack-reuse`).
    #[serde(default)]
    pub no_stack_reuse: bool,
    /// The client keeps its interval when its ring fills
    /// (`record --fixed-interval`; see `ClientConfig::FLAG_ADAPTIVE_INTERVAL`).
    #[serde(default)]
    pub fixed_interval: bool,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            interval: DEFAULT_INTERVAL,
            shmem_size: DEFAULT_SHMEM,
            block_client: false,
            block_timeout_us: 0,
            seed: 0,
            heaps: HeapSelection::default(),
            contexts: Vec::new(),
            cpu_period_ns: 0,
            no_heap: false,
            perf_event: 0,
            perf_period: 0,
            no_stack_reuse: false,
            fixed_interval: false,
        }
    }
}

/// When the profile writes dumps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dumps {
    /// Continuous dumps: first after `phase_ms`, then every `interval_ms`.
    pub continuous: Option<Continuous>,
    /// One dump at the peak of live sampled bytes instead of at the end.
    pub dump_at_max: bool,
}

/// Perfetto's `ContinuousDumpConfig`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Continuous {
    /// Delay before the first dump.
    pub phase_ms: u32,
    /// Time between dumps (> 0).
    pub interval_ms: u32,
}

/// Limits on what the profile may cost the service (Perfetto's names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guardrails {
    /// Stop when the service's resident memory exceeds this.
    pub max_heapprofd_memory_kb: Option<u32>,
    /// Stop when the service's CPU time since the profile started exceeds this.
    pub max_heapprofd_cpu_secs: Option<u64>,
}

/// A whole profile request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileSpec {
    /// Which processes.
    pub targets: Targets,
    /// How they are sampled.
    pub sampling: Sampling,
    /// When dumps are written.
    pub dumps: Dumps,
    /// Guardrails.
    pub guardrails: Guardrails,
    /// Stop after this long (none: until stopped).
    pub duration_ms: Option<u64>,
    /// Symbolize frames.
    pub symbolize: bool,
}

/// The environment variable that marks the processes of a `record --
/// CMD` profile of the service ([`Targets::command`]).
pub const PROFILE_ENV: &str = "HEAPPROFD_PROFILE";

/// Whether `token` may name a command's profile: 16 to 64 ASCII letters or
/// digits (it is matched in environments, so nothing else).
pub fn valid_token(token: &str) -> bool {
    (16..=64).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Whether a name pattern is a glob.
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

impl ProfileSpec {
    /// Checks what a peer may not get wrong; the first problem, in words.
    pub fn check(&self) -> Result<(), String> {
        let t = &self.targets;
        if t.pids.is_empty() && t.names.is_empty() && !t.all && t.command.is_none() {
            return Err("the profile names no process: give -n NAME, -p PID or --all".into());
        }
        if !t.startup && !t.running {
            return Err("--no-startup and --no-running exclude each other".into());
        }
        if t.pids.len() + t.names.len() > MAX_TARGETS {
            return Err(format!(
                "more than {MAX_TARGETS} names and pids in one profile"
            ));
        }
        for n in &t.names {
            if !valid_name(n.as_bytes()) {
                return Err(format!(
                    "`{}` is not a process name (empty, longer than 255 bytes, or holding a newline)",
                    n.escape_debug()
                ));
            }
            if t.startup && is_glob(n) {
                return Err(format!(
                    "the pattern `{n}` can only match running processes: add --no-startup \
                     (startup profiling needs exact names, as in Perfetto)"
                ));
            }
        }
        if let Some(token) = &t.command
            && !valid_token(token)
        {
            return Err("the command's token must be 16 to 64 letters or digits".into());
        }
        if t.pids.contains(&0) {
            return Err("pid 0 is not a process".into());
        }
        if self.sampling.interval == 0 {
            return Err("the sampling interval must be at least 1 byte".into());
        }
        heapprofd_shmem::check_data_size(self.sampling.shmem_size).map_err(|e| e.to_string())?;
        self.sampling.heaps.check()?;
        if let Some(c) = self.dumps.continuous
            && c.interval_ms == 0
        {
            return Err("the continuous dump interval must be more than 0 ms".into());
        }
        if self.dumps.dump_at_max && self.dumps.continuous.is_some() {
            return Err("dump_at_max and continuous dumps exclude each other".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2 MiB at 4 KiB and finer; 1 MiB from 8 KiB; 8 MiB whenever other
    /// samples share the ring.
    #[test]
    fn the_default_ring_follows_the_finest_interval() {
        let mib = 1 << 20;
        for (interval, size) in [
            (1, 2 * mib),
            (4096, 2 * mib),
            (6000, 2 * mib),
            (8192, mib),
            (16 << 10, mib),
            (512 << 10, mib),
            (u64::MAX, mib),
        ] {
            assert_eq!(default_shmem_for(interval, false), size, "-i {interval}");
        }
        assert_eq!(default_shmem_for(1, true), 8 * mib);
        assert_eq!(default_shmem_for(512 << 10, true), 8 * mib);
    }

    fn spec() -> ProfileSpec {
        ProfileSpec {
            targets: Targets {
                names: vec!["python3".into()],
                startup: true,
                running: true,
                ..Targets::default()
            },
            ..ProfileSpec::default()
        }
    }

    #[test]
    fn checks() {
        assert_eq!(spec().check(), Ok(()));
        let mut s = spec();
        s.targets.names.clear();
        assert!(s.check().unwrap_err().contains("names no process"));
        let mut s = spec();
        s.targets.names = vec!["py*".into()];
        assert!(s.check().unwrap_err().contains("--no-startup"));
        s.targets.startup = false;
        assert_eq!(s.check(), Ok(()));
        s.targets.running = false;
        assert!(s.check().unwrap_err().contains("exclude"));
        let mut s = spec();
        s.targets.names = vec!["a\nall 1".into()];
        assert!(s.check().is_err());
        let mut s = spec();
        s.sampling.shmem_size = 12345;
        assert!(s.check().is_err());
        let mut s = spec();
        s.dumps.continuous = Some(Continuous {
            phase_ms: 0,
            interval_ms: 0,
        });
        assert!(s.check().is_err());
        let mut s = spec();
        s.targets.names.clear();
        s.targets.command = Some("0123456789abcdef".into());
        assert_eq!(s.check(), Ok(()));
        s.targets.command = Some("short".into());
        assert!(s.check().is_err());
        s.targets.command = Some("0123456789abcdef\n".into());
        assert!(s.check().is_err());
        let json = serde_json::to_string(&spec()).expect("json");
        assert_eq!(
            serde_json::from_str::<ProfileSpec>(&json).expect("back"),
            spec()
        );
    }
}
