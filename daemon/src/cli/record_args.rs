//! The command line of `heapprofd-rs record` (`-- CMD`, `--pid PID[,PID]`,
//! `-n NAME` and `--all`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::units::{parse_duration, parse_size};

/// Options of `heapprofd-rs record`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "\
EXAMPLES:
  heapprofd-rs record -- ./my-server --port 8080
  heapprofd-rs record -i 1 -o every-alloc.pftrace -- ./unit-tests
  heapprofd-rs record -i 512k --duration 30s --continuous-dump 5s -- ./batch-job
  heapprofd-rs record -n python3 -d 10s -o py.pftrace   (needs `heapprofd-rs daemon`)
  heapprofd-rs record --all -d 10s -o all.pftrace       (needs `heapprofd-rs daemon`)
  heapprofd-rs --pid 1234 -d 5s                          (short for `record --pid 1234`)
  heapprofd-rs record --heaps libc.malloc,pool --heap-interval pool=1 -- ./server
  heapprofd-rs record --context endpoint=/checkout -- ./server
  heapprofd-rs record --cpu-time 10ms --no-heap -- ./solver   (CPU time only)
  heapprofd-rs record --event page-faults --period 10 --no-heap -- ./loader

Open the trace in https://ui.perfetto.dev, or run `heapprofd-rs report TRACE`.")]
pub struct RecordArgs {
    /// Mean bytes between samples (Poisson sampling); 1 records every
    /// allocation. Accepts units: 4096, 32k, 1MiB.
    #[arg(short = 'i', long, default_value = "4096", value_parser = parse_interval)]
    pub interval: u64,

    /// Heaps to sample [default: libc.malloc]: libc.malloc (the malloc
    /// family) and the heaps the program registers with the custom
    /// allocator API (heapprofd.h); only those listed are sampled.
    #[arg(long, value_name = "NAME[,NAME...]", value_delimiter = ',')]
    pub heaps: Vec<String>,

    /// Sample every heap the program registers (and libc.malloc), at -i
    /// unless --heap-interval gives one its own.
    #[arg(long)]
    pub all_heaps: bool,

    /// A heap's own mean bytes between samples (repeatable; the heap is
    /// sampled): pool=1, arena=64k.
    #[arg(long, value_name = "NAME=BYTES", value_parser = parse_heap_interval)]
    pub heap_interval: Vec<(String, u64)>,

