//! One profile's bookkeeping and trace ([`Book`]), what a bookkeeping
//! thread runs (`record`'s, [`super::book_thread`]; one per profile in the
//! service's, [`super::service_book`]): a thin adapter that runs the model's
//! [`Bookkeeping`] and a [`TraceWriter`] over the trace file.
//!
//! It hands each session event to the bookkeeping (which holds back a new
//! image's session behind the old one after an exec, and applies the
//! workers' batches), keeps the status-line counters fresh, symbolizes
//! queued frames and dumps on request, and at the end writes the final
//! dump and closes the trace. A write error (disk full) stops further
//! writing; the file is cut back to the last complete packet so what was
//! written stays a valid trace, and the error is reported.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use heapprofd_model::bookkeeping::Bookkeeping;
use heapprofd_model::messages::SessionEvent;
use heapprofd_model::profile::Interner;
use heapprofd_model::trace::{ProcessMemory, TraceWriter, WriterConfig};

use super::clock::read_clocks;
use super::counters::Counters;
use super::procinfo;
use super::retirement::Retirement;
use super::summary::Summary;
use super::symbolize::Symbolizer;
use heapprofd_report::human_bytes;

/// What the bookkeeping thread needs to know.
#[derive(Debug)]
pub struct BookkeeperOptions {
    /// The trace file (already created).
    pub output: File,
    /// Its path, for messages.
    pub output_path: PathBuf,
    /// Sampling interval of the default heap.
    pub interval: u64,
    /// Write the state at the peak instead of at the end.
    pub dump_at_max: bool,
    /// This profile alone uses the interner (`record`; not the service,
    /// whose profiles share one): its retirement passes also retire
    /// interned frames, mappings and strings nothing refers to.
    pub owns_interner: bool,
    /// Write function names (else frames stay bare: build ids and
    /// addresses, [`WriterConfig::symbolize`]).
    pub symbolize: bool,
}

/// The shared objects the bookkeeping thread works with.
#[derive(Debug, Clone)]
pub struct BookkeeperShared {
    /// Frames interned by the workers.
    pub interner: Arc<Interner>,
    /// Frames waiting for names.
    pub symbolizer: Arc<Symbolizer>,
    /// The status line's counters.
    pub counters: Arc<Counters>,
}

/// One profile's bookkeeping and trace: what the bookkeeping thread runs
/// (one for `record`, one per profile in the service).
#[derive(Debug)]
pub struct Book {
    book: Bookkeeping,
    shared: BookkeeperShared,
    // Unbuffered: the writer does one write per packet, so errors surface at
    // once and `valid_len` is exact.
    writer: Option<TraceWriter<File>>,
    write_error: Option<String>,
    options: BookkeeperOptions,
    last_live_update: Instant,
    /// When dumps retire idle callsites and interned entries.
    retirement: Retirement,
    /// Told once the final dump's frames are named ([`Self::finish_telling`]).
    named: Option<Sender<()>>,
}

impl Book {
    /// Starts the trace on `options.output`; why not, in words.
    pub fn open(shared: BookkeeperShared, options: BookkeeperOptions) -> Result<Book, String> {
        // `record` opens the file without cutting an earlier trace (see
        // `setup::daemon_options`): cut here, before anything is written.
        if options
            .output
            .metadata()
            .is_ok_and(|m| m.is_file() && m.len() > 0)
        {
            options
                .output
                .set_len(0)
                .map_err(|e| format!("cannot empty the trace file: {e}"))?;
        }
        let clocks = read_clocks();
        let file = options
            .output
            .try_clone()
            .map_err(|e| format!("cannot use the trace file: {e}"))?;
        let config = WriterConfig {
            dump_at_max: options.dump_at_max,
            symbolize: options.symbolize,
            ..WriterConfig::default()
        };
        let (writer, write_error) = match TraceWriter::with_config(file, clocks, config) {
            Ok(w) => (Some(w), None),
            Err(e) => (None, Some(e.to_string())),
        };
        Ok(Book {
            book: Bookkeeping::new(&shared.interner, options.interval),
            shared,
            writer,
            write_error,
            retirement: Retirement::new(options.owns_interner),
            options,
            last_live_update: Instant::now(),
            named: None,
        })
    }

    /// Applies one session event (see [`Bookkeeping::handle`]).
    pub fn handle(&mut self, mut event: SessionEvent) {
        self.retirement
            .check_frames(&mut event, &self.shared.interner);
        let (force, started) = match &event {
            SessionEvent::Started {
                pid,
                started_ns,
                memory,
                ..
            } => (None, Some((*pid, *started_ns, *memory))),
            SessionEvent::Ops { .. } => (Some(false), None),
            SessionEvent::Ended { .. } | SessionEvent::Unprofilable { .. } => (Some(true), None),
        };
        if self.book.handle(event) {
            if let Some(force) = force {
                self.name_new_threads();
                self.refresh_counters(force);
            }
            if let Some((pid, started_ns, memory)) = started {
                self.read_process(pid, started_ns, memory);
            }
        }
    }

