//! The streaming trace writer (see the [module docs](super)).

use std::io::Write;

use heapprofd_proto::perfetto::{
    self as pf, Callstack, ClockSnapshot, InternedData, InternedString, Message, ProfilePacket,
    TracePacket, clock, clock_snapshot, profile_packet, trace_packet,
};

mod samples;

use super::TraceError;
use super::bits::Bits;
use super::extension::{CallsiteStatsMsg, Extension, HeapStats, append_extension};
use super::process_tree::WrittenProcesses;
use crate::profile::histogram::{UNWIND_HISTOGRAM_BUCKETS, unwind_bucket_limit};
use crate::profile::{
    CallsiteId, CallsiteTree, ClientError, FrameId, HeapState, Interner, InternerView, MappingId,
    ProcessState, Profile, StringId,
};

/// `trusted_packet_sequence_id` of every packet we write.
pub const DEFAULT_SEQUENCE_ID: u32 = 1;

/// A `ProfilePacket` (or interned-data packet) is closed once it grows past
/// this many bytes; heapprofd's `kPacketSizeThreshold`.
pub const PACKET_SIZE_THRESHOLD: usize = 400_000;

/// Readings of the clocks at one instant, in nanoseconds. Heap dump
/// timestamps are MONOTONIC_COARSE; packet timestamps are BOOTTIME. The
/// daemon reads them (the model does no system calls).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockReadings {
    /// `CLOCK_BOOTTIME`: the trace clock.
    pub boottime_ns: u64,
    /// `CLOCK_MONOTONIC_COARSE`: the clients' timestamps.
    pub monotonic_coarse_ns: u64,
    /// `CLOCK_MONOTONIC`.
    pub monotonic_ns: u64,
    /// `CLOCK_REALTIME`, for humans (wall-clock time of the trace).
    pub realtime_ns: u64,
}

impl ClockReadings {
    /// A MONOTONIC time as BOOTTIME (the stack samples' clock).
    pub fn monotonic_to_boottime(&self, mono_ns: u64) -> u64 {
        if mono_ns >= self.monotonic_ns {
            self.boottime_ns.saturating_add(mono_ns - self.monotonic_ns)
        } else {
            self.boottime_ns.saturating_sub(self.monotonic_ns - mono_ns)
        }
    }

    /// A MONOTONIC_COARSE time as BOOTTIME (same rate; they differ by the
    /// time suspended, taken from these readings).
    pub fn coarse_to_boottime(&self, coarse_ns: u64) -> u64 {
        if coarse_ns >= self.monotonic_coarse_ns {
            self.boottime_ns
                .saturating_add(coarse_ns - self.monotonic_coarse_ns)
        } else {
            self.boottime_ns
                .saturating_sub(self.monotonic_coarse_ns - coarse_ns)
        }
    }
}

/// Writer options.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Write the state at the peak of live sampled bytes (`self_max`,
    /// `self_max_count`) instead of cumulative totals. Meant for a single
    /// dump at the end (like heapprofd, don't combine with continuous dumps).
    pub dump_at_max: bool,
    /// Close packets past this size (tests use small values).
    pub packet_size_threshold: usize,
    /// `trusted_packet_sequence_id` (non-zero).
    pub sequence_id: u32,
    /// Write function names, source files and lines. Without it frames are
    /// written bare (mapping, build id and `rel_pc`, for symbolization
    /// later elsewhere), whatever names the interner holds: a profile that
    /// asked for no symbols gets none even when its process is shared with
    /// one that symbolizes. Error frames (outside any mapping) keep their
    /// names: they are not symbols.
    pub symbolize: bool,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            dump_at_max: false,
            packet_size_threshold: PACKET_SIZE_THRESHOLD,
            sequence_id: DEFAULT_SEQUENCE_ID,
            symbolize: true,
        }
    }
}

/// What one [`TraceWriter::dump`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpSummary {
    /// Trace packets.
    pub packets: u64,
    /// `ProcessHeapSamples` groups (one per process and heap).
    pub heap_dumps: u64,
    /// `HeapSample`s.
    pub samples: u64,
    /// Bytes.
    pub bytes: u64,
}

