//! The bookkeeping thread: owns the [`Profile`] and the [`TraceWriter`].
//!
//! It applies the workers' batches in arrival order (the profile itself
//! commits operations in sequence order), keeps the status-line counters
//! fresh, dumps on request, and at the end flushes every process, writes the
//! final dump and closes the trace. A write error (disk full) stops further
//! writing; the file is cut back to the last complete packet so what was
//! written stays a valid trace, and the error is reported.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use heapprofd_proto::wire::HEAP_LIBC_MALLOC_NAME;
use heapprofd_shmem::ClientError as RingClientError;

use super::symbolize::Symbolizer;
use super::{BookMsg, Counters, Op, SessionId, SessionStats};
use crate::cli::human_bytes;
use heapprofd_model::profile::{Alloc, CallsiteId, ClientError, Interner, Profile};
use heapprofd_model::trace::{TraceWriter, WriterConfig};

/// What the bookkeeping thread needs to know.
#[derive(Debug)]
pub struct BookkeeperOptions {
    /// The trace file (already created).
    pub output: File,
    /// Its path, for messages and error recovery.
    pub output_path: PathBuf,
    /// Sampling interval of the default heap.
    pub interval: u64,
    /// Write the state at the peak instead of at the end.
    pub dump_at_max: bool,
}

impl Clone for BookkeeperOptions {
    fn clone(&self) -> Self {
        BookkeeperOptions {
            output: self
                .output
                .try_clone()
                .expect("duplicating the trace file descriptor"),
            output_path: self.output_path.clone(),
            interval: self.interval,
            dump_at_max: self.dump_at_max,
        }
    }
}

/// One process in the [`Summary`].
#[derive(Debug, Clone, Default)]
pub struct ProcessSummary {
    /// Process id.
    pub pid: u32,
    /// Command line.
    pub cmdline: Vec<String>,
    /// Malloc samples unwound.
    pub samples: u64,
    /// Estimated bytes allocated (sum of sample sizes).
    pub allocated: u64,
    /// Estimated bytes freed.
    pub freed: u64,
    /// Unwinds that ended in an error.
    pub unwind_errors: u64,
    /// Records the client dropped (buffer full).
    pub dropped: u64,
    /// Anything that makes this process's profile incomplete.
    pub warnings: Vec<String>,
}

/// What `record` prints at the end.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// The trace file.
    pub output_path: PathBuf,
    /// Bytes written to it.
    pub trace_bytes: u64,
    /// Profiled processes.
    pub processes: Vec<ProcessSummary>,
    /// Sampling interval.
    pub interval: u64,
    /// The summary was already shown (record keeps waiting for CMD).
    pub already_printed: bool,
}

impl Summary {
    /// Human-readable text for the end of `record`.
    pub fn render(&self, output: &Path) -> String {
        let mut s = String::new();
        let total = |f: fn(&ProcessSummary) -> u64| self.processes.iter().map(f).sum::<u64>();
        let samples = total(|p| p.samples);
        let (alloc, freed) = (total(|p| p.allocated), total(|p| p.freed));
        let every = if self.interval == 1 {
            "every allocation".to_string()
        } else {
            format!("sampling every {} on average", human_bytes(self.interval))
        };
        s.push_str(&format!(
            "heapprofd-rs: {} process{}, {samples} samples ({every}): allocated {}, freed {}, unreleased {}\n",
            self.processes.len(),
            if self.processes.len() == 1 { "" } else { "es" },
            human_bytes(alloc),
            human_bytes(freed),
            human_bytes(alloc.saturating_sub(freed)),
        ));
        for p in &self.processes {
            let cmd = if p.cmdline.is_empty() {
                "?".to_string()
            } else {
                p.cmdline.join(" ")
            };
            let cmd: String = cmd.chars().take(70).collect();
            s.push_str(&format!(
                "  pid {:<7} {:>8} samples  allocated {:>10}  unreleased {:>10}  {cmd}\n",
                p.pid,
                p.samples,
                human_bytes(p.allocated),
                human_bytes(p.allocated.saturating_sub(p.freed)),
            ));
            for w in &p.warnings {
                s.push_str(&format!("    warning: {w}\n"));
            }
        }
        if self.processes.is_empty() {
            s.push_str(
                "  no process connected: did the command allocate at all, and is it dynamically \
                 linked (static binaries cannot be preloaded)?\n",
            );
        }
        s.push_str(&format!(
            "trace: {} ({}). Open it in https://ui.perfetto.dev or run: heapprofd-rs report {}",
            output.display(),
            human_bytes(self.trace_bytes),
            output.display()
        ));
        s
    }
}

