//! A process's stack samples: CPU time (`record --cpu-time`) and the
//! events a program names (`heapprofd_request_stack`), each a stack at an
//! instant with what it stands for, kept until the trace writer streams
//! them out as `PerfSample` packets, and per (event, thread) totals and
//! lost counts, which stay for the summary and the trace's extension.

use std::collections::BTreeMap;

use super::tree::CallsiteId;

/// The tag of CPU-time samples.
pub const TAG_CPU_TIME: u64 = heapprofd_proto::wire::TAG_CPU_TIME;

/// One stack sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackSample {
    /// CLOCK_MONOTONIC of the sample, nanoseconds.
    pub timestamp_ns: u64,
    /// The thread's CPU clock at the sample, nanoseconds.
    pub cpu_time_ns: u64,
    /// Kernel thread id.
    pub tid: u32,
    /// The event (see [`TAG_CPU_TIME`]).
    pub tag: u64,
    /// What it stands for (CPU nanoseconds, or the event's period).
    pub period: u64,
    /// The stack.
    pub callsite: CallsiteId,
    /// The stack is the requesting code's own (its first frames are the
    /// handler's).
    pub biased: bool,
    /// Why the walk stopped early (the stack then ends in an `ERROR`
    /// frame); written as the `PerfSample`'s `unwind_error`.
    pub unwind_error: Option<heapprofd_proto::perfetto::profiling::StackUnwindError>,
}

/// Per (event, thread) totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadSamples {
    /// Samples received.
    pub samples: u64,
    /// Sum of their periods (CPU nanoseconds for CPU time).
    pub weight: u64,
    /// Timer expirations merged into recorded samples (their CPU time is
    /// in the samples' weights: not lost).
    pub lost_overrun: u64,
    /// Samples (CPU: timer expirations) lost in the client: ring full, or
    /// the thread was inside the client.
    pub lost_dropped: u64,
}

/// A process's stack samples (see the module docs).
#[derive(Debug, Default)]
pub struct StackSamples {
    /// Samples not written to the trace yet, in arrival order.
    pub(crate) pending: Vec<StackSample>,
    /// Totals per (tag, tid).
    pub threads: BTreeMap<(u64, u32), ThreadSamples>,
    /// Names of the program's tags.
    pub names: BTreeMap<u64, String>,
    /// The totals changed since the writer last wrote them.
    pub(crate) dirty: bool,
}

impl StackSamples {
    /// Adds a sample and the losses the client counted before it.
    pub fn add(&mut self, s: StackSample, lost_overrun: u64, lost_dropped: u64) {
        let t = self.threads.entry((s.tag, s.tid)).or_default();
        t.samples += 1;
        t.weight = t.weight.saturating_add(s.period.max(1));
        t.lost_overrun += lost_overrun;
        t.lost_dropped += lost_dropped;
        self.pending.push(s);
        self.dirty = true;
    }

    /// Adds losses no sample carried (a thread that exited).
    pub fn add_losses(&mut self, tag: u64, tid: u32, lost_overrun: u64, lost_dropped: u64) {
        let t = self.threads.entry((tag, tid)).or_default();
        t.lost_overrun += lost_overrun;
        t.lost_dropped += lost_dropped;
        self.dirty = true;
    }

    /// Samples waiting to be written.
    pub fn pending(&self) -> &[StackSample] {
        &self.pending
    }

    /// Takes the samples waiting to be written.
    pub fn take_pending(&mut self) -> Vec<StackSample> {
        std::mem::take(&mut self.pending)
    }

    /// The name of `tag`'s event: `cpu-time`, a perf event's, the
    /// program's name, or `event-<tag>`.
    pub fn event_name(&self, tag: u64) -> String {
        if let Some(e) = heapprofd_proto::wire::PerfEvent::of_tag(tag) {
            return e.name().to_owned();
        }
        match (tag, self.names.get(&tag)) {
            (TAG_CPU_TIME, _) => "cpu-time".to_owned(),
            (_, Some(n)) => n.clone(),
            (t, None) => format!("event-{t}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_per_event_and_thread() {
        let mut s = StackSamples::default();
        let c = CallsiteId::new(2).unwrap();
        let sample = |tid, tag, period| StackSample {
            timestamp_ns: 1,
            cpu_time_ns: 2,
            tid,
            tag,
            period,
            callsite: c,
            biased: false,
            unwind_error: None,
        };
        s.add(sample(7, 0, 10), 1, 0);
        s.add(sample(7, 0, 10), 0, 2);
        s.add(sample(8, 5, 0), 0, 0);
        assert_eq!(
            s.threads[&(0, 7)],
            ThreadSamples {
                samples: 2,
                weight: 20,
                lost_overrun: 1,
                lost_dropped: 2
            }
        );
        assert_eq!(s.threads[&(5, 8)].weight, 1, "a period of 0 counts 1");
        assert_eq!(s.take_pending().len(), 3);
        assert!(s.pending().is_empty());
        s.names.insert(5, "page-faults".into());
        assert_eq!(s.event_name(0), "cpu-time");
        assert_eq!(s.event_name(5), "page-faults");
        assert_eq!(s.event_name(6), "event-6");
    }
}