/// String roles, one bit each: a string is emitted once per table.
const FUNCTION_NAME: u8 = 1;
const MAPPING_PATH: u8 = 2;
const BUILD_ID: u8 = 4;
const SOURCE_PATH: u8 = 8;

/// Interned entries already written to the sequence.
#[derive(Debug, Default)]
struct Emitted {
    /// Names frames ([`WriterConfig::symbolize`]).
    symbolize: bool,
    strings: Vec<u8>,
    mappings: Bits,
    frames: Bits,
    callstacks: Bits,
}

/// Interned entries waiting to be written, with their approximate size.
#[derive(Debug, Default)]
struct PendingInterned {
    data: InternedData,
    size: usize,
}

impl Emitted {
    fn string(
        &mut self,
        v: &InternerView<'_>,
        id: StringId,
        role: u8,
        pending: &mut PendingInterned,
    ) {
        let i = id.get() as usize;
        if self.strings.len() <= i {
            self.strings.resize(i + 1, 0);
        }
        if self.strings[i] & role != 0 {
            return;
        }
        self.strings[i] |= role;
        let s = InternedString::new(id.iid(), v.string(id).unwrap_or_default());
        pending.size += s.encoded_len() + 4;
        let d = &mut pending.data;
        match role {
            FUNCTION_NAME => d.function_names.push(s),
            MAPPING_PATH => d.mapping_paths.push(s),
            BUILD_ID => d.build_ids.push(s),
            _ => d.source_paths.push(s),
        }
    }

    fn mapping(&mut self, v: &InternerView<'_>, id: MappingId, pending: &mut PendingInterned) {
        if self.mappings.contains(id.get()) {
            return;
        }
        let Some(m) = v.mapping(id) else { return };
        if let Some(b) = m.build_id {
            self.string(v, b, BUILD_ID, pending);
        }
        for &c in m.path.iter() {
            self.string(v, c, MAPPING_PATH, pending);
        }
        let msg = pf::Mapping {
            iid: Some(id.iid()),
            build_id: m.build_id.map(StringId::iid),
            start_offset: Some(m.start_offset),
            start: Some(m.start),
            end: Some(m.end),
            load_bias: Some(m.load_bias),
            path_string_ids: m.path.iter().map(|s| s.iid()).collect(),
            exact_offset: Some(m.exact_offset),
        };
        pending.size += msg.encoded_len() + 4;
        pending.data.mappings.push(msg);
        self.mappings.insert(id.get());
    }

    fn frame(&mut self, v: &InternerView<'_>, id: FrameId, pending: &mut PendingInterned) {
        if self.frames.contains(id.get()) {
            return;
        }
        let Some(mut f) = v.frame(id) else { return };
        if !self.symbolize && Some(f.mapping) != v.unknown_mapping() {
            (f.function, f.source_file, f.line) = (None, None, 0);
        }
        self.mapping(v, f.mapping, pending);
        if let Some(s) = f.function {
            self.string(v, s, FUNCTION_NAME, pending);
        }
        if let Some(s) = f.source_file {
            self.string(v, s, SOURCE_PATH, pending);
        }
        let msg = pf::Frame {
            iid: Some(id.iid()),
            function_name_id: f.function.map(StringId::iid),
            mapping_id: Some(f.mapping.iid()),
            rel_pc: Some(f.rel_pc),
            source_path_iid: f.source_file.map(StringId::iid),
            line_number: (f.line != 0).then_some(f.line),
            kind_field: None,
        };
        pending.size += msg.encoded_len() + 4;
        pending.data.frames.push(msg);
        self.frames.insert(id.get());
    }

