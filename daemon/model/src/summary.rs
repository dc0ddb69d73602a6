//! The data of the end-of-run summary: per process, what was sampled and
//! what makes its profile incomplete. The daemon turns it into text.

use std::collections::BTreeMap;

use crate::messages::{SessionStats, Unprofilable};
use crate::profile::{ClientError, Profile};

/// Something that makes a process's profile incomplete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessWarning {
    /// The client dropped this many samples because its ring buffer was full.
    SamplesDropped(u64),
    /// The program waited longer than the block timeout; its profile ended early.
    BlockTimeout,
    /// The ring buffer was corrupt; some records were lost.
    BufferCorrupt,
    /// The process named more heaps than a process may have; this many of
    /// its declarations and records were dropped (it is flagged
    /// `hit_guardrail` in the trace).
    HeapLimit(u64),
    /// More than a tenth of the stacks could not be fully unwound.
    UnwindErrors {
        /// Stacks whose unwinding ended in an error.
        errors: u64,
        /// Stacks unwound.
        samples: u64,
    },
    /// After a profiled image, the process ran unprofiled (it exec'd a
    /// program that cannot load the client).
    ThenUnprofiled(Unprofilable),
    /// Another profile of the service samples the process differently
    /// (`rejected_concurrent` in the trace).
    RejectedConcurrent,
    /// A guardrail of the profile ended the process's profile
    /// (`hit_guardrail` in the trace; not the heap limit).
    Guardrail,
    /// The client had no room for this many user contexts: their samples
    /// are under the context `heapprofd.context=overflow`.
    ContextOverflow(u64),
    /// The client raised its `libc.malloc` interval while its ring was
    /// filling (`ClientConfig::FLAG_ADAPTIVE_INTERVAL`): the estimates
    /// stay unbiased, with more variance.
    IntervalRaised {
        /// Samples drawn at a raised interval.
        samples: u64,
        /// The interval asked for.
        from: u64,
        /// The largest interval a sample was drawn at.
        to: u64,
        /// Samples thinned away while the ring was full (each kept one
        /// stands for them at the largest interval).
        thinned: u64,
    },
}

/// One process of the summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessSummary {
    /// Process id.
    pub pid: u32,
    /// Command line.
    pub cmdline: Vec<String>,
    /// Malloc samples unwound.
    pub samples: u64,
    /// Allocations the samples stand for (estimated; exact at interval 1).
    pub estimated_allocations: f64,
    /// Every allocation was recorded (interval 1 on every heap).
    pub exact: bool,
    /// Estimated bytes allocated (sum of sample sizes).
    pub allocated: u64,
    /// Estimated bytes freed.
    pub freed: u64,
    /// Sum over its heaps of each heap's peak of unreleased (live sampled)
    /// bytes: what a dump_at_max trace holds for the process.
    pub peak_unreleased: u64,
    /// Time of the highest heap peak after the process's first allocation
    /// (ns), if it allocated.
    pub peak_after_ns: Option<u64>,
    /// Unwinds that ended in an error.
    pub unwind_errors: u64,
    /// Records the client dropped (buffer full).
    pub dropped: u64,
    /// Anything that makes this process's profile incomplete.
    pub warnings: Vec<ProcessWarning>,
    /// Never profiled: why (it is in the trace, flagged, with no samples).
    pub not_profiled: Option<Unprofilable>,
    /// Never profiled: the client could not be loaded into it, and why.
    pub not_attached: Option<String>,
}

impl ProcessSummary {
    /// Whether it was profiled at all (not named as unprofilable or as
    /// one the client could not be loaded into).
    pub fn profiled(&self) -> bool {
        self.not_profiled.is_none() && self.not_attached.is_none()
    }
}

