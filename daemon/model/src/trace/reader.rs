//! Reading heap profiles back from a Perfetto trace: ours, and heapprofd's.
//!
//! The reader follows trace processor's rules: interned data per trusted
//! packet sequence (reset when a packet clears incremental state),
//! ProfilePacket-local tables (Android Q traces) looked up first, and a
//! dump group resolved when its last packet (`continued` unset) arrives, so
//! interned data written after the samples (heapprofd's order) works too.
//!
//! Values are cumulative, and a dump may leave out callsites that did not
//! change; the result keeps, per (process, heap), the latest values of
//! every callstack seen in any dump, and per dump the totals and what
//! changed ([`DumpPoint`]), for timelines. heapprofd-rs's extension packets
//! ([`super::extension`]) add per-callsite statistics; `ProcessTree` and
//! `ProcessStats` packets name processes and threads and give their memory
//! over time. `ModuleSymbols` packets (offline symbols, see
//! [`super::module_symbols`]) name the frames that have no name, wherever
//! in the trace they are. A trace that ends inside a packet or inside a
//! dump is [`TraceData::truncated`].
mod samples;

use std::collections::BTreeMap;
use std::io::{self, Read};

use heapprofd_proto::perfetto::{self as pf, Message, TracePacket, profile_packet, trace_packet};
use rustc_hash::{FxHashMap, FxHashSet};

use super::TraceError;
use super::data::{
    CallstackValues, Counters, DumpPoint, Frame, HeapProfile, MemorySample, TraceData, Truncation,
};
use super::extension::{Extension, find_extension};
use super::interned::{Resolver, Tables};
use super::module_symbols::ModuleSymbolTable;
use crate::profile::{CallsiteStats, ClientError, ProcessStats, UNWIND_HISTOGRAM_BUCKETS, context};

#[derive(Debug, Default)]
struct Sequence {
    tables: Tables,
    local: Tables,
    generation: u64,
    last_index: Option<u64>,
    group: Vec<profile_packet::ProcessHeapSamples>,
}

/// A callstack of a sequence generation: (sequence, generation, iid).
type Key = (u32, u64, u64);

#[derive(Debug, Default)]
struct HeapAcc {
    profile: HeapProfile,
    /// Latest values and position in `order`, per key.
    latest: FxHashMap<Key, (CallstackValues, u32)>,
    order: Vec<Key>,
    /// Running sum of the latest counters.
    totals: Counters,
    /// Latest extension statistics per key.
    stats: FxHashMap<Key, CallsiteStats>,
}

#[derive(Debug, Default)]
struct Reader {
    seqs: FxHashMap<u32, Sequence>,
    heaps: BTreeMap<(u32, String), HeapAcc>,
    data: TraceData,
    /// (BOOTTIME, MONOTONIC_COARSE) of the first clock snapshot.
    clocks: Option<(u64, u64)>,
    /// Offline symbols (`ModuleSymbols` packets), applied at the end.
    symbols: ModuleSymbolTable,
    /// Stack samples (`PerfSample` packets).
    samples: samples::SampleReader,
    /// The distinct frames of the heap profiles' stacks (see [`Frame`]).
    pool: FxHashSet<Frame>,
}

fn add_counters(t: &mut Counters, new: Counters, old: Counters) {
    let f = |t: &mut u64, n: u64, o: u64| *t = t.saturating_add(n).saturating_sub(o);
    f(&mut t.allocated, new.allocated, old.allocated);
    f(&mut t.freed, new.freed, old.freed);
    f(&mut t.alloc_count, new.alloc_count, old.alloc_count);
    f(&mut t.free_count, new.free_count, old.free_count);
}

impl Reader {
    fn warn(&mut self, w: String) {
        if self.data.warnings.len() < 100 && !self.data.warnings.contains(&w) {
            self.data.warnings.push(w);
        }
    }