    /// Queues callstack `c` and everything it needs that is not written yet.
    fn callstack(
        &mut self,
        tree: &CallsiteTree,
        interner: &Interner,
        c: CallsiteId,
        stack: &mut Vec<FrameId>,
        pending: &mut PendingInterned,
    ) {
        if self.callstacks.contains(c.get()) {
            return;
        }
        tree.stack(c, stack);
        let v = interner.read();
        let mut frame_ids = Vec::with_capacity(stack.len());
        for &f in stack.iter() {
            // A symbolized pc frame is written as its inline chain (when
            // symbols are written).
            let chain = v
                .expansion(f)
                .filter(|_| self.symbolize)
                .unwrap_or(std::slice::from_ref(&f));
            for &e in chain {
                self.frame(&v, e, pending);
                frame_ids.push(e.iid());
            }
        }
        let msg = Callstack {
            iid: Some(c.iid()),
            frame_ids,
        };
        pending.size += msg.encoded_len() + 4;
        pending.data.callstacks.push(msg);
        self.callstacks.insert(c.get());
    }
}

/// Streams a Perfetto trace to `W`, packet by packet; see the
/// [module docs](super).
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    out: W,
    cfg: WriterConfig,
    clocks: ClockReadings,
    failed: bool,
    bytes: u64,
    packets: u64,
    next_index: u64,
    emitted: Emitted,
    processes_written: WrittenProcesses,
    buf: Vec<u8>,
    stack: Vec<FrameId>,
}

impl<W: Write> TraceWriter<W> {
    /// Starts a trace: writes the packet that clears incremental state and
    /// the clock snapshot. `clocks` are readings taken together at the start.
    pub fn new(out: W, clocks: ClockReadings) -> Result<Self, TraceError> {
        Self::with_config(out, clocks, WriterConfig::default())
    }

    /// [`TraceWriter::new`] with options.
    pub fn with_config(
        out: W,
        clocks: ClockReadings,
        mut cfg: WriterConfig,
    ) -> Result<Self, TraceError> {
        cfg.sequence_id = cfg.sequence_id.max(1);
        cfg.packet_size_threshold = cfg.packet_size_threshold.max(1);
        let symbolize = cfg.symbolize;
        let mut w = TraceWriter {
            out,
            cfg,
            clocks,
            failed: false,
            bytes: 0,
            packets: 0,
            next_index: 0,
            emitted: Emitted {
                symbolize,
                ..Emitted::default()
            },
            processes_written: WrittenProcesses::default(),
            buf: Vec::new(),
            stack: Vec::new(),
        };
        let empty = |iid| InternedString::new(iid, Vec::new());
        let first = TracePacket {
            timestamp: Some(clocks.boottime_ns),
            sequence_flags: Some(pf::SEQ_INCREMENTAL_STATE_CLEARED),
            first_packet_on_sequence: Some(true),
            interned_data: Some(InternedData {
                function_names: vec![empty(0)],
                build_ids: vec![empty(0)],
                mapping_paths: vec![empty(0)],
                ..Default::default()
            }),
            data: Some(trace_packet::Data::ClockSnapshot(clock_snapshot_of(
                &clocks,
            ))),
            ..Default::default()
        };
        w.emit(first)?;
        Ok(w)
    }

    /// Bytes of complete packets written so far. After an I/O error the
    /// output may end with part of a packet: truncating it to this length
    /// leaves a clean trace.
    pub fn valid_len(&self) -> u64 {
        self.bytes
    }

    /// Packets written so far.
    pub fn packets_written(&self) -> u64 {
        self.packets
    }

    /// The clock readings of the start of the trace.
    pub fn clocks(&self) -> &ClockReadings {
        &self.clocks
    }

    fn emit(&mut self, mut packet: TracePacket) -> Result<(), TraceError> {
        if self.failed {
            return Err(TraceError::Failed);
        }
        packet.set_trusted_packet_sequence_id(self.cfg.sequence_id);
        self.buf.clear();
        pf::encode_trace_packet(&packet, &mut self.buf);
        if let Err(e) = self.out.write_all(&self.buf) {
            self.failed = true;
            return Err(e.into());
        }
        self.bytes += self.buf.len() as u64;
        self.packets += 1;
        Ok(())
    }