/// The summary of every process of `profile`; `sessions` are the (pid,
/// stats) of every session, ended or not.
pub(crate) fn summarize<'a>(
    profile: &Profile,
    sessions: impl Iterator<Item = (u32, &'a SessionStats)>,
) -> Vec<ProcessSummary> {
    // (dropped, thinned) records by process.
    let mut ring_by_pid: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for (pid, s) in sessions {
        let e = ring_by_pid.entry(pid).or_default();
        // Both counts come from the ring, which a peer can corrupt.
        e.0 = e.0.saturating_add(s.ring.writes_overflow);
        e.1 = e.1.saturating_add(s.ring.thinned);
    }
    profile
        .processes()
        .map(|p| {
            let (mut allocated, mut freed, mut estimated) = (0, 0, 0.0);
            let (mut peak_unreleased, mut highest) = (0u64, (0u64, 0u64));
            let mut first: Option<u64> = None;
            for h in p.heaps() {
                peak_unreleased += h.max_live_bytes();
                if h.max_live_bytes() > highest.0 {
                    highest = (h.max_live_bytes(), h.max_timestamp());
                }
                if let Some(t) = h.first_timestamp() {
                    first = Some(first.map_or(t, |f| f.min(t)));
                }
                for c in h.callsites() {
                    allocated += c.allocated;
                    freed += c.freed;
                    estimated += c.stats.estimated_allocs;
                }
                allocated += h.retired.allocated;
                freed += h.retired.freed;
                estimated += h.retired.estimated_allocs;
            }
            let exact = p.heaps().all(|h| h.sampling_interval == 1);
            // (samples, from, to) over the heaps whose interval was raised.
            let mut raised: Option<(u64, u64, u64)> = None;
            for h in p.heaps().filter(|h| h.raised.samples > 0) {
                let (n, from, to) = raised.get_or_insert((0, u64::MAX, 0));
                *n += h.raised.samples;
                *from = (*from).min(h.orig_sampling_interval);
                *to = (*to).max(h.raised.max_interval);
            }
            let (dropped, thinned) = ring_by_pid.get(&p.pid).copied().unwrap_or_default();
            let mut warnings = Vec::new();
            if dropped > 0 {
                warnings.push(ProcessWarning::SamplesDropped(dropped));
            }
            if p.flags.client_error == ClientError::HitTimeout {
                warnings.push(ProcessWarning::BlockTimeout);
            }
            if p.flags.buffer_corrupted {
                warnings.push(ProcessWarning::BufferCorrupt);
            }
            let over = p.order_stats().over_heap_limit;
            if over > 0 {
                warnings.push(ProcessWarning::HeapLimit(over));
            }
            if p.stats.heap_samples > 0 && p.stats.unwinding_errors * 10 > p.stats.heap_samples {
                warnings.push(ProcessWarning::UnwindErrors {
                    errors: p.stats.unwinding_errors,
                    samples: p.stats.heap_samples,
                });
            }
            if let Some((samples, from, to)) = raised {
                warnings.push(ProcessWarning::IntervalRaised {
                    samples,
                    from,
                    to,
                    thinned,
                });
            }
            if p.contexts.overflowed > 0 {
                warnings.push(ProcessWarning::ContextOverflow(p.contexts.overflowed));
            }
            if p.flags.rejected_concurrent {
                warnings.push(ProcessWarning::RejectedConcurrent);
            }
            if p.flags.hit_guardrail && over == 0 {
                warnings.push(ProcessWarning::Guardrail);
            }
            let not_profiled = p.unprofilable.filter(|_| p.sessions == 0);
            if let Some(why) = p.unprofilable.filter(|_| p.sessions > 0) {
                warnings.push(ProcessWarning::ThenUnprofiled(why));
            }
            ProcessSummary {
                pid: p.pid,
                cmdline: p.cmdline.clone(),
                samples: p.stats.heap_samples,
                estimated_allocations: estimated,
                exact,
                allocated,
                freed,
                peak_unreleased,
                peak_after_ns: first
                    .filter(|_| highest.0 > 0)
                    .map(|f| highest.1.saturating_sub(f)),
                unwind_errors: p.stats.unwinding_errors,
                dropped,
                warnings,
                not_profiled,
                not_attached: p.not_attached.clone().filter(|_| p.sessions == 0),
            }
        })
        .collect()
}