struct Book {
    profile: Profile,
    interner: Arc<Interner>,
    symbolizer: Arc<Symbolizer>,
    // Unbuffered: the writer does one write per packet, so errors surface at
    // once and `valid_len` is exact.
    writer: Option<TraceWriter<File>>,
    write_error: Option<String>,
    options: BookkeeperOptions,
    counters: Arc<Counters>,
    sessions: HashMap<SessionId, (u32, SessionStats)>,
    /// Per session: its worker's stack ids -> callsites (see
    /// [`super::stacks`]).
    stacks: HashMap<SessionId, Vec<Option<CallsiteId>>>,
    ended: Vec<(u32, SessionStats)>,
    /// Messages of sessions held back behind an older session of their pid.
    deferred: HashMap<SessionId, Vec<BookMsg>>,
    last_live_update: Instant,
}

/// Runs the bookkeeping thread until [`BookMsg::Finish`].
pub fn run(
    rx: Receiver<BookMsg>,
    interner: Arc<Interner>,
    symbolizer: Arc<Symbolizer>,
    counters: Arc<Counters>,
    options: BookkeeperOptions,
) {
    let clocks = super::clock::read_clocks();
    let file = match options.output.try_clone() {
        Ok(f) => f,
        Err(e) => {
            drain_until_finish(rx, format!("cannot use the trace file: {e}"));
            return;
        }
    };
    let config = WriterConfig {
        dump_at_max: options.dump_at_max,
        ..WriterConfig::default()
    };
    let (writer, write_error) = match TraceWriter::with_config(file, clocks, config) {
        Ok(w) => (Some(w), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut book = Book {
        profile: Profile::new(&interner),
        interner,
        symbolizer,
        writer,
        write_error,
        options,
        counters,
        sessions: HashMap::new(),
        stacks: HashMap::new(),
        ended: Vec::new(),
        deferred: HashMap::new(),
        last_live_update: Instant::now(),
    };
    while let Ok(msg) = rx.recv() {
        if let BookMsg::Finish(reply) = msg {
            // Sessions still waiting behind an older one of the same pid
            // (their predecessor never ended) are applied now.
            let waiting: Vec<BookMsg> = book.deferred.drain().flat_map(|(_, m)| m).collect();
            for m in waiting {
                book.handle(m);
            }
            let _ = reply.send(book.finish());
            return;
        }
        book.handle(msg);
    }
}

fn drain_until_finish(rx: Receiver<BookMsg>, error: String) {
    while let Ok(msg) = rx.recv() {
        if let BookMsg::Finish(reply) = msg {
            let _ = reply.send(Err(anyhow!(error)));
            return;
        }
    }
}

impl Book {
    /// Applies one message. A session whose pid still has an older session
    /// being drained (the process called exec: the new image connected
    /// before the old image's records were all read) is held back until the
    /// older one ends, so the two sequence-number spaces never mix.
    fn handle(&mut self, msg: BookMsg) {
        let id = match &msg {
            BookMsg::ProcessStarted { id, .. }
            | BookMsg::Ops { id, .. }
            | BookMsg::ProcessEnded { id, .. } => *id,
            BookMsg::Dump | BookMsg::Finish(_) => 0,
        };
        if let Some(queue) = self.deferred.get_mut(&id) {
            queue.push(msg);
            return;
        }
        match msg {
            BookMsg::ProcessStarted {
                id,
                pid,
                cmdline,
                from_startup,
            } => {
                if self.sessions.values().any(|(p, _)| *p == pid) {
                    self.deferred.insert(
                        id,
                        vec![BookMsg::ProcessStarted {
                            id,
                            pid,
                            cmdline,
                            from_startup,
                        }],
                    );
                    return;
                }
                // A pid we already know: the process called exec (its old
                // image's session has ended) or the pid was reused.
                self.profile.new_session(pid);
                self.profile.add_process(pid, cmdline, from_startup);
                self.profile
                    .set_heap(pid, 0, Some(HEAP_LIBC_MALLOC_NAME), self.options.interval);
                self.sessions.insert(id, (pid, SessionStats::default()));
            }
            BookMsg::Ops { id, ops, stats } => {
                let pid = self.sessions.get(&id).map(|s| s.0);
                if let Some(pid) = pid {
                    self.apply(id, pid, ops);
                    self.set_stats(id, pid, stats);
                }
                self.refresh_counters(false);
            }
            BookMsg::ProcessEnded {
                id,
                pid,
                stats,
                end,
            } => {
                self.set_stats(id, pid, stats.clone());
                if let Some(p) = self.profile.process_mut(pid) {
                    p.flags.disconnected |= end.disconnected;
                }
                self.profile.flush(pid);
                self.sessions.remove(&id);
                self.stacks.remove(&id);
                self.ended.push((pid, stats));
                self.refresh_counters(true);
                // Release the next session of this pid, if one was waiting.
                let next = self
                    .deferred
                    .iter()
                    .find(|(_, q)| matches!(q.first(), Some(BookMsg::ProcessStarted { pid: p, .. }) if *p == pid))
                    .map(|(&id, _)| id);
                if let Some(next) = next.and_then(|n| self.deferred.remove(&n)) {
                    for m in next {
                        self.handle(m);
                    }
                }
            }
            BookMsg::Dump => self.dump(),
            BookMsg::Finish(_) => {}
        }
    }

    fn apply(&mut self, id: SessionId, pid: u32, ops: Vec<Op>) {
        let stacks = self.stacks.entry(id).or_default();
        for op in ops {
            match op {
                Op::Stack { id, frames } => {
                    let callsite = self.profile.intern_callsite(&frames);
                    let i = id as usize;
                    if stacks.len() <= i {
                        stacks.resize(i + 1, None);
                    }
                    stacks[i] = Some(callsite);
                }
                Op::Malloc {
                    heap,
                    seq,
                    address,
                    sample_size,
                    timestamp_ns,
                    stack,
                } => {
                    // Every id is defined before use; an undefined one
                    // would be a worker bug, kept visible as an empty stack.
                    let callsite = match stacks.get(stack as usize) {
                        Some(&Some(c)) => c,
                        _ => self.profile.intern_callsite(&[]),
                    };
                    let alloc = Alloc {
                        heap,
                        seq,
                        address,
                        sample_size,
                        timestamp_ns,
                    };
                    self.profile.malloc_at(pid, alloc, callsite)
                }
                Op::Free { heap, seq, address } => self.profile.free(pid, heap, seq, address),
                Op::HeapName {
                    heap,
                    name,
                    interval,
                } => {
                    let name = (!name.is_empty()).then_some(name.as_str());
                    self.profile.set_heap(pid, heap, name, interval)
                }
            }
        }
    }

    fn set_stats(&mut self, id: SessionId, pid: u32, s: SessionStats) {
        if let Some(p) = self.profile.process_mut(pid) {
            p.stats.unwinding_errors = s.unwinding_errors;
            p.stats.heap_samples = s.heap_samples;
            p.stats.map_reparses = s.map_reparses;
            p.stats.unwinding_time_us = s.unwinding_time_us.clone();
            p.stats.total_unwinding_time_us = s.total_unwinding_time_us;
            p.stats.client_spinlock_blocked_us = s.ring.blocked_us;
            let f = &mut p.flags;
            f.buffer_overran |=
                s.ring.writes_overflow > 0 || s.client_error == RingClientError::HitTimeout;
            f.buffer_corrupted |= s.ring_corrupt
                || s.corrupt_records > 0
                || s.ring.writes_corrupt > 0
                || s.ring.reads_corrupt > 0;
            f.client_error = match s.client_error {
                RingClientError::None => f.client_error,
                RingClientError::HitTimeout => ClientError::HitTimeout,
                RingClientError::InvalidStackBounds => ClientError::InvalidStackBounds,
            };
        }
        if let Some(entry) = self.sessions.get_mut(&id) {
            entry.1 = s;
        }
    }

    fn refresh_counters(&mut self, force: bool) {
        if !force && self.last_live_update.elapsed() < Duration::from_millis(200) {
            return;
        }
        self.last_live_update = Instant::now();
        let live: u64 = self.profile.processes().map(|p| p.live_bytes()).sum();
        self.counters.live_bytes.store(live, Ordering::Relaxed);
        let dropped: u64 = self
            .sessions
            .values()
            .map(|(_, s)| s.ring.writes_overflow)
            .chain(self.ended.iter().map(|(_, s)| s.ring.writes_overflow))
            .sum();
        self.counters.dropped.store(dropped, Ordering::Relaxed);
    }

    fn dump(&mut self) {
        // Names for every frame the workers have seen, before any stack
        // that contains them is written.
        self.symbolizer.resolve_pending(&self.interner);
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let now = super::clock::read_clocks().monotonic_coarse_ns;
        if let Err(e) = w.dump(&mut self.profile, &self.interner, now) {
            self.fail(e.to_string());
        }
    }

    fn fail(&mut self, error: String) {
        if let Some(w) = self.writer.take() {
            let valid = w.valid_len();
            // Cut a partly written packet so the file stays a valid trace.
            if let Ok(f) = std::fs::OpenOptions::new()
                .write(true)
                .open(&self.options.output_path)
            {
                let _ = f.set_len(valid);
            }
        }
        self.write_error.get_or_insert(error);
    }

    fn finish(mut self) -> anyhow::Result<Summary> {
        self.profile.flush_all();
        self.dump();
        let mut trace_bytes = 0;
        if let Some(w) = self.writer.take() {
            trace_bytes = w.valid_len();
            if let Err(e) = w.finish() {
                self.writer = None;
                self.write_error.get_or_insert(e.to_string());
            }
        }
        if let Some(e) = self.write_error {
            let len = std::fs::metadata(&self.options.output_path)
                .map(|m| m.len())
                .unwrap_or(0);
            return Err(anyhow!(
                "{e}; the first {} of {} are a valid trace with the data written before the failure",
                human_bytes(len),
                self.options.output_path.display()
            ));
        }
        let dropped_by_pid: HashMap<u32, u64> = self
            .ended
            .iter()
            .chain(self.sessions.values())
            .map(|(pid, s)| (*pid, s.ring.writes_overflow))
            .fold(HashMap::new(), |mut m, (pid, d)| {
                *m.entry(pid).or_default() += d;
                m
            });
        let processes = self
            .profile
            .processes()
            .map(|p| {
                let (mut allocated, mut freed) = (0, 0);
                for h in p.heaps() {
                    for c in h.callsites() {
                        allocated += c.allocated;
                        freed += c.freed;
                    }
                }
                let dropped = dropped_by_pid.get(&p.pid).copied().unwrap_or(0);
                let mut warnings = Vec::new();
                if dropped > 0 {
                    warnings.push(format!(
                        "{dropped} samples dropped because the ring buffer was full \
                         (use a larger --shmem-size or a larger --interval)"
                    ));
                }
                if p.flags.client_error == ClientError::HitTimeout {
                    warnings.push(
                        "the program waited longer than the --block-client timeout; its profile ended early"
                            .into(),
                    );
                }
                if p.flags.buffer_corrupted {
                    warnings.push("its ring buffer was corrupt; some records were lost".into());
                }
                if p.stats.heap_samples > 0 && p.stats.unwinding_errors * 10 > p.stats.heap_samples {
                    warnings.push(format!(
                        "{} of {} stacks could not be fully unwound",
                        p.stats.unwinding_errors, p.stats.heap_samples
                    ));
                }
                ProcessSummary {
                    pid: p.pid,
                    cmdline: p.cmdline.clone(),
                    samples: p.stats.heap_samples,
                    allocated,
                    freed,
                    unwind_errors: p.stats.unwinding_errors,
                    dropped,
                    warnings,
                }
            })
            .collect();
        Ok(Summary {
            output_path: self.options.output_path.clone(),
            trace_bytes,
            processes,
            interval: self.options.interval,
            already_printed: false,
        })
    }
}