    /// [`Self::emit`] of a packet that also carries `ext`.
    fn emit_with_extension(
        &mut self,
        mut packet: TracePacket,
        ext: &Extension,
    ) -> Result<(), TraceError> {
        if self.failed {
            return Err(TraceError::Failed);
        }
        packet.set_trusted_packet_sequence_id(self.cfg.sequence_id);
        let mut body = packet.encode_to_vec();
        append_extension(&mut body, ext);
        self.buf.clear();
        prost_bytes_field(1, &body, &mut self.buf);
        if let Err(e) = self.out.write_all(&self.buf) {
            self.failed = true;
            return Err(e.into());
        }
        self.bytes += self.buf.len() as u64;
        self.packets += 1;
        Ok(())
    }

    /// Writes another clock snapshot (e.g. after a long session, so
    /// suspend time is accounted for).
    pub fn write_clock_snapshot(&mut self, clocks: &ClockReadings) -> Result<(), TraceError> {
        self.emit(TracePacket {
            timestamp: Some(clocks.boottime_ns),
            data: Some(trace_packet::Data::ClockSnapshot(clock_snapshot_of(clocks))),
            ..Default::default()
        })
    }

    /// Writes a `ProcessTree` with the processes of `profile` not written
    /// yet, or whose command line, parent or threads changed (pid, ppid,
    /// cmdline; each thread's tid, tgid and name), and the parents that
    /// are not profiled (see [`super::process_tree`]).
    /// [`TraceWriter::dump`] calls it.
    pub fn write_processes(&mut self, profile: &Profile) -> Result<(), TraceError> {
        let Some(tree) = self.processes_written.update(profile) else {
            return Ok(());
        };
        self.emit(TracePacket {
            timestamp: Some(self.clocks.boottime_ns),
            data: Some(trace_packet::Data::ProcessTree(tree)),
            ..Default::default()
        })
    }

    /// Writes the memory counters of processes read at `timestamp_ns`
    /// (CLOCK_MONOTONIC_COARSE) as a `ProcessStats` packet: trace processor
    /// makes counter tracks of them (`mem.rss`, ...), and their times bound
    /// the trace's time range, so the runtime writes one when a session
    /// starts.
    pub fn write_memory(
        &mut self,
        timestamp_ns: u64,
        processes: &[ProcessMemory],
    ) -> Result<(), TraceError> {
        if processes.is_empty() {
            return Ok(());
        }
        let boot = self.clocks.coarse_to_boottime(timestamp_ns);
        let kb = |v: u64| (v > 0).then_some(v);
        let stats = pf::ProcessStats {
            processes: processes
                .iter()
                .map(|m| pf::process_stats::Process {
                    pid: Some(m.pid as i32),
                    vm_size_kb: kb(m.vm_size_kb),
                    vm_rss_kb: Some(m.vm_rss_kb),
                    rss_anon_kb: kb(m.rss_anon_kb),
                    rss_file_kb: kb(m.rss_file_kb),
                    rss_shmem_kb: kb(m.rss_shmem_kb),
                    vm_swap_kb: kb(m.vm_swap_kb),
                    vm_locked_kb: None,
                    vm_hwm_kb: kb(m.vm_hwm_kb),
                })
                .collect(),
            collection_end_timestamp: Some(boot),
        };
        self.emit(TracePacket {
            timestamp: Some(boot),
            data: Some(trace_packet::Data::ProcessStats(stats)),
            ..Default::default()
        })
    }