    fn packet(&mut self, offset: u64, p: TracePacket, ext: Option<Extension>) {
        self.data.packets += 1;
        let seq_id = p.trusted_packet_sequence_id().unwrap_or(0);
        let cleared = p.sequence_flags.unwrap_or(0) & pf::SEQ_INCREMENTAL_STATE_CLEARED != 0
            || p.incremental_state_cleared == Some(true);
        let seq = self.seqs.entry(seq_id).or_default();
        if cleared {
            seq.tables = Tables::default();
            seq.generation += 1;
        }
        if let Some(d) = p.interned_data {
            seq.tables.add_interned(d);
        }
        let generation = seq.generation;
        let boot = p.timestamp;
        let (heap_stats, stack_ext, totals) = match ext {
            Some(e) => (e.heap_stats, e.stack_sample, e.sample_totals),
            None => (None, None, None),
        };
        if let Some(t) = totals {
            self.samples.totals(t);
        }
        match p.data {
            Some(trace_packet::Data::ProcessTree(t)) => {
                for pr in t.processes {
                    let pid = pr.pid() as u32;
                    let info = self.data.processes.entry(pid).or_default();
                    info.pid = pid;
                    if pr.ppid.is_some() {
                        info.ppid = Some(pr.ppid() as u32);
                    }
                    info.cmdline = pr.cmdline;
                }
                for th in t.threads {
                    let pid = th.tgid() as u32;
                    let info = self.data.processes.entry(pid).or_default();
                    info.pid = pid;
                    let name = info.threads.entry(th.tid() as u32).or_default();
                    if let Some(n) = th.name.filter(|n| !n.is_empty()) {
                        *name = n;
                    }
                }
            }
            Some(trace_packet::Data::ProcessStats(ps)) => {
                let ts = ps.collection_end_timestamp.or(boot).unwrap_or(0);
                let ts = self.boot_to_coarse(ts);
                for pr in ps.processes {
                    let pid = pr.pid() as u32;
                    let info = self.data.processes.entry(pid).or_default();
                    info.pid = pid;
                    info.memory.push(MemorySample {
                        timestamp: ts,
                        rss_kb: pr.vm_rss_kb(),
                        hwm_kb: pr.vm_hwm_kb(),
                    });
                }
            }
            Some(trace_packet::Data::ClockSnapshot(c)) if self.clocks.is_none() => {
                let of = |id| {
                    c.clocks
                        .iter()
                        .find(|k| k.clock_id == Some(id))
                        .and_then(|k| k.timestamp)
                };
                if let (Some(b), Some(m)) =
                    (of(pf::clock::BOOTTIME), of(pf::clock::MONOTONIC_COARSE))
                {
                    self.clocks = Some((b, m));
                }
            }
            Some(trace_packet::Data::ProfilePacket(pp)) => self.profile_packet(offset, seq_id, pp),
            Some(trace_packet::Data::ModuleSymbols(m)) => self.symbols.add(m),
            Some(trace_packet::Data::PerfSample(ps)) => {
                let mut warnings = Vec::new();
                let tables = &self.seqs.entry(seq_id).or_default().tables;
                self.samples.sample(
                    (seq_id, generation),
                    tables,
                    &ps,
                    stack_ext.as_ref(),
                    &mut warnings,
                );
                for w in warnings {
                    self.warn(w);
                }
            }
            _ => {}
        }
        if let Some(e) = heap_stats {
            let heap = e.heap_name.clone().unwrap_or_else(|| "unknown".to_owned());
            let pid = e.pid.unwrap_or(0) as u32;
            let acc = self.heaps.entry((pid, heap)).or_default();
            acc.profile.exact |= e.exact.unwrap_or(false);
            for c in &e.callsites {
                let key = (seq_id, generation, c.callstack_id.unwrap_or(0));
                acc.stats.insert(key, c.to_stats());
            }
        }
    }

    /// A BOOTTIME time on MONOTONIC_COARSE (the heap dumps' clock), through
    /// the first clock snapshot; unchanged without one.
    fn boot_to_coarse(&self, boot: u64) -> u64 {
        match self.clocks {
            Some((b, m)) if boot >= b => m.saturating_add(boot - b),
            Some((b, m)) => m.saturating_sub(b - boot),
            None => boot,
        }
    }

    fn profile_packet(&mut self, offset: u64, seq_id: u32, pp: pf::ProfilePacket) {
        let seq = self.seqs.entry(seq_id).or_default();
        let index = pp.index();
        let expected = seq.last_index.map_or(0, |i| i + 1);
        seq.last_index = Some(index);
        let local = &mut seq.local;
        for s in pp.strings {
            local.strings.insert(s.iid(), s.str.unwrap_or_default());
        }
        local
            .mappings
            .extend(pp.mappings.into_iter().map(|m| (m.iid(), m)));
        local
            .frames
            .extend(pp.frames.into_iter().map(|f| (f.iid(), f)));
        local
            .callstacks
            .extend(pp.callstacks.into_iter().map(|c| (c.iid(), c.frame_ids)));
        seq.group.extend(pp.process_dumps);
        let finished = !pp.continued.unwrap_or(false);
        if index != expected {
            self.warn(format!(
                "packet at byte {offset}: ProfilePacket.index {index}, expected {expected} \
                 (packets lost?)"
            ));
        }
        if finished {
            self.finish_group(seq_id);
        }
    }