    /// The bookkeeping (its profile, to flag a process).
    pub fn bookkeeping_mut(&mut self) -> &mut Bookkeeping {
        &mut self.book
    }

    fn refresh_counters(&mut self, force: bool) {
        if !force && self.last_live_update.elapsed() < Duration::from_millis(200) {
            return;
        }
        self.last_live_update = Instant::now();
        let c = &self.shared.counters;
        c.live_bytes
            .store(self.book.live_bytes(), Ordering::Relaxed);
        c.dropped
            .store(self.book.dropped_records(), Ordering::Relaxed);
    }

    /// Threads and memory of a process whose session just started (its
    /// parent and first threads came with the event, read at the
    /// handshake). The memory counters read at the handshake are written
    /// at the session's start, which is the start of the process's first
    /// window: the trace's time range (bounded by counters and dumps,
    /// not by windows) then covers the window. Read now (a test's event
    /// has none), they are still stamped with the start.
    /// The threads are listed again only if the handshake named none: by
    /// now the client's own thread may run, and listing it would leave
    /// entries under `/proc/PID/task` that slow the process's reaping (see
    /// [`procinfo`]); threads that sample are named when they do.
    fn read_process(&mut self, pid: u32, started_ns: u64, memory: Option<ProcessMemory>) {
        let named = self
            .book
            .profile_mut()
            .process_mut(pid)
            .is_some_and(|p| p.identity.threads.values().any(|n| !n.is_empty()));
        if !named {
            let threads = procinfo::read_threads(pid);
            if let Some(p) = self.book.profile_mut().process_mut(pid) {
                for (tid, name) in threads {
                    p.set_thread_name(tid, name);
                }
            }
        }
        let at = (started_ns > 0).then_some(started_ns);
        let mem: Vec<_> = memory
            .or_else(|| procinfo::read_memory(pid))
            .into_iter()
            .collect();
        self.write_memory_at(at, &mem);
    }

    /// Names the threads that samples named first (while they still exist).
    fn name_new_threads(&mut self) {
        for (pid, tid) in self.book.profile_mut().take_unnamed_threads() {
            if let Some(name) = procinfo::read_thread_name(pid, tid)
                && let Some(p) = self.book.profile_mut().process_mut(pid)
            {
                p.set_thread_name(tid, name);
            }
        }
    }

    /// Memory counters of `pids` (those still alive) into the trace.
    fn write_memory(&mut self, pids: &[u32]) {
        let mem: Vec<_> = pids
            .iter()
            .filter_map(|&p| procinfo::read_memory(p))
            .collect();
        self.write_memory_at(None, &mem);
    }

