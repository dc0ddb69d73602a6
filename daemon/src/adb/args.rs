//! The command line of `heapprofd-rs android`: what to profile on the
//! device, how, and where the results go on the host (the options of
//! Perfetto's `tools/heap_profile`, with this tool's units).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::cli::units::{parse_duration, parse_size};

/// Options of `heapprofd-rs android`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "\
EXAMPLES:
  heapprofd-rs android -n surfaceflinger -d 10s -o sf-profile
  heapprofd-rs android -p 1234 -i 1 --symbols ~/aosp/out/target/product/x/symbols
  heapprofd-rs android -n com.example.app -c 1s          (Ctrl-C ends it)
  heapprofd-rs android --perfetto -n system_server -d 5s (the device's own heapprofd)

Needs `adb` on PATH and one device (or ANDROID_SERIAL) with Android 10 or later.
Each run writes DIR/heapprofd-<time>/: trace.pftrace (symbolized), raw.pftrace
(as the device wrote it), report, heap_dump.<pid>.<heap>.pb.gz; DIR/latest
points at it.")]
pub struct AndroidArgs {
    /// Profile the processes of these names (running ones and those that
    /// start during the profile).
    #[arg(
        short = 'n',
        long,
        value_name = "NAME[,NAME...]",
        value_delimiter = ','
    )]
    pub name: Vec<String>,

    /// Profile these running processes.
    #[arg(short = 'p', long, value_name = "PID[,PID...]", value_delimiter = ',')]
    pub pid: Vec<u32>,

    /// Profile every process that can be profiled.
    #[arg(long, conflicts_with_all = ["name", "pid"])]
    pub all: bool,

    /// Mean bytes between samples; 1 records every allocation (4096, 32k, 1MiB).
    #[arg(short = 'i', long, default_value = "4096", value_parser = parse_interval)]
    pub interval: u64,

    /// Stop after this long (500ms, 10s, 2m; 0: until Ctrl-C) [default: until Ctrl-C].
    #[arg(short = 'd', long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Also dump every PERIOD (1s, 500ms), so the trace shows the heap over time.
    #[arg(short = 'c', long, value_name = "PERIOD", value_parser = parse_period)]
    pub continuous_dump: Option<Duration>,

    /// Dump the heap at its peak (of live sampled bytes) instead of at the end.
    #[arg(long, conflicts_with = "continuous_dump")]
    pub dump_at_max: bool,

    /// Heaps to sample [default: libc.malloc]: libc.malloc and heaps the
    /// programs register with the custom allocator API.
    #[arg(long, value_name = "NAME[,NAME...]", value_delimiter = ',')]
    pub heaps: Vec<String>,

    /// Sample every heap the programs register.
    #[arg(long, conflicts_with = "heaps")]
    pub all_heaps: bool,

    /// Where the runs go on the host: each run in its own directory
    /// DIR/heapprofd-<time>, DIR/latest pointing at the newest.
    #[arg(
        short = 'o',
        long,
        value_name = "DIR",
        default_value = "heapprofd-android"
    )]
    pub output: PathBuf,

    /// More directories with unstripped binaries (or their debug files) of
    /// the device's programs, matched by build id (like
    /// PERFETTO_BINARY_PATH); the directory of the heapprofd-rs build
    /// pushed is searched too. Several: `DIR:DIR` or the option repeated.
    #[arg(long, value_name = "DIR[:DIR...]", value_delimiter = ':')]
    pub symbols: Vec<PathBuf>,

    /// The heapprofd-rs build to push (a directory holding `heapprofd-rs`
    /// and `libheapprofd_client.so` built for the device's ABI)
    /// [default: found by ABI in this build's target directory].
    #[arg(long, value_name = "DIR", conflicts_with = "perfetto")]
    pub device_build: Option<PathBuf>,

    /// Use the device's own heapprofd through its `perfetto` command (an
    /// `android.heapprofd` config) instead of pushing heapprofd-rs.
    #[arg(long)]
    pub perfetto: bool,

    /// Print the config the profile runs with and exit.
    #[arg(long)]
    pub print_config: bool,
}

fn parse_interval(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("the sampling interval must be at least 1 byte (1 = every allocation)".into()),
        n => Ok(n),
    }
}

fn parse_period(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d < Duration::from_millis(1) => {
            Err("the dump period must be at least 1ms (e.g. 100ms, 5s)".into())
        }
        d => Ok(d),
    }
}

impl AndroidArgs {
    /// Whether the options name something to profile.
    pub fn has_target(&self) -> bool {
        self.all || !self.name.is_empty() || !self.pid.is_empty()
    }
}
