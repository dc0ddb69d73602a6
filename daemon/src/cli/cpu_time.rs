//! `record --cpu-time [PERIOD | RATE/s]`: how often each thread is sampled
//! by the CPU it uses; and `record --event NAME [--period N]`, sampling on
//! a software perf event.
//!
//! * `PERIOD` (`10ms`, `1ms`, `500us`): one sample per PERIOD of CPU time a
//!   thread consumes, whatever the number of threads.
//! * `RATE/s` (`500/s`, the default): JEP 509's rule. The rate is what the
//!   whole process produces when every CPU is busy, so each thread's
//!   period is `number of CPUs / RATE` seconds (2 CPUs at 500/s: 4 ms per
//!   thread; a process keeping both CPUs busy then gets 500 samples a
//!   second, one keeping one CPU busy 250). The CPUs are counted when the
//!   profile starts (`available_parallelism`, which honours the affinity
//!   mask and cgroup quotas).

use std::time::Duration;

use super::units::parse_duration;

/// The default of `--cpu-time` without a value (JEP 509's).
pub const DEFAULT: &str = "500/s";
/// Shortest period per thread accepted: below it the timer signals would
/// cost more than the code they measure.
pub const MIN_PERIOD: Duration = Duration::from_micros(100);

/// A `--cpu-time` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuTime {
    /// One sample per this much CPU time of a thread.
    Period(Duration),
    /// Samples a second over the whole process at full load.
    Rate(u32),
}

impl CpuTime {
    /// The period per thread in nanoseconds on a machine of `cpus` CPUs
    /// (see the module docs), at least [`MIN_PERIOD`].
    pub fn period_ns(self, cpus: usize) -> u64 {
        let ns = match self {
            CpuTime::Period(d) => d.as_nanos().min(u128::from(u64::MAX)) as u64,
            CpuTime::Rate(r) => 1_000_000_000u64.saturating_mul(cpus.max(1) as u64) / u64::from(r),
        };
        ns.max(MIN_PERIOD.as_nanos() as u64)
    }

    /// [`CpuTime::period_ns`] on this machine.
    pub fn period_ns_here(self) -> u64 {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.period_ns(cpus)
    }
}

/// `record --event NAME`: a software perf event.
pub fn parse_event(s: &str) -> Result<heapprofd_proto::wire::PerfEvent, String> {
    heapprofd_proto::wire::PerfEvent::from_name(s).ok_or_else(|| {
        format!(
            "unknown event `{s}`: use page-faults, context-switches, cpu-clock or task-clock \
             (software events; hardware counters are not available)"
        )
    })
}

/// The default `--period` of an event: a page fault in 100, every context
/// switch, 10 ms of the CPU or task clock.
pub fn default_period(e: heapprofd_proto::wire::PerfEvent) -> u64 {
    use heapprofd_proto::wire::PerfEvent as E;
    match e {
        E::PageFaults => 100,
        E::ContextSwitches => 1,
        E::CpuClock | E::TaskClock => 10_000_000,
    }
}

/// Parses `10ms` or `500/s`.
pub fn parse_cpu_time(s: &str) -> Result<CpuTime, String> {
    let t = s.trim();
    if let Some(rate) = t.strip_suffix("/s") {
        return match rate.trim().parse::<u32>() {
            Ok(r) if r > 0 => Ok(CpuTime::Rate(r)),
            _ => Err(format!(
                "invalid rate `{s}`: expected samples a second such as 500/s"
            )),
        };
    }
    let d = parse_duration(t).map_err(|e| format!("{e}; or give a rate such as 500/s"))?;
    if d < MIN_PERIOD {
        return Err(format!(
            "the CPU-time period must be at least {}us (e.g. 1ms, 10ms, or a rate: 500/s)",
            MIN_PERIOD.as_micros()
        ));
    }
    Ok(CpuTime::Period(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_and_rates() {
        assert_eq!(
            parse_cpu_time("10ms"),
            Ok(CpuTime::Period(Duration::from_millis(10)))
        );
        assert_eq!(parse_cpu_time("500/s"), Ok(CpuTime::Rate(500)));
        assert!(parse_cpu_time("0/s").is_err());
        assert!(parse_cpu_time("x/s").is_err());
        assert!(parse_cpu_time("10us").is_err());
        assert!(parse_cpu_time("fast").is_err());
        assert_eq!(
            CpuTime::Period(Duration::from_millis(10)).period_ns(8),
            10_000_000
        );
        // JEP 509: the rate over all CPUs.
        assert_eq!(CpuTime::Rate(500).period_ns(2), 4_000_000);
        assert_eq!(CpuTime::Rate(500).period_ns(1), 2_000_000);
        assert_eq!(CpuTime::Rate(1_000_000).period_ns(1), 100_000, "capped");
    }

    #[test]
    fn events() {
        use heapprofd_proto::wire::PerfEvent;
        assert_eq!(parse_event("page-faults"), Ok(PerfEvent::PageFaults));
        assert!(parse_event("cycles").is_err());
        assert_eq!(default_period(PerfEvent::TaskClock), 10_000_000);
        for e in PerfEvent::ALL {
            assert_eq!(PerfEvent::of_tag(e.tag()), Some(e));
            assert_eq!(PerfEvent::from_name(e.name()), Some(e));
        }
        assert_eq!(PerfEvent::of_tag(7), None);
    }
}
