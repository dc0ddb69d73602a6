//! Bookkeeping: what was allocated where, and what is still live.
//!
//! Pure data structures, no I/O. The semantics follow heapprofd's
//! (`bookkeeping.cc`): per process and heap a table of live *sampled*
//! allocations, per callsite cumulative allocated/freed bytes and counts,
//! and the state at the peak of live sampled bytes for dump_at_max.
//!
//! # Threads and ownership
//!
//! * [`Interner`] is `Send + Sync` and shared (in an `Arc`) by the
//!   unwinding workers, which turn pcs into [`FrameId`]s, and the
//!   bookkeeping thread, which reads frames back when writing dumps.
//! * [`Profile`] is owned by one bookkeeping thread and takes `&mut self`;
//!   it has no locks. It is given each sampled allocation (pid, [`Alloc`],
//!   stack) and each free; the trace writer borrows it between operations
//!   to dump.
//!
//! # Ordering
//!
//! Mallocs and frees of a process carry sequence numbers from one counter.
//! The profile commits them in that order whatever order they arrive in
//! (see [`order`]): a free that arrives before its malloc waits for it, a
//! malloc at a live address frees the older allocation, and frees of
//! addresses that are not live are ignored. Arrival may be out of order by
//! up to the reordering window (default [`order::DEFAULT_WINDOW`] sequence
//! numbers); call [`Profile::flush`] when a process's stream has ended (all
//! records drained and unwound) so that nothing stays pending, and
//! [`Profile::commit_through`] when the caller knows every operation up to
//! a sequence number has been delivered.

pub mod alloc;
pub mod callsite_stats;
pub mod context;
pub mod estimate;
pub mod heap;
pub mod histogram;
pub mod interner;
mod lifetime;
pub mod order;
pub mod process;
pub mod samples;
pub mod tree;

use std::collections::BTreeMap;

pub use alloc::Alloc;
pub use callsite_stats::{CallsiteStats, LifetimeBucket, SizeBucket};
pub use heap::{CallsiteTotals, HeapState, RaisedInterval, RetiredTotals};
pub use histogram::{UNWIND_HISTOGRAM_BUCKETS, UnwindHistogram};
pub use interner::{
    FrameData, FrameId, Interner, InternerView, Mapping, MappingData, MappingId, RetiredEntries,
    StringId,
};
pub use process::{
    ClientError, MAX_HEAPS_PER_PROCESS, OrderStats, ParentProcess, ProcessFlags, ProcessIdentity,
    ProcessState, ProcessStats,
};
pub use samples::{StackSample, StackSamples, ThreadSamples};
pub use tree::{CallsiteId, CallsiteTree};

use heap::MallocOp;
use process::PendingOp;

/// The bookkeeping of one profiling session; see the module docs.
#[derive(Debug)]
pub struct Profile {
    tree: CallsiteTree,
    processes: BTreeMap<u32, ProcessState>,
    empty_stack: FrameId,
    unknown_context: FrameId,
    window: u64,
}

impl Profile {
    /// An empty profile with the default reordering window. Interns the
    /// `ERROR EMPTY_STACK` frame that stands for samples without frames.
    pub fn new(interner: &Interner) -> Self {
        Self::with_window(interner, order::DEFAULT_WINDOW)
    }

    /// An empty profile whose processes hold at most `window` sequence
    /// numbers of out-of-order operations.
    pub fn with_window(interner: &Interner, window: u64) -> Self {
        Profile {
            tree: CallsiteTree::new(),
            processes: BTreeMap::new(),
            empty_stack: interner.intern_error_frame("EMPTY_STACK"),
            unknown_context: context::intern_context_frame(interner, &context::unknown_labels()),
            window: window.max(1),
        }
    }

    /// Registers a process (or updates its command line), and returns it.
    pub fn add_process(
        &mut self,
        pid: u32,
        cmdline: Vec<String>,
        from_startup: bool,
    ) -> &mut ProcessState {
        let p = self.process_or_default(pid);
        if !cmdline.is_empty() {
            p.cmdline = cmdline;
        }
        p.from_startup = from_startup;
        p
    }

    fn process_or_default(&mut self, pid: u32) -> &mut ProcessState {
        let window = self.window;
        self.processes
            .entry(pid)
            .or_insert_with(|| ProcessState::new(pid, window))
    }

