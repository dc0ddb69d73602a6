//! Stack samples in the trace: each as a `PerfSample` packet (pid, tid,
//! interned callstack, `cpu_mode` user, `timebase_count` = what it stands
//! for: CPU nanoseconds, or the event's period; `unwind_error` when the
//! walk stopped early, its stack then ending in an `ERROR` frame), stamped
//! with its BOOTTIME,
//! so trace processor's `perf_sample` table and the Perfetto UI's CPU flame
//! graphs and thread tracks show them; an extension (see
//! [`super::super::extension`]) on a sample of a named event gives its tag,
//! and after them one extension packet per process holds the cumulative
//! samples and losses per (event, thread) and the events' names.

use std::io::Write;

use heapprofd_proto::perfetto::{self as pf, Message, TracePacket, trace_packet};

use super::super::TraceError;
use super::super::extension::{
    EventNameMsg, Extension, SampleTotals, StackSampleExt, ThreadSampleTotals,
};
use super::{PendingInterned, TraceWriter};
use crate::profile::{Interner, Profile, StackSample, samples::TAG_CPU_TIME};

/// Samples whose callstacks are interned before their packets follow.
const BATCH: usize = 256;

impl<W: Write> TraceWriter<W> {
    /// Writes the stack samples every process got since the last call, and
    /// each such process's totals. [`TraceWriter::dump`] calls it.
    pub fn write_stack_samples(
        &mut self,
        profile: &mut Profile,
        interner: &Interner,
    ) -> Result<(), TraceError> {
        let (tree, processes) = profile.split_mut();
        for p in processes.values_mut() {
            if !p.samples.dirty {
                continue;
            }
            p.samples.dirty = false;
            let pid = p.pid;
            let samples = p.samples.take_pending();
            let mut stack = std::mem::take(&mut self.stack);
            for batch in samples.chunks(BATCH) {
                let mut pending = PendingInterned::default();
                for s in batch {
                    self.emitted
                        .callstack(tree, interner, s.callsite, &mut stack, &mut pending);
                }
                let boot = self.clocks.monotonic_to_boottime(batch[0].timestamp_ns);
                self.flush_interned(&mut pending, boot)?;
                for s in batch {
                    self.perf_sample(pid, s)?;
                }
            }
            self.stack = stack;
            let totals = SampleTotals {
                pid: Some(u64::from(pid)),
                threads: p
                    .samples
                    .threads
                    .iter()
                    .map(|(&(tag, tid), t)| ThreadSampleTotals {
                        tag: Some(tag),
                        tid: Some(u64::from(tid)),
                        samples: Some(t.samples),
                        weight: Some(t.weight),
                        lost_overrun: Some(t.lost_overrun),
                        lost_dropped: Some(t.lost_dropped),
                    })
                    .collect(),
                events: p
                    .samples
                    .names
                    .iter()
                    .map(|(&tag, name)| EventNameMsg {
                        tag: Some(tag),
                        name: Some(name.clone()),
                    })
                    .collect(),
            };
            let boot = match samples.last() {
                Some(s) => self.clocks.monotonic_to_boottime(s.timestamp_ns),
                None => self.clocks.boottime_ns,
            };
            let packet = TracePacket {
                timestamp: Some(boot),
                ..Default::default()
            };
            let ext = Extension {
                sample_totals: Some(totals),
                ..Extension::default()
            };
            self.emit_with_extension(packet, &ext)?;
        }
        Ok(())
    }

    fn perf_sample(&mut self, pid: u32, s: &StackSample) -> Result<(), TraceError> {
        let sample = pf::PerfSample {
            pid: Some(pid),
            tid: Some(s.tid),
            callstack_iid: Some(s.callsite.iid()),
            cpu_mode: Some(pf::profiling::CpuMode::ModeUser as i32),
            timebase_count: Some(s.period.max(1)),
            optional_unwind_error: s
                .unwind_error
                .map(|e| pf::perf_sample::OptionalUnwindError::UnwindError(e as i32)),
            ..Default::default()
        };
        let packet = TracePacket {
            timestamp: Some(self.clocks.monotonic_to_boottime(s.timestamp_ns)),
            data: Some(trace_packet::Data::PerfSample(sample)),
            ..Default::default()
        };
        if s.tag == TAG_CPU_TIME && !s.biased {
            return self.emit(packet);
        }
        let ext = Extension {
            stack_sample: Some(StackSampleExt {
                tag: Some(s.tag),
                biased: s.biased.then_some(true),
            }),
            ..Extension::default()
        };
        debug_assert!(ext.encoded_len() > 0);
        self.emit_with_extension(packet, &ext)
    }
}