    fn finish_group(&mut self, seq_id: u32) {
        let Some(seq) = self.seqs.get_mut(&seq_id) else {
            return;
        };
        let group = std::mem::take(&mut seq.group);
        let local = std::mem::take(&mut seq.local);
        let generation = seq.generation;
        let mut warnings = Vec::new();
        let mut resolver = Resolver {
            interned: &seq.tables,
            local: &local,
            cache: FxHashMap::default(),
            pool: &mut self.pool,
            warnings: &mut warnings,
        };
        // Heap samples of the group, merged per (pid, heap): a header is
        // repeated in every continued packet. A dump with the timestamp of
        // the heap's previous one is merged into it, as trace_processor
        // (the Perfetto UI) keeps one dump per timestamp: its values are
        // the later ones.
        let mut counted: Vec<(u32, String)> = Vec::new();
        let mut merged: Vec<(u32, String)> = Vec::new();
        for d in group {
            let pid = d.pid() as u32;
            let name = d.heap_name.clone().unwrap_or_else(|| "unknown".to_owned());
            let key = (pid, name.clone());
            let acc = self.heaps.entry(key.clone()).or_default();
            let hp = &mut acc.profile;
            if !counted.contains(&key) {
                counted.push(key.clone());
                let end = d.timestamp.unwrap_or(0);
                let same =
                    d.timestamp.is_some() && hp.timeline.last().is_some_and(|p| p.timestamp == end);
                if same {
                    merged.push(key);
                } else {
                    hp.dumps += 1;
                    hp.timeline.push(DumpPoint {
                        start: d.start_timestamp.unwrap_or(end),
                        timestamp: end,
                        ..Default::default()
                    });
                }
            }
            hp.pid = pid;
            hp.heap_name = name;
            if d.sampling_interval_bytes.is_some() {
                hp.sampling_interval_bytes = d.sampling_interval_bytes();
            }
            if d.orig_sampling_interval_bytes.is_some() {
                hp.orig_sampling_interval_bytes = d.orig_sampling_interval_bytes();
            }
            let end = d.timestamp;
            let start = d.start_timestamp.or(end);
            if hp.start_timestamp.is_none() {
                hp.start_timestamp = start;
            }
            if end.is_some() {
                hp.timestamp = hp.timestamp.max(end);
            }
            hp.from_startup |= d.from_startup();
            let f = &mut hp.flags;
            f.disconnected |= d.disconnected();
            f.buffer_overran |= d.buffer_overran();
            f.buffer_corrupted |= d.buffer_corrupted();
            f.hit_guardrail |= d.hit_guardrail();
            f.rejected_concurrent |= d.rejected_concurrent();
            use profile_packet::process_heap_samples::ClientError as CE;
            match d.client_error() {
                CE::HitTimeout => f.client_error = ClientError::HitTimeout,
                CE::InvalidStackBounds => f.client_error = ClientError::InvalidStackBounds,
                CE::None => {}
            }
            if let Some(s) = &d.stats {
                hp.stats = Some(convert_stats(s));
            }
            for s in &d.samples {
                let iid = s.callstack_id();
                let key = (seq_id, generation, iid);
                let at_max = s.self_max.is_some() || s.self_max_count.is_some();
                acc.profile.dump_at_max |= at_max;
                let values = CallstackValues {
                    frames: Vec::new(),
                    context: None,
                    self_allocated: if at_max && s.self_allocated.is_none() {
                        s.self_max()
                    } else {
                        s.self_allocated()
                    },
                    self_freed: s.self_freed(),
                    alloc_count: if at_max && s.alloc_count.is_none() {
                        s.self_max_count()
                    } else {
                        s.alloc_count()
                    },
                    free_count: s.free_count(),
                    self_max: s.self_max(),
                    self_max_count: s.self_max_count(),
                    stats: None,
                };
                let new = values.counters();
                let (old, pos) = match acc.latest.get_mut(&key) {
                    Some((v, pos)) => {
                        let old = v.counters();
                        let frames = std::mem::take(&mut v.frames);
                        *v = CallstackValues { frames, ..values };
                        (old, *pos)
                    }
                    None => {
                        let frames = resolver.callstack(iid);
                        let pos = acc.order.len() as u32;
                        acc.latest
                            .insert(key, (CallstackValues { frames, ..values }, pos));
                        acc.order.push(key);
                        (Counters::default(), pos)
                    }
                };
                add_counters(&mut acc.totals, new, old);
                if let Some(point) = acc.profile.timeline.last_mut() {
                    if new != old {
                        point.changes.push((pos, new));
                    }
                    point.totals = acc.totals;
                }
            }
        }
        // A merged dump's changes: each callstack's last.
        for key in merged {
            if let Some(point) = self
                .heaps
                .get_mut(&key)
                .and_then(|a| a.profile.timeline.last_mut())
            {
                let last: FxHashMap<u32, Counters> = point.changes.iter().copied().collect();
                let mut seen = FxHashSet::default();
                point.changes.retain(|(pos, _)| seen.insert(*pos));
                for (pos, c) in &mut point.changes {
                    *c = last[pos];
                }
            }
        }
        for w in warnings {
            self.warn(w);
        }
    }