    /// Declares heap `heap_id` of `pid` with its sampling interval, or
    /// changes the interval (adaptive sampling). `name` `None` keeps the
    /// current name. The first interval is kept as the original one.
    pub fn set_heap(&mut self, pid: u32, heap_id: u32, name: Option<&str>, sampling_interval: u64) {
        // Beyond the heap limit: dropped, and the process flagged.
        let Some(h) = self.process_or_default(pid).heap_or_default(heap_id) else {
            return;
        };
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            h.name = name.to_owned();
        }
        if h.orig_sampling_interval == 0 {
            h.orig_sampling_interval = sampling_interval;
        }
        h.sampling_interval = sampling_interval;
    }

    /// The callsite of `stack` (outermost caller first); an empty stack
    /// becomes the `ERROR EMPTY_STACK` frame.
    pub fn intern_callsite(&mut self, stack: &[FrameId]) -> CallsiteId {
        if stack.is_empty() {
            return self.tree.intern(&[self.empty_stack]);
        }
        self.tree.intern(stack)
    }

    /// The callsite of `callsite`'s stack under the context root frame
    /// `context` (see [`context`]); `None` is the root frame of a context
    /// id nothing defined.
    pub fn context_callsite(
        &mut self,
        callsite: CallsiteId,
        context: Option<FrameId>,
    ) -> CallsiteId {
        let mut frames = Vec::new();
        self.tree.stack(callsite, &mut frames);
        let root = self
            .tree
            .child(CallsiteId::ROOT, context.unwrap_or(self.unknown_context));
        frames
            .iter()
            .fold(root, |node, &f| self.tree.child(node, f))
    }

    /// Retires the callsites nothing counts under any more, after a dump:
    /// a callsite whose totals are in the trace, with nothing live, that
    /// did not change since the previous call, and that neither `held` (the
    /// caller's references: sessions' stack ids, context callsites) nor a
    /// waiting operation or unwritten stack sample refers to. Their tree
    /// nodes (and callers nothing else needs) go, their heap slots are
    /// emptied for reuse, and what they counted stays in each heap's
    /// [`heap::RetiredTotals`]. A long profile whose program keeps making
    /// new stacks (libraries loaded and unloaded) so keeps its memory
    /// bounded; a retired stack that comes back gets new ids (see
    /// [`tree`]). Not for `dump_at_max` profiles (a retired callsite's
    /// value at the peak would be lost). Returns the nodes removed.
    ///
    /// Only a profile of one process retires: a stack that comes back gets
    /// one new id for every process that uses it, and trace processor
    /// keeps the correction that carries a process's old totals over to a
    /// new id per id, not per process (`alloc_correction_`, set when each
    /// process first sees the id), so a second process using the new id
    /// would overwrite the first one's.
    pub fn retire_idle(&mut self, held: impl IntoIterator<Item = CallsiteId>) -> usize {
        if self.processes.len() > 1 {
            return 0;
        }
        let mut keep: Vec<CallsiteId> = held.into_iter().collect();
        for p in self.processes.values_mut() {
            p.mark_idle(&mut keep);
        }
        let removed = self.tree.retain(keep);
        if removed > 0 {
            let tree = &self.tree;
            for p in self.processes.values_mut() {
                p.retire(|c| !tree.contains(c));
            }
        }
        removed
    }

    /// Every frame the profile refers to: its tree's and its own error and
    /// context frames (what an interner retirement must keep, see
    /// [`Interner::retire_unused`]).
    pub fn frames(&self) -> impl Iterator<Item = FrameId> + '_ {
        self.tree
            .frames()
            .chain([self.empty_stack, self.unknown_context])
    }

    /// Records a sampled allocation of `pid`. `stack` is outermost caller
    /// first. Unknown processes and heaps are created.
    pub fn malloc(&mut self, pid: u32, alloc: Alloc, stack: &[FrameId]) {
        let callsite = self.intern_callsite(stack);
        self.malloc_at(pid, alloc, callsite);
    }

    /// A stack sample of process `pid` (its thread noted for naming) and
    /// the samples its thread lost just before it.
    pub fn stack_sample(&mut self, pid: u32, s: StackSample, lost_overrun: u64, lost_dropped: u64) {
        let p = self.process_or_default(pid);
        p.note_thread(s.tid);
        p.samples.add(s, lost_overrun, lost_dropped);
    }

    /// Losses of thread `tid` of process `pid` that no sample carried.
    pub fn sample_losses(&mut self, pid: u32, tag: u64, tid: u32, overrun: u64, dropped: u64) {
        let p = self.process_or_default(pid);
        p.note_thread(tid);
        p.samples.add_losses(tag, tid, overrun, dropped);
    }

    /// Names the program's event `tag` in process `pid`.
    pub fn set_event_name(&mut self, pid: u32, tag: u64, name: String) {
        self.process_or_default(pid).samples.names.insert(tag, name);
    }

    /// [`Profile::malloc`] with a callsite from [`Profile::intern_callsite`].
    pub fn malloc_at(&mut self, pid: u32, alloc: Alloc, callsite: CallsiteId) {
        self.malloc_drawn_at(pid, alloc, callsite, 0);
    }

    /// [`Profile::malloc_at`] of a sample drawn at its heap's interval
    /// times `2^interval_shift` (a client that raised its interval under
    /// load): its count weighs at that interval.
    pub fn malloc_drawn_at(
        &mut self,
        pid: u32,
        alloc: Alloc,
        callsite: CallsiteId,
        interval_shift: u8,
    ) {
        let op = PendingOp::Malloc(MallocOp {
            heap_id: alloc.heap,
            address: alloc.address,
            sample_size: alloc.sample_size,
            size: alloc.size,
            tid: alloc.tid,
            timestamp: alloc.timestamp_ns,
            callsite,
            interval_shift,
        });
        let p = self.process_or_default(pid);
        p.note_thread(alloc.tid);
        p.push(alloc.seq, op);
    }

    /// Records a free (or the free half of a realloc).
    pub fn free(&mut self, pid: u32, heap_id: u32, seq: u64, address: u64) {
        self.push(pid, seq, PendingOp::Free { heap_id, address });
    }

    fn push(&mut self, pid: u32, seq: u64, op: PendingOp) {
        self.process_or_default(pid).push(seq, op);
    }

    /// Commits every operation of `pid` with a sequence number <= `seq`:
    /// the caller knows nothing older is still on its way.
    pub fn commit_through(&mut self, pid: u32, seq: u64) {
        if let Some(p) = self.processes.get_mut(&pid) {
            p.release_through(seq);
        }
    }

    /// A new client session for a pid already in the profile: the process
    /// called exec (or the pid was reused). Commits what is pending, forgets
    /// the old image's live allocations (they stay unreleased), and starts
    /// a new sequence-number space.
    pub fn new_session(&mut self, pid: u32) {
        let window = self.window;
        if let Some(p) = self.processes.get_mut(&pid) {
            p.new_session(window);
        }
    }

    /// Commits every pending operation of `pid` (its stream has ended).
    pub fn flush(&mut self, pid: u32) {
        if let Some(p) = self.processes.get_mut(&pid) {
            p.flush();
        }
    }

    /// [`Profile::flush`] for every process.
    pub fn flush_all(&mut self) {
        for p in self.processes.values_mut() {
            p.flush();
        }
    }

    /// A process.
    pub fn process(&self, pid: u32) -> Option<&ProcessState> {
        self.processes.get(&pid)
    }

    /// A process, to update its stats and flags.
    pub fn process_mut(&mut self, pid: u32) -> Option<&mut ProcessState> {
        self.processes.get_mut(&pid)
    }

    /// All processes, by pid.
    pub fn processes(&self) -> impl Iterator<Item = &ProcessState> {
        self.processes.values()
    }

    /// (pid, tid) of the threads seen in samples since the last call, for
    /// the runtime to look their names up
    /// ([`ProcessState::set_thread_name`]).
    pub fn take_unnamed_threads(&mut self) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        for p in self.processes.values_mut() {
            if !p.unnamed_threads.is_empty() {
                out.extend(p.take_unnamed_threads().into_iter().map(|t| (p.pid, t)));
            }
        }
        out
    }

    /// Forgets a process (after its final dump) to free its memory.
    pub fn remove_process(&mut self, pid: u32) -> Option<ProcessState> {
        self.processes.remove(&pid)
    }

    /// A heap of a process.
    pub fn heap(&self, pid: u32, heap_id: u32) -> Option<&HeapState> {
        self.processes.get(&pid)?.heaps.get(&heap_id)
    }

    /// The callsite tree.
    pub fn tree(&self) -> &CallsiteTree {
        &self.tree
    }

    /// The tree and the processes, borrowed apart (for the dump path).
    pub(crate) fn split_mut(&mut self) -> (&CallsiteTree, &mut BTreeMap<u32, ProcessState>) {
        (&self.tree, &mut self.processes)
    }

    /// Sum of live sampled bytes over every process and heap.
    pub fn live_bytes(&self) -> u64 {
        self.processes.values().map(|p| p.live_bytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(i: &Interner, names: &[&str]) -> Vec<FrameId> {
        names
            .iter()
            .map(|n| i.intern_frame(None, 0, Some(n), None, None))
            .collect()
    }

    #[test]
    fn free_before_malloc_is_matched() {
        let i = Interner::new();
        let mut p = Profile::new(&i);
        let st = frames(&i, &["main", "f"]);
        p.set_heap(7, 0, Some("libc.malloc"), 1);
        p.free(7, 0, 2, 0x100); // arrives first
        p.malloc(
            7,
            Alloc {
                heap: 0,
                seq: 1,
                address: 0x100,
                sample_size: 10,
                size: 10,
                tid: 1,
                timestamp_ns: 5,
            },
            &st,
        );
        let h = p.heap(7, 0).unwrap();
        let t = h.callsite(p.tree().find(&st).unwrap()).unwrap();
        assert_eq!((t.allocated, t.freed, t.live_count), (10, 10, 0));
        assert_eq!(p.process(7).unwrap().pending_ops(), 0);
    }

    #[test]
    fn exec_starts_a_new_sequence_space_and_releases_the_old_image() {
        let i = Interner::new();
        let mut p = Profile::new(&i);
        let shell = frames(&i, &["main", "sh_alloc"]);
        let prog = frames(&i, &["main", "prog_alloc"]);
        p.set_heap(5, 0, Some("libc.malloc"), 1);
        p.malloc(
            5,
            Alloc {
                heap: 0,
                seq: 1,
                address: 0x100,
                sample_size: 10,
                size: 10,
                tid: 1,
                timestamp_ns: 1,
            },
            &shell,
        );
        p.malloc(
            5,
            Alloc {
                heap: 0,
                seq: 2,
                address: 0x200,
                sample_size: 20,
                size: 20,
                tid: 1,
                timestamp_ns: 1,
            },
            &shell,
        );
        p.free(5, 0, 3, 0x200);
        p.process_mut(5).unwrap().flags.disconnected = true;
        // exec: the new image's client numbers from 1 again, and reuses 0x100.
        p.new_session(5);
        p.malloc(
            5,
            Alloc {
                heap: 0,
                seq: 1,
                address: 0x100,
                sample_size: 30,
                size: 30,
                tid: 1,
                timestamp_ns: 2,
            },
            &prog,
        );
        p.free(5, 0, 2, 0x100);
        let h = p.heap(5, 0).unwrap();
        let sh = h.callsite(p.tree().find(&shell).unwrap()).unwrap();
        let pr = h.callsite(p.tree().find(&prog).unwrap()).unwrap();
        // The shell's block at 0x100 was never freed, but the exec threw
        // it away: released, not left unreleased.
        assert_eq!(
            (sh.allocated, sh.freed, sh.alloc_count, sh.free_count),
            (30, 30, 2, 2)
        );
        // Nothing of the new image was dropped as "late".
        assert_eq!((pr.allocated, pr.freed), (30, 30));
        assert_eq!(p.process(5).unwrap().order_stats().late_ops, 0);
        assert!(!p.process(5).unwrap().flags.disconnected);
        assert_eq!(p.live_bytes(), 0);
    }

    #[test]
    fn unknown_frees_are_counted_and_ignored() {
        let i = Interner::new();
        let mut p = Profile::new(&i);
        p.set_heap(1, 0, None, 4096);
        p.free(1, 0, 1, 0xdead);
        p.free(1, 3, 2, 0xbeef); // undeclared heap
        let proc_ = p.process(1).unwrap();
        assert_eq!(proc_.order_stats().unknown_frees, 2);
        assert_eq!(proc_.live_bytes(), 0);
        assert_eq!(proc_.heap(0).unwrap().name, "libc.malloc");
    }

    #[test]
    fn empty_stack_gets_an_error_frame() {
        let i = Interner::new();
        let mut p = Profile::new(&i);
        let c = p.intern_callsite(&[]);
        assert_ne!(c, CallsiteId::ROOT);
        let f = p.tree().frame(c).unwrap();
        assert_eq!(
            i.read().function_name(f).as_deref(),
            Some("ERROR EMPTY_STACK")
        );
    }

    #[test]
    fn interval_changes_keep_the_original() {
        let i = Interner::new();
        let mut p = Profile::new(&i);
        p.set_heap(1, 2, Some("custom"), 100);
        p.set_heap(1, 2, None, 200);
        let h = p.heap(1, 2).unwrap();
        assert_eq!(
            (
                h.name.as_str(),
                h.sampling_interval,
                h.orig_sampling_interval
            ),
            ("custom", 200, 100)
        );
    }

    #[test]
    fn pending_ops_wait_for_flush() {
        let i = Interner::new();
        let mut p = Profile::new(&i);
        let st = frames(&i, &["a"]);
        p.malloc(
            1,
            Alloc {
                heap: 0,
                seq: 2,
                address: 0x10,
                sample_size: 8,
                size: 8,
                tid: 1,
                timestamp_ns: 1,
            },
            &st,
        ); // seq 1 never comes
        assert_eq!(p.live_bytes(), 0);
        p.flush(1);
        assert_eq!(p.live_bytes(), 8);
        p.commit_through(1, 10);
        p.malloc(
            1,
            Alloc {
                heap: 0,
                seq: 11,
                address: 0x20,
                sample_size: 8,
                size: 8,
                tid: 1,
                timestamp_ns: 1,
            },
            &st,
        );
        assert_eq!(p.live_bytes(), 16);
    }
}