    /// Writes one dump of every process and heap of `profile`, as of
    /// `timestamp_ns` (CLOCK_MONOTONIC_COARSE). Call at the end, on
    /// continuous-dump ticks and on SIGUSR1. Operations still waiting for
    /// earlier sequence numbers are not included (flush them first at the
    /// end of a process's stream).
    pub fn dump(
        &mut self,
        profile: &mut Profile,
        interner: &Interner,
        timestamp_ns: u64,
    ) -> Result<DumpSummary, TraceError> {
        let (bytes0, packets0) = (self.bytes, self.packets);
        self.write_processes(profile)?;
        self.write_stack_samples(profile, interner)?;
        let mut summary = DumpSummary::default();
        let (tree, processes) = profile.split_mut();
        for p in processes.values_mut() {
            // A process whose profiling started after the dump was asked
            // for is in the next one (a dump waits for sessions that were
            // in hand-over when it was asked, and so can see later ones).
            if p.session_start_ns > timestamp_ns {
                continue;
            }
            // A process's dumps have strictly increasing timestamps: two
            // dumps asked for within one tick of the coarse clock would
            // otherwise share one, and trace_processor (the Perfetto UI)
            // keeps one dump per timestamp.
            let at = p
                .heaps
                .values()
                .filter_map(HeapState::last_dump_timestamp)
                .max()
                .map_or(timestamp_ns, |last| timestamp_ns.max(last + 1));
            let cx = DumpCx {
                tree,
                interner,
                pid: p.pid,
                session_start: p.session_start_ns,
                base: heap_header_base(p),
            };
            for heap in p.heaps.values_mut() {
                summary.samples += self.dump_heap(&cx, heap, at)?;
                summary.heap_dumps += 1;
            }
        }
        summary.bytes = self.bytes - bytes0;
        summary.packets = self.packets - packets0;
        Ok(summary)
    }

    fn dump_heap(
        &mut self,
        cx: &DumpCx<'_>,
        heap: &mut HeapState,
        now: u64,
    ) -> Result<u64, TraceError> {
        let (tree, interner, pid) = (cx.tree, cx.interner, cx.pid);
        let at_max = self.cfg.dump_at_max;
        // The first window starts when profiling of the process started
        // (not at its first sample), so the timeline shows all of it.
        let first = match (cx.session_start, heap.first_timestamp()) {
            (0, f) => f,
            (s, Some(f)) => Some(s.min(f)),
            (s, None) => Some(s),
        };
        let (start, end) = if at_max {
            let end = if heap.max_timestamp() > 0 {
                heap.max_timestamp()
            } else {
                now
            };
            // (The peak of a heap that did not move since its last dump:
            // stamped just after it, see `dump`.)
            let end = heap.last_dump_timestamp().map_or(end, |l| end.max(l + 1));
            (first.unwrap_or(end).min(end), end)
        } else {
            let start = heap.last_dump_timestamp().or(first).unwrap_or(now);
            (start.min(now), now)
        };
        let mut header = cx.base.clone();
        header.pid = Some(u64::from(pid));
        header.heap_name = Some(heap.name.clone());
        // The interval the heap was last sampled at, or the largest its
        // client raised it to under load (heapprofd's field for both).
        header.sampling_interval_bytes = Some(heap.sampling_interval.max(heap.raised.max_interval));
        header.orig_sampling_interval_bytes = Some(heap.orig_sampling_interval);
        header.timestamp = Some(end);
        header.start_timestamp = Some(start);
        let boot = self.clocks.coarse_to_boottime(end);
        let header_len = header.encoded_len() + 8;
        let threshold = self.cfg.packet_size_threshold;

        let mut pending = PendingInterned::default();
        let mut extras: Vec<CallsiteStatsMsg> = Vec::new();
        let mut samples: Vec<profile_packet::HeapSample> = Vec::new();
        let mut size = header_len;
        let mut count = 0;
        let mut stack = std::mem::take(&mut self.stack);
        for i in 0..heap.callsites().len() {
            let t = &heap.callsites()[i];
            let sample = if at_max {
                let (bytes, n) = heap.max_of(t);
                if bytes == 0 && n == 0 {
                    continue;
                }
                profile_packet::HeapSample {
                    callstack_id: Some(t.callsite.iid()),
                    self_max: Some(bytes),
                    self_max_count: Some(n),
                    ..Default::default()
                }
            } else {
                if !t.needs_dump() {
                    continue;
                }
                profile_packet::HeapSample {
                    callstack_id: Some(t.callsite.iid()),
                    self_allocated: Some(t.allocated),
                    self_freed: Some(t.freed),
                    alloc_count: Some(t.alloc_count),
                    free_count: Some(t.free_count),
                    ..Default::default()
                }
            };
            let callsite = t.callsite;
            if !t.stats.is_empty() {
                extras.push(CallsiteStatsMsg::from_stats(callsite.iid(), &t.stats));
            }
            if !at_max {
                heap.callsites_mut()[i].mark_dumped();
            }
            self.emitted
                .callstack(tree, interner, callsite, &mut stack, &mut pending);
            size += sample.encoded_len() + 4;
            samples.push(sample);
            count += 1;
            if pending.size >= threshold {
                self.flush_interned(&mut pending, boot)?;
            }
            if size >= threshold {
                self.flush_interned(&mut pending, boot)?;
                self.profile_packet(&header, std::mem::take(&mut samples), true, boot)?;
                size = header_len;
            }
        }
        self.stack = stack;
        self.flush_interned(&mut pending, boot)?;
        if !samples.is_empty() || size == header_len {
            // The last samples, or the header alone when there were none.
            self.profile_packet(&header, samples, true, boot)?;
        }
        // The empty packet that ends the group (heapprofd's layout).
        self.profile_packet_raw(ProfilePacket::default(), boot)?;
        let exact = heap.sampling_interval == 1;
        self.write_extension(pid, &heap.name, end, exact, extras, boot)?;
        heap.last_dump_timestamp = Some(end.max(heap.last_dump_timestamp.unwrap_or(0)));
        Ok(count)
    }