    fn finish(mut self, file_len: u64) -> TraceData {
        let seq_ids: Vec<u32> = self
            .seqs
            .iter()
            .filter(|(_, s)| !s.group.is_empty())
            .map(|(&id, _)| id)
            .collect();
        for id in seq_ids {
            self.warn(format!(
                "sequence {id}: the last heap dump was not finished (trace cut short?); \
                 its samples are included"
            ));
            self.data.truncated.get_or_insert(Truncation {
                offset: file_len,
                file_len,
                what: "the last heap dump is not finished".into(),
            });
            self.finish_group(id);
        }
        for (_, acc) in std::mem::take(&mut self.heaps) {
            let HeapAcc {
                mut profile,
                mut latest,
                order,
                mut stats,
                ..
            } = acc;
            if profile.dumps == 0 {
                continue; // statistics of a heap whose dump is missing
            }
            // Merge distinct iids that resolve to the same stack; `index`
            // maps a position in `order` to the callstack it became.
            let mut by_stack: FxHashMap<Vec<Frame>, usize> = FxHashMap::default();
            let mut index = vec![0u32; order.len()];
            for (pos, key) in order.into_iter().enumerate() {
                let Some((mut v, _)) = latest.remove(&key) else {
                    continue;
                };
                v.stats = stats.remove(&key);
                if !self.symbols.is_empty()
                    && let Some(frames) = self.symbols.apply(&v.frames, &mut self.pool)
                {
                    v.frames = frames;
                }
                match by_stack.get(&v.frames) {
                    Some(&i) => {
                        index[pos] = i as u32;
                        let c: &mut CallstackValues = &mut profile.callstacks[i];
                        c.self_allocated += v.self_allocated;
                        c.self_freed += v.self_freed;
                        c.alloc_count += v.alloc_count;
                        c.free_count += v.free_count;
                        c.self_max += v.self_max;
                        c.self_max_count += v.self_max_count;
                        match (&mut c.stats, v.stats) {
                            (Some(a), Some(b)) => a.merge(&b),
                            (a @ None, b) => *a = b,
                            _ => {}
                        }
                    }
                    None => {
                        index[pos] = profile.callstacks.len() as u32;
                        by_stack.insert(v.frames.clone(), profile.callstacks.len());
                        profile.callstacks.push(v);
                    }
                }
            }
            merge_timeline(&mut profile.timeline, &index);
            for c in &mut profile.callstacks {
                take_context_frame(c);
            }
            self.data.heaps.push(profile);
        }
        let samples = std::mem::take(&mut self.samples);
        self.data.samples = samples.finish(&self.symbols);
        self.data
    }
}

/// Takes a user context's root frame off the stack into `c.context`.
fn take_context_frame(c: &mut CallstackValues) {
    let is_context = c.frames.first().is_some_and(|f| {
        f.mapping
            .as_deref()
            .is_some_and(context::is_context_mapping)
    });
    if is_context {
        let f = c.frames.remove(0);
        c.context = Some(context::parse_context_frame(
            f.function.as_deref().unwrap_or(""),
        ));
    }
}

/// Rewrites the timeline's changes from positions to callstack indices,
/// summing the changes of merged stacks (each merged stack's value is the
/// sum of its parts' latest values).
fn merge_timeline(timeline: &mut [DumpPoint], index: &[u32]) {
    let merged = index.iter().enumerate().any(|(pos, &i)| i as usize != pos);
    let mut parts: FxHashMap<u32, Counters> = FxHashMap::default();
    for point in timeline {
        if !merged {
            continue;
        }
        let mut by_index: BTreeMap<u32, Counters> = BTreeMap::new();
        for &(pos, c) in &point.changes {
            parts.insert(pos, c);
            by_index.insert(index[pos as usize], Counters::default());
        }
        for (pos, c) in &parts {
            if let Some(sum) = by_index.get_mut(&index[*pos as usize]) {
                add_counters(sum, *c, Counters::default());
            }
        }
        point.changes = by_index.into_iter().collect();
    }
}