    /// Sample only while the thread has a user context installed
    /// (heapprofd_context_activate) that has KEY=VALUE, has KEY, or is
    /// `any` context (repeatable: any of them). Decided when the context
    /// is installed.
    #[arg(long = "context", value_name = "KEY=VALUE|KEY|any",
          value_parser = crate::service::contexts::parse_context_filter)]
    pub context: Vec<String>,

    /// Also profile CPU time: every thread is sampled by the CPU it uses
    /// (a thread asleep or blocked gets no samples), one sample per PERIOD
    /// of its CPU time (10ms) or RATE/s over the process at full load
    /// (500/s, the default: per thread CPUs/RATE seconds, as JDK's JEP
    /// 509). Written as Perfetto PerfSample packets; `report --cpu`.
    #[arg(long, value_name = "PERIOD|RATE/s", num_args = 0..=1,
          default_missing_value = super::cpu_time::DEFAULT,
          value_parser = super::cpu_time::parse_cpu_time)]
    pub cpu_time: Option<super::cpu_time::CpuTime>,

    /// Sample on a software perf event: every --period events of a thread
    /// record its stack (page-faults, context-switches, cpu-clock,
    /// task-clock), written as PerfSamples; `report --cpu` lists them.
    #[arg(long, value_name = "EVENT", value_parser = super::cpu_time::parse_event)]
    pub event: Option<heapprofd_proto::wire::PerfEvent>,

    /// Events per sample with --event [default: page-faults 100,
    /// context-switches 1, cpu-clock and task-clock 10000000 ns].
    #[arg(long, value_name = "N", requires = "event",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub period: Option<u64>,

    /// Sample no heap (with --cpu-time or --event: only those).
    #[arg(long)]
    pub no_heap: bool,

    /// Where to write the trace [default: heapprofd-<cmd>-<pid>-<time>.pftrace].
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Stop profiling after this long (500ms, 30s, 2m). CMD keeps running;
    /// `record` waits for it to exit.
    #[arg(short = 'd', long, value_parser = parse_positive_duration)]
    pub duration: Option<Duration>,

    /// Also dump every this often (1s, 500ms), so the trace shows the heap over time.
    #[arg(short = 'c', long, value_name = "PERIOD", value_parser = parse_dump_period)]
    pub continuous_dump: Option<Duration>,

    /// Report the heap at the moment of its peak (of live sampled bytes)
    /// instead of at the end.
    #[arg(long, conflicts_with = "continuous_dump")]
    pub dump_at_max: bool,

    /// Size of each client's ring buffer (a power of two: 8M, 64MiB)
    /// [default: 2MiB at the default interval and finer, 1MiB from -i 8k;
    /// 8MiB with --cpu-time or --event; 1MiB per process with --all]. A
    /// bigger ring absorbs longer bursts (the session statistics say how
    /// long the program waited for room) and costs more to set up.
    #[arg(long, value_parser = parse_shmem_size)]
    pub shmem_size: Option<u64>,

    /// When a ring buffer is full, the program waits up to TIMEOUT for the
    /// daemon instead of dropping the sample (0 = wait forever). This is the
    /// default, with 5s; after a timeout the process's profile ends, flagged.
    #[arg(long, value_name = "TIMEOUT", num_args = 0..=1, default_missing_value = "0",
          value_parser = parse_duration, conflicts_with = "no_block_client")]
    pub block_client: Option<Duration>,

    /// Drop samples (counted, and flagged in the trace) when a ring buffer
    /// is full, instead of slowing the program down.
    #[arg(long)]
    pub no_block_client: bool,

    /// Send each malloc sample's whole stack through the ring buffer. By
    /// default a sample leaves out the top of its stack that is the same
    /// as in its thread's previous sample (each sampling thread keeps a
    /// copy of up to 64 KiB of its last stack for that); this option is
    /// for comparing the two, and costs more.
    #[arg(long)]
    pub no_stack_reuse: bool,

    /// Keep the sampling interval fixed when the daemon falls behind. By
    /// default a program whose ring buffer is nearly full (7/8; 1/2 once it
    /// has had to wait) doubles its malloc interval (up to 1024 times)
    /// rather than wait for room, and halves it again once the ring has
    /// emptied; a sample that finds the ring full (less than 1/16 free) is
    /// thinned to the largest interval rather than wait. Each sample is
    /// weighted at the interval it was drawn at, so
    /// totals stay unbiased, and the summary says how many samples were
    /// taken at a raised interval. With this option the program waits (or,
    /// with --no-block-client, drops samples) instead. Never raised at -i 1
    /// or with --seed.
    #[arg(long)]
    pub fixed_interval: bool,

    /// Do not symbolize: the trace keeps build ids and addresses only, for
    /// symbolization later on another machine.
    #[arg(long)]
    pub no_symbolize: bool,

    /// Where names found by earlier runs are kept, one file per library or
    /// program (by build id), so that profiling the same binaries again
    /// does not parse their debug information again. An answer is used
    /// only while the binary and the debug files it was found with (or
    /// looked for and not found) are unchanged. Kept under 256 MiB, oldest
    /// files removed first
    /// [default: $XDG_CACHE_HOME/heapprofd-rs/symbols, else ~/.cache/heapprofd-rs/symbols].
    #[arg(long, value_name = "DIR")]
    pub symbol_cache: Option<PathBuf>,

    /// Neither read nor write the symbol cache.
    #[arg(long)]
    pub no_symbol_cache: bool,

    /// The client library to preload [default: libheapprofd_client.so next to this binary].
    #[arg(long, value_name = "PATH")]
    pub client_lib: Option<PathBuf>,

    /// With `-- CMD` or `--pid PID`: run a daemon of its own even when the
    /// profiling service (`heapprofd-rs daemon`) runs. By default they
    /// profile through a running service the user can reach, else with a
    /// daemon of their own.
    #[arg(long)]
    pub no_service: bool,

    /// Unwinding threads [default: number of CPUs, at most 4; with
    /// --workers `record -- CMD` runs its own daemon].
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,

    /// Sampler seed, for reproducible sampling (testing); implies
    /// --fixed-interval.
    #[arg(long, hide = true, default_value = "0")]
    pub seed: u64,

    /// Profile running processes instead of starting one (a comma list:
    /// several into one trace). Through the running service
    /// (`heapprofd-rs daemon`) when one answers: it wakes a dormant
    /// client or loads the client with ptrace, for root or the process's
    /// owner. One pid without a service (or with --no-service, --workers,
    /// --client-lib): a daemon of record's own does the same.
    #[arg(
        short = 'p',
        long,
        value_name = "PID[,PID...]",
        value_delimiter = ',',
        conflicts_with = "command"
    )]
    pub pid: Vec<u32>,

    /// Profile the programs of these names, through the running service
    /// (`heapprofd-rs daemon`): those already running (a preloaded dormant
    /// client is woken with signal 36, else the client is loaded with
    /// ptrace as --pid does) and those that start while the profile runs,
    /// from their first allocation (they need the client preloaded). Names are bionic's: the first argument of the command
    /// line, cut at `@`, its basename; `*` `?` globs with --no-startup.
    /// (Not yet with --continuous-dump, --client-lib, --workers.)
    #[arg(short = 'n', long, value_name = "NAME[,NAME...]", value_delimiter = ',',
          conflicts_with_all = ["command", "continuous_dump", "client_lib", "workers"])]
    pub name: Vec<String>,

    /// Profile every process that has the client loaded (preloaded,
    /// dormant), running ones and those that start, into one trace, through
    /// the running service (none is given the client with ptrace: the
    /// others are named as not profiled).
    #[arg(long, conflicts_with_all = ["command", "continuous_dump", "client_lib", "workers"])]
    pub all: bool,

    /// With -n/--all: only processes already running.
    #[arg(long, conflicts_with = "no_running")]
    pub no_startup: bool,

    /// With -n/--all: only processes that start from now on.
    #[arg(long)]
    pub no_running: bool,

    /// The profile as Perfetto's HeapprofdConfig in text format (bare, or a
    /// TraceConfig holding one), through the running service: its
    /// `process_cmdline`, `sampling_interval_bytes`, `shmem_size_bytes`,
    /// `block_client`, `continuous_dump_config`, `dump_at_max`... replace
    /// the options; `-d` replaces its duration.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["command", "pid", "name", "all"])]
    pub config: Option<PathBuf>,

    /// The command to profile, after `--`.
    #[arg(last = true, value_name = "CMD", required_unless_present_any = ["pid", "name", "config", "all"])]
    pub command: Vec<String>,
}