    /// Writes the dump's per-callsite statistics as extension packets (see
    /// [`super::extension`]), split like the samples.
    fn write_extension(
        &mut self,
        pid: u32,
        heap_name: &str,
        timestamp: u64,
        exact: bool,
        callsites: Vec<CallsiteStatsMsg>,
        boot: u64,
    ) -> Result<(), TraceError> {
        let threshold = self.cfg.packet_size_threshold;
        let mut rest = callsites.into_iter().peekable();
        while rest.peek().is_some() {
            let mut chunk = Vec::new();
            let mut size = 0;
            for c in rest.by_ref() {
                size += c.encoded_len() + 4;
                chunk.push(c);
                if size >= threshold {
                    break;
                }
            }
            let ext = Extension {
                heap_stats: Some(HeapStats {
                    pid: Some(u64::from(pid)),
                    heap_name: Some(heap_name.to_owned()),
                    timestamp: Some(timestamp),
                    exact: Some(exact),
                    callsites: chunk,
                }),
                ..Extension::default()
            };
            self.emit_with_extension(
                TracePacket {
                    timestamp: Some(boot),
                    ..Default::default()
                },
                &ext,
            )?;
        }
        Ok(())
    }

    fn flush_interned(&mut self, p: &mut PendingInterned, boot: u64) -> Result<(), TraceError> {
        if p.size == 0 {
            return Ok(());
        }
        let data = std::mem::take(&mut p.data);
        p.size = 0;
        self.emit(TracePacket {
            timestamp: Some(boot),
            interned_data: Some(data),
            ..Default::default()
        })
    }

    fn profile_packet(
        &mut self,
        header: &profile_packet::ProcessHeapSamples,
        samples: Vec<profile_packet::HeapSample>,
        continued: bool,
        boot: u64,
    ) -> Result<(), TraceError> {
        let mut dump = header.clone();
        dump.samples = samples;
        self.profile_packet_raw(
            ProfilePacket {
                process_dumps: vec![dump],
                continued: continued.then_some(true),
                ..Default::default()
            },
            boot,
        )
    }

    fn profile_packet_raw(&mut self, mut pp: ProfilePacket, boot: u64) -> Result<(), TraceError> {
        pp.index = Some(self.next_index);
        self.next_index += 1;
        self.emit(TracePacket {
            timestamp: Some(boot),
            data: Some(trace_packet::Data::ProfilePacket(pp)),
            ..Default::default()
        })
    }