fn convert_stats(s: &profile_packet::ProcessStats) -> ProcessStats {
    let mut out = ProcessStats {
        unwinding_errors: s.unwinding_errors(),
        heap_samples: s.heap_samples(),
        map_reparses: s.map_reparses(),
        total_unwinding_time_us: s.total_unwinding_time_us(),
        client_spinlock_blocked_us: s.client_spinlock_blocked_us(),
        ..Default::default()
    };
    if let Some(h) = &s.unwinding_time_us {
        for (i, b) in h.buckets.iter().take(UNWIND_HISTOGRAM_BUCKETS).enumerate() {
            out.unwinding_time_us[i] = b.count();
        }
    }
    out
}

/// Largest packet accepted (trace processor's limit is similar).
const MAX_PACKET: u64 = 256 << 20;

fn read_varint(r: &mut impl Read, pos: &mut u64) -> io::Result<Option<u64>> {
    let mut v = 0u64;
    for i in 0..10 {
        let mut b = [0u8];
        if r.read(&mut b)? == 0 {
            return if i == 0 {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        *pos += 1;
        v |= u64::from(b[0] & 0x7f) << (7 * i);
        if b[0] & 0x80 == 0 {
            return Ok(Some(v));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "varint too long",
    ))
}

/// Reads a trace from `r` (a file's bytes: concatenated `Trace.packet`
/// records).
pub fn read_trace(r: impl Read) -> Result<TraceData, TraceError> {
    let mut r = io::BufReader::with_capacity(1 << 16, r);
    let mut reader = Reader::default();
    let mut pos = 0u64;
    let mut buf = Vec::new();
    let mut truncated: Option<(u64, &str)> = None;
    let malformed = |offset, what: String| TraceError::Malformed { offset, what };
    loop {
        let start = pos;
        let tag = match read_varint(&mut r, &mut pos) {
            Ok(None) => break,
            Ok(Some(t)) => t,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                reader.warn(format!("trace ends inside a packet header at byte {start}"));
                truncated = Some((start, "a packet header"));
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return Err(malformed(start, e.to_string()));
            }
            Err(e) => return Err(TraceError::Read(e)),
        };
        if start == 0 && tag == 0x1f {
            return Err(malformed(
                0,
                "this looks gzip-compressed; decompress it first (gunzip)".into(),
            ));
        }
        let (field, wire) = (tag >> 3, tag & 7);
        let len = match wire {
            2 => match read_varint(&mut r, &mut pos) {
                Ok(Some(n)) => n,
                Ok(None) | Err(_) if reader.data.packets > 0 => {
                    reader.warn(format!("trace ends inside a packet header at byte {start}"));
                    truncated = Some((start, "a packet header"));
                    break;
                }
                _ => return Err(malformed(start, "bad length".into())),
            },
            0 if field != 1 => {
                read_varint(&mut r, &mut pos).map_err(TraceError::Read)?;
                continue;
            }
            _ => {
                return Err(malformed(
                    start,
                    format!("not a Perfetto trace (field {field}, wire type {wire} at top level)"),
                ));
            }
        };
        if len > MAX_PACKET {
            return Err(malformed(
                start,
                format!("packet of {len} bytes is too large"),
            ));
        }
        buf.clear();
        let got = (&mut r)
            .take(len)
            .read_to_end(&mut buf)
            .map_err(TraceError::Read)?;
        pos += got as u64;
        if (got as u64) < len {
            reader.warn(format!(
                "trace ends with a partial packet at byte {start} ({got} of {len} bytes); \
                 it was ignored"
            ));
            truncated = Some((start, "a packet"));
            break;
        }
        if field != 1 {
            continue;
        }
        let packet = TracePacket::decode(buf.as_slice()).map_err(|e| {
            malformed(
                start,
                format!("undecodable packet #{}: {e}", reader.data.packets),
            )
        })?;
        let ext = match find_extension(&buf) {
            Some(Ok(e)) => Some(e),
            Some(Err(e)) => {
                reader.warn(format!(
                    "packet at byte {start}: undecodable heapprofd-rs extension ({e}); ignored"
                ));
                None
            }
            None => None,
        };
        reader.packet(start, packet, ext);
    }
    if reader.data.packets == 0 {
        return Err(malformed(0, "no trace packets (empty file?)".into()));
    }
    if let Some((offset, what)) = truncated {
        reader.data.truncated = Some(Truncation {
            offset,
            file_len: pos,
            what: format!("the trace ends inside {what}"),
        });
    }
    Ok(reader.finish(pos))
}