    /// Memory counters into the trace, stamped `at` (MONOTONIC_COARSE ns;
    /// `None`: now).
    fn write_memory_at(&mut self, at: Option<u64>, mem: &[ProcessMemory]) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let at = at.unwrap_or_else(|| read_clocks().monotonic_coarse_ns);
        if let Err(e) = w.write_memory(at, mem) {
            self.fail(e.to_string());
        }
    }

    /// Writes a dump of every process now.
    pub fn dump(&mut self) {
        self.dump_at(read_clocks().monotonic_coarse_ns);
    }

    /// Writes a dump of every process, stamped `asked_ns` (MONOTONIC_COARSE):
    /// when it was asked for, not when this thread got to it, so that the
    /// dumps of a `--continuous-dump` trace keep their spacing (and their
    /// allocation rates) when the thread falls behind.
    pub fn dump_at(&mut self, asked_ns: u64) {
        if self.write_dump(asked_ns) {
            self.retire_idle();
        }
    }

    /// [`Book::dump_at`] without the retirement; whether the dump was
    /// written.
    fn write_dump(&mut self, asked_ns: u64) -> bool {
        // The live processes' threads and memory as of this dump.
        let live = self.book.active_pids();
        let mut alive_threads: Vec<(u32, rustc_hash::FxHashSet<u32>)> = Vec::new();
        for &pid in &live {
            let threads = procinfo::read_threads(pid);
            if let Some(p) = self.book.profile_mut().process_mut(pid) {
                let tids = threads.keys().copied().collect();
                for (tid, name) in threads {
                    p.set_thread_name(tid, name);
                }
                alive_threads.push((pid, tids));
            }
        }
        self.write_memory(&live);
        // Names for every frame the workers have seen, before any stack
        // that contains them is written.
        self.shared
            .symbolizer
            .resolve_pending(&self.shared.interner);
        if let Some(named) = self.named.take() {
            let _ = named.send(());
        }
        let Some(w) = self.writer.as_mut() else {
            return false;
        };
        if let Err(e) = w.dump(self.book.profile_mut(), &self.shared.interner, asked_ns) {
            self.fail(e.to_string());
            return false;
        }
        // The names are in the trace now: threads that ended are
        // forgotten (a process that read as having none is left alone).
        for (pid, tids) in alive_threads {
            if let Some(p) = self.book.profile_mut().process_mut(pid)
                && !tids.is_empty()
            {
                p.forget_threads(|tid| tids.contains(&tid));
            }
        }
        true
    }

    /// After a dump, once the callsite tree grew enough: retires the
    /// callsites nothing counts under any more, so a long profile of a
    /// program that keeps making new stacks stays bounded (see
    /// `Profile::retire_idle`). Not for `--dump-at-max` (the value at the
    /// peak of a retired callsite would be lost).
    fn retire_idle(&mut self) {
        if self.options.dump_at_max {
            return;
        }
        self.retirement.after_dump(
            &mut self.book,
            &self.shared.interner,
            &self.shared.symbolizer,
        );
    }

    fn fail(&mut self, error: String) {
        if let Some(w) = self.writer.take() {
            // Cut a partly written packet so the file stays a valid trace.
            let _ = self.options.output.set_len(w.valid_len());
        }
        self.write_error.get_or_insert(error);
    }

    /// [`Self::finish`], telling `named` once every frame of the final
    /// dump has its name (before the trace is written).
    pub fn finish_telling(mut self, named: Sender<()>) -> anyhow::Result<Summary> {
        self.named = Some(named);
        self.finish()
    }

    /// Writes the final dump and closes the trace; the summary.
    pub fn finish(mut self) -> anyhow::Result<Summary> {
        self.book.finish();
        self.write_dump(read_clocks().monotonic_coarse_ns);
        let mut trace_bytes = 0;
        if let Some(w) = self.writer.take() {
            trace_bytes = w.valid_len();
            if let Err(e) = w.finish() {
                self.write_error.get_or_insert(e.to_string());
            }
        }
        if let Some(e) = self.write_error {
            let len = self.options.output.metadata().map_or(0, |m| m.len());
            return Err(anyhow!(
                "{e}; the first {} of {} are a valid trace with the data written before the failure",
                human_bytes(len),
                self.options.output_path.display()
            ));
        }
        Ok(Summary {
            output_path: self.options.output_path.clone(),
            trace_bytes,
            processes: self.book.summary(),
            interval: self.options.interval,
            dump_at_max: self.options.dump_at_max,
            already_printed: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Seek;

    use heapprofd_model::messages::{Op, SessionStats};
    use heapprofd_model::trace::read_trace;

    use super::*;

    #[test]
    fn a_dump_is_stamped_when_it_was_asked_for() {
        let mut file = tempfile::tempfile().unwrap();
        let shared = BookkeeperShared {
            interner: Arc::default(),
            symbolizer: Arc::new(Symbolizer::new()),
            counters: Arc::default(),
        };
        let options = BookkeeperOptions {
            owns_interner: false,
            output: file.try_clone().unwrap(),
            output_path: "t.pftrace".into(),
            interval: 1,
            dump_at_max: false,
            symbolize: true,
        };
        let mut book = Book::open(shared, options).unwrap();
        let now = read_clocks().monotonic_coarse_ns;
        let s = 1_000_000_000;
        let pid = std::process::id();
        book.handle(SessionEvent::Started {
            id: 1,
            pid,
            cmdline: vec!["t".into()],
            from_startup: true,
            started_ns: now - 4 * s,
            identity: Default::default(),
            memory: None,
        });
        let malloc = |seq: u64, ago: u64| SessionEvent::Ops {
            id: 1,
            ops: vec![
                Op::Stack {
                    id: 1,
                    frames: Box::new([]),
                },
                Op::Malloc {
                    heap: 0,
                    seq,
                    address: 0x1000 * seq,
                    sample_size: 100,
                    size: 100,
                    tid: pid,
                    timestamp_ns: now - ago,
                    stack: 1,
                    context: 0,
                    interval_shift: 0,
                },
            ],
            stats: SessionStats::default(),
        };
        // Two continuous-dump ticks asked for 3 s and 1 s ago, which the
        // thread gets to only now, one right after the other.
        book.handle(malloc(1, 3 * s + 1));
        book.dump_at(now - 3 * s);
        book.handle(malloc(2, 2 * s));
        book.dump_at(now - s);
        book.finish().unwrap();
        file.rewind().unwrap();
        let data = read_trace(file).unwrap();
        let ends: Vec<u64> = data.heaps[0].timeline.iter().map(|p| p.timestamp).collect();
        assert_eq!(ends.len(), 3, "two ticks and the final dump: {ends:?}");
        assert_eq!(&ends[..2], &[now - 3 * s, now - s]);
        assert!(ends[2] >= now, "{ends:?}");
        let allocated: Vec<u64> = data.heaps[0]
            .timeline
            .iter()
            .map(|p| p.totals.allocated)
            .collect();
        assert_eq!(allocated, [100, 200, 200]);
    }
}
