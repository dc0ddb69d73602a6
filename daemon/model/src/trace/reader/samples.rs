//! Reading stack samples back: `PerfSample` packets (ours, and any other
//! writer's, e.g. traced_perf) aggregated per (process, event) by stack
//! and thread, with heapprofd-rs's extensions (the event of a sample, the
//! per-thread totals and losses, the events' names) where present.

use std::collections::BTreeMap;

use heapprofd_proto::perfetto as pf;
use heapprofd_proto::wire::PerfEvent;
use rustc_hash::{FxHashMap, FxHashSet};

use super::super::data::{Frame, SampleProfile, SampledStack};
use super::super::extension::{SampleTotals, StackSampleExt};
use super::super::interned::{Resolver, Tables};
use super::super::module_symbols::ModuleSymbolTable;
use crate::profile::ThreadSamples;
use crate::profile::samples::TAG_CPU_TIME;

/// A callstack of a sequence generation: (sequence, generation, iid).
type Key = (u32, u64, u64);

#[derive(Debug, Default)]
struct Acc {
    profile: SampleProfile,
    /// (stack, tid) -> position in `profile.stacks`.
    index: FxHashMap<(usize, u32), usize>,
    /// Per-thread totals counted from the samples.
    counted: BTreeMap<u32, ThreadSamples>,
}

/// What the reader keeps of the samples it has seen.
#[derive(Debug, Default)]
pub(super) struct SampleReader {
    /// Resolved stacks, and the callstack keys that gave them.
    stacks: Vec<Vec<Frame>>,
    /// The distinct frames of `stacks`.
    pool: FxHashSet<Frame>,
    by_key: FxHashMap<Key, usize>,
    /// Per (pid, tag).
    accs: BTreeMap<(u32, u64), Acc>,
    /// heapprofd-rs's totals per process (the latest).
    totals: BTreeMap<u32, SampleTotals>,
}

impl SampleReader {
    /// One `PerfSample` of sequence generation `(seq, generation)`.
    pub(super) fn sample(
        &mut self,
        key: (u32, u64),
        tables: &Tables,
        s: &pf::PerfSample,
        ext: Option<&StackSampleExt>,
        warnings: &mut Vec<String>,
    ) {
        // Loss records and producer events carry no stack.
        if s.kernel_records_lost.is_some() || s.producer_event.is_some() || s.pid.is_none() {
            return;
        }
        let stack = match s.callstack_iid {
            Some(iid) => {
                let k = (key.0, key.1, iid);
                match self.by_key.get(&k) {
                    Some(&i) => i,
                    None => {
                        let empty = Tables::default();
                        let mut resolver = Resolver {
                            interned: tables,
                            local: &empty,
                            cache: FxHashMap::default(),
                            pool: &mut self.pool,
                            warnings,
                        };
                        let frames = resolver.callstack(iid);
                        self.stacks.push(frames);
                        self.by_key.insert(k, self.stacks.len() - 1);
                        self.stacks.len() - 1
                    }
                }
            }
            None => usize::MAX,
        };
        let (pid, tid) = (s.pid.unwrap_or(0), s.tid.unwrap_or(0));
        let tag = ext.and_then(|e| e.tag).unwrap_or(TAG_CPU_TIME);
        let weight = s.timebase_count.unwrap_or(1).max(1);
        let acc = self.accs.entry((pid, tag)).or_default();
        if s.optional_unwind_error.is_some() {
            acc.profile.unwind_errors += 1;
        }
        let t = acc.counted.entry(tid).or_default();
        t.samples += 1;
        t.weight = t.weight.saturating_add(weight);
        if stack == usize::MAX {
            return;
        }
        let n = acc.profile.stacks.len();
        let i = *acc.index.entry((stack, tid)).or_insert(n);
        if i == n {
            acc.profile.stacks.push(SampledStack {
                frames: Vec::new(),
                tid,
                samples: 0,
                weight: 0,
            });
        }
        let st = &mut acc.profile.stacks[i];
        if st.frames.is_empty() {
            st.frames = self.stacks[stack].clone();
        }
        st.samples += 1;
        st.weight = st.weight.saturating_add(weight);
    }

    /// heapprofd-rs's totals of a process.
    pub(super) fn totals(&mut self, t: SampleTotals) {
        self.totals.insert(t.pid.unwrap_or(0) as u32, t);
    }

    /// The profiles, symbolized with the trace's `ModuleSymbols`.
    pub(super) fn finish(self, symbols: &ModuleSymbolTable) -> Vec<SampleProfile> {
        let SampleReader {
            accs,
            totals,
            mut pool,
            ..
        } = self;
        let mut out = Vec::new();
        for ((pid, tag), acc) in accs {
            let Acc {
                mut profile,
                counted,
                ..
            } = acc;
            profile.pid = pid;
            profile.tag = tag;
            let t = totals.get(&pid);
            profile.event = match (tag, t) {
                (TAG_CPU_TIME, _) => "cpu-time".to_owned(),
                _ if PerfEvent::of_tag(tag).is_some() => {
                    PerfEvent::of_tag(tag).map_or_else(String::new, |e| e.name().to_owned())
                }
                (_, Some(t)) => t
                    .events
                    .iter()
                    .find(|e| e.tag == Some(tag))
                    .and_then(|e| e.name.clone())
                    .unwrap_or_else(|| format!("event-{tag}")),
                (_, None) => format!("event-{tag}"),
            };
            let written: BTreeMap<u32, ThreadSamples> = t
                .map(|t| {
                    t.threads
                        .iter()
                        .filter(|x| x.tag.unwrap_or(0) == tag)
                        .map(|x| {
                            let v = ThreadSamples {
                                samples: x.samples.unwrap_or(0),
                                weight: x.weight.unwrap_or(0),
                                lost_overrun: x.lost_overrun.unwrap_or(0),
                                lost_dropped: x.lost_dropped.unwrap_or(0),
                            };
                            (x.tid.unwrap_or(0) as u32, v)
                        })
                        .collect()
                })
                .unwrap_or_default();
            profile.threads = if written.is_empty() { counted } else { written };
            if !symbols.is_empty() {
                for s in &mut profile.stacks {
                    if let Some(f) = symbols.apply(&s.frames, &mut pool) {
                        s.frames = f;
                    }
                }
            }
            out.push(profile);
        }
        out
    }
}