    /// Flushes the output and returns it.
    pub fn finish(mut self) -> Result<W, TraceError> {
        if self.failed {
            return Err(TraceError::Failed);
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

/// What dumping the heaps of one process needs.
struct DumpCx<'a> {
    tree: &'a CallsiteTree,
    interner: &'a Interner,
    pid: u32,
    session_start: u64,
    base: profile_packet::ProcessHeapSamples,
}

/// Memory counters of one process (kB, from `/proc/PID/status`; 0 = not
/// known), for [`TraceWriter::write_memory`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessMemory {
    /// Process id.
    pub pid: u32,
    /// VmSize.
    pub vm_size_kb: u64,
    /// VmRSS.
    pub vm_rss_kb: u64,
    /// RssAnon.
    pub rss_anon_kb: u64,
    /// RssFile.
    pub rss_file_kb: u64,
    /// RssShmem.
    pub rss_shmem_kb: u64,
    /// VmSwap.
    pub vm_swap_kb: u64,
    /// VmHWM (peak RSS).
    pub vm_hwm_kb: u64,
}

/// Appends a length-delimited field `field` holding `bytes`.
fn prost_bytes_field(field: u32, bytes: &[u8], buf: &mut Vec<u8>) {
    use heapprofd_proto::perfetto::prost::encoding::{WireType, encode_key, encode_varint};
    encode_key(field, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.extend_from_slice(bytes);
}

fn clock_snapshot_of(c: &ClockReadings) -> ClockSnapshot {
    let clk = |id, ts| clock_snapshot::Clock {
        clock_id: Some(id),
        timestamp: Some(ts),
        ..Default::default()
    };
    ClockSnapshot {
        clocks: vec![
            clk(clock::BOOTTIME, c.boottime_ns),
            clk(clock::MONOTONIC_COARSE, c.monotonic_coarse_ns),
            clk(clock::MONOTONIC, c.monotonic_ns),
            clk(clock::REALTIME, c.realtime_ns),
        ],
        primary_trace_clock: None,
    }
}

/// The per-process part of a `ProcessHeapSamples`: identity, stats, flags.
fn heap_header_base(p: &ProcessState) -> profile_packet::ProcessHeapSamples {
    use profile_packet::{Histogram, ProcessHeapSamples, ProcessStats, histogram};
    let s = &p.stats;
    let f = &p.flags;
    let buckets = (0..UNWIND_HISTOGRAM_BUCKETS)
        .map(|i| histogram::Bucket {
            upper_limit: unwind_bucket_limit(i),
            max_bucket: unwind_bucket_limit(i).is_none().then_some(true),
            count: Some(s.unwinding_time_us[i]),
        })
        .collect();
    let flag = |b: bool| b.then_some(true);
    let client_error = match f.client_error {
        ClientError::None => None,
        ClientError::HitTimeout => {
            Some(profile_packet::process_heap_samples::ClientError::HitTimeout as i32)
        }
        ClientError::InvalidStackBounds => {
            Some(profile_packet::process_heap_samples::ClientError::InvalidStackBounds as i32)
        }
    };
    ProcessHeapSamples {
        pid: Some(u64::from(p.pid)),
        from_startup: Some(p.from_startup),
        rejected_concurrent: flag(f.rejected_concurrent),
        stats: Some(ProcessStats {
            unwinding_errors: Some(s.unwinding_errors),
            heap_samples: Some(s.heap_samples),
            map_reparses: Some(s.map_reparses),
            unwinding_time_us: Some(Histogram { buckets }),
            total_unwinding_time_us: Some(s.total_unwinding_time_us),
            client_spinlock_blocked_us: Some(s.client_spinlock_blocked_us),
        }),
        disconnected: flag(f.disconnected),
        buffer_overran: flag(f.buffer_overran),
        buffer_corrupted: flag(f.buffer_corrupted),
        hit_guardrail: flag(f.hit_guardrail),
        client_error,
        ..Default::default()
    }
}