/// A duration that must be more than zero (`--duration 0` would profile
/// nothing).
fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("must be more than 0 (e.g. 500ms, 30s)".into()),
        d => Ok(d),
    }
}

/// A dump period: at least 1 ms (a zero period would dump without end).
fn parse_dump_period(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d < Duration::from_millis(1) => {
            Err("the dump period must be at least 1ms (e.g. 100ms, 5s)".into())
        }
        d => Ok(d),
    }
}

fn parse_shmem_size(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    heapprofd_shmem::check_data_size(n).map_err(|e| e.to_string())?;
    Ok(n)
}

fn parse_interval(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("the sampling interval must be at least 1 byte (1 = every allocation)".into()),
        n => Ok(n),
    }
}

/// `NAME=BYTES`: a heap and its interval (units as -i).
fn parse_heap_interval(s: &str) -> Result<(String, u64), String> {
    let Some((name, bytes)) = s.split_once('=') else {
        return Err(format!(
            "expected NAME=BYTES (e.g. pool=1, arena=64k), not `{s}`"
        ));
    };
    if !crate::service::heaps::valid_heap_name(name) {
        return Err(format!(
            "`{name}` is not a heap name (1 to {} bytes, no comma)",
            heapprofd_proto::wire::MAX_CUSTOM_HEAP_NAME
        ));
    }
    Ok((name.to_owned(), parse_interval(bytes)?))
}

impl RecordArgs {
    /// The symbol cache's directory, `None` when it is off.
    pub fn symbol_store(&self) -> Option<PathBuf> {
        if self.no_symbol_cache || self.no_symbolize {
            return None;
        }
        self.symbol_cache
            .clone()
            .or_else(heapprofd_unwinder::SymbolStore::default_dir)
    }

    /// Each client's ring size: `--shmem-size`, else the default for the
    /// finest interval any heap is sampled at and whether CPU-time or
    /// perf-event samples share the ring
    /// ([`crate::service::spec::default_shmem_for`]).
    pub fn ring_size(&self) -> u64 {
        self.shmem_size.unwrap_or_else(|| {
            let finest = self
                .heap_interval
                .iter()
                .map(|&(_, i)| i)
                .filter(|&i| i != 0)
                .fold(self.interval, u64::min);
            let other_samples = self.cpu_period_ns() != 0 || self.perf_event().0 != 0;
            crate::service::spec::default_shmem_for(finest, other_samples)
        })
    }

    /// CPU-time profiling's period per thread in ns (0 = off).
    pub fn cpu_period_ns(&self) -> u64 {
        self.cpu_time.map_or(0, |c| c.period_ns_here())
    }

    /// The perf event (its number, 0 = none) and its period.
    pub fn perf_event(&self) -> (u32, u64) {
        match self.event {
            Some(e) => (
                e as u32,
                self.period
                    .unwrap_or_else(|| super::cpu_time::default_period(e)),
            ),
            None => (0, 0),
        }
    }

    /// `--no-heap` without anything else to sample is a usage error.
    pub fn check_sampling(&self) -> Result<(), String> {
        if self.no_heap && self.cpu_time.is_none() && self.event.is_none() {
            return Err("--no-heap leaves nothing to sample: add --cpu-time or --event".into());
        }
        Ok(())
    }

    /// The heaps these options select.
    pub fn heap_selection(&self) -> crate::service::heaps::HeapSelection {
        crate::service::heaps::HeapSelection {
            names: self.heaps.clone(),
            all: self.all_heaps,
            intervals: self.heap_interval.clone(),
            exclude: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_intervals() {
        assert_eq!(parse_heap_interval("pool=1"), Ok(("pool".into(), 1)));
        assert_eq!(parse_heap_interval("a.b=64k"), Ok(("a.b".into(), 65536)));
        assert!(parse_heap_interval("pool").is_err());
        assert!(parse_heap_interval("pool=0").is_err());
        assert!(parse_heap_interval("=4").is_err());
    }

    #[test]
    fn zero_periods_are_refused() {
        assert!(parse_dump_period("0").is_err());
        assert!(parse_dump_period("0s").is_err());
        assert!(parse_dump_period("500us").is_err());
        assert_eq!(parse_dump_period("1ms"), Ok(Duration::from_millis(1)));
        assert!(parse_positive_duration("0ms").is_err());
        assert_eq!(parse_positive_duration("3s"), Ok(Duration::from_secs(3)));
    }
}
