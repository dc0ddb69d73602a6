//! Deferred symbolization: names are looked up on the dump path, not while
//! draining ring buffers.
//!
//! Symbolizing a module for the first time means parsing its symbol tables
//! and DWARF (libc with its debug file: tens of milliseconds). Doing that on
//! an unwinding worker stalls the ring buffer it drains, and a blocking
//! client with it. So workers intern each new pc as a bare frame (mapping +
//! rel_pc) and queue it here; before every dump, the bookkeeping thread
//! symbolizes what is queued and records each frame's inline chain as an
//! [`Interner::set_expansion`]. The trace writer writes the chain wherever
//! the bare frame appears, so the trace is the same as with eager
//! symbolization.
//!
//! To keep that work off the end of a short run, a background thread
//! symbolizes each new frame as soon as it is queued, which warms the
//! modules' own caches, and leaves the answer in the queue with a copy of
//! the mapping that no longer holds the module: a queued frame keeps its
//! module (file bytes, symbol tables, DWARF) alive only until it is warmed,
//! not until the next dump. A program that keeps loading new libraries
//! (`-c 10s`, a fresh library 300 times a second) held every one of them
//! for up to 10 s before: 400-500 MiB. The dump uses the answers. It runs at
//! normal priority: at `SCHED_IDLE` it only got a CPU nobody else wanted,
//! which on a busy machine meant never before a short program ended (the
//! sqlite3 benchmark at load 6: 0.0 ms warmed, 105-245 ms symbolizing after
//! the exit). Its work is the work the dump would do anyway, once: a module
//! it is loading is checked out (`Module::warm_symbols`), and a dump that
//! needs that module waits for it rather than loading it a second time.
//! While a dump runs it takes no new work, so it never holds a state the
//! dump is about to need. It sets no expansion itself, so the dump stays the
//! one place that decides what a frame is called before a stack is written.
//!
//! The thread walks the queue itself, in batches, and sleeps on a condition
//! variable when it has caught up; a worker that queued frames wakes it
//! once per batch of records it drained ([`Symbolizer::kick`]), not per
//! frame. (It was sent each frame over a channel: a send and, mostly, a
//! futex wake-up of the thread per new pc, 16% of the unwinding worker's
//! time in `record -- tree 1 1000000`, about 1,400 new stacks a run.)

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use heapprofd_unwinder::{Mapping, SymbolFrame};

use heapprofd_model::profile::{FrameId, Interner};

/// Queued frames the warm-up thread takes at a time (one lock each).
const WARM_BATCH: usize = 64;

/// A frame to symbolize ahead of the dump, and where it is in the queue.
struct WarmRequest {
    /// Its index in [`State::queue`] (in the generation it was taken in).
    index: usize,
    id: FrameId,
    mapping: Arc<Mapping>,
    rel_pc: u64,
}

/// The queue and the warm-up thread's wake-up.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled by a kick after frames were queued while the thread
    /// waited ([`Symbolizer::kick`]), and when the symbolizer goes.
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Frames waiting to be symbolized.
#[derive(Debug, Default)]
pub struct Symbolizer {
    shared: Arc<Shared>,
    /// A dump is symbolizing: the warm-up thread waits.
    dumping: Arc<AtomicBool>,
    /// Time spent in [`Symbolizer::resolve_pending`] (ns).
    resolve_ns: AtomicU64,
    /// Time the warm-up thread spent symbolizing (ns).
    warm_ns: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct State {
    queue: Vec<Pending>,
    seen: HashSet<FrameId>,
    /// Bumped whenever the queue is taken or cleared, so that a warm-up
    /// answer for an entry that has left finds nothing to fill in.
    generation: u64,
    /// The warm-up thread was started (or could not be).
    warm_started: bool,
    /// The warm-up thread waits for frames.
    warm_waiting: bool,
    /// Frames were queued since the warm-up thread last looked: a kick
    /// wakes it.
    queued: bool,
    /// The symbolizer is gone: the warm-up thread ends.
    closed: bool,
}

/// A frame waiting to be symbolized.
#[derive(Debug)]
struct Pending {
    id: FrameId,
    /// Holds the module until the answer is in, then a copy without it.
    mapping: Arc<Mapping>,
    rel_pc: u64,
    /// The warm-up thread's answer.
    answer: Option<Arc<[SymbolFrame]>>,
}

impl Symbolizer {
    /// A new, empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets every frame queued or seen (their interner was cleared,
    /// [`Interner::clear`]).
    pub fn clear(&self) {
        let mut st = self.shared.lock();
        st.queue.clear();
        st.seen = HashSet::new();
        st.generation += 1;
    }

    /// Forgets the frames `keep` says no (frames an interner retirement
    /// dropped): their queue entries and their place in the set of frames
    /// seen.
    pub fn retain_frames(&self, keep: impl Fn(FrameId) -> bool) {
        let mut st = self.shared.lock();
        let before = st.queue.len();
        st.seen.retain(|&id| keep(id));
        st.queue.retain(|p| keep(p.id));
        if st.queue.len() != before {
            // Queue positions moved: answers of the warm-up thread for the
            // old positions must find nothing.
            st.generation += 1;
        }
        if st.seen.len() * 4 < st.seen.capacity() {
            st.seen.shrink_to_fit();
        }
    }

    /// Queues bare frame `id` (the pc at `rel_pc` in `mapping`) once.
    pub fn request(&self, id: FrameId, mapping: &Arc<Mapping>, rel_pc: u64) {
        let start = {
            let mut st = self.shared.lock();
            if !st.seen.insert(id) {
                return;
            }
            st.queue.push(Pending {
                id,
                mapping: Arc::clone(mapping),
                rel_pc,
                answer: None,
            });
            st.queued = true;
            !std::mem::replace(&mut st.warm_started, true)
        };
        if start {
            start_warmer(
                Arc::clone(&self.shared),
                Arc::clone(&self.dumping),
                Arc::clone(&self.warm_ns),
            );
        }
    }

    /// Wakes the warm-up thread if frames were queued while it waited:
    /// call it after a batch of [`Symbolizer::request`]s (a worker, once
    /// per batch of records).
    pub fn kick(&self) {
        let wake = {
            let mut st = self.shared.lock();
            let wake = st.warm_waiting && st.queued;
            if wake {
                st.warm_waiting = false;
            }
            wake
        };
        if wake {
            self.shared.wake.notify_one();
        }
    }

    /// Symbolizes everything queued and records the results in `interner`.
    /// Returns how many frames were symbolized.
    pub fn resolve_pending(&self, interner: &Interner) -> usize {
        struct Dumping<'a>(&'a AtomicBool);
        impl Drop for Dumping<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        self.dumping.store(true, Ordering::Release);
        let _dumping = Dumping(&self.dumping);
        let started = Instant::now();
        let queue = {
            let mut st = self.shared.lock();
            st.generation += 1;
            std::mem::take(&mut st.queue)
        };
        for Pending {
            id,
            mapping,
            rel_pc,
            answer,
        } in &queue
        {
            let chain = match (answer, mapping.module.as_ref()) {
                (Some(chain), _) => Arc::clone(chain),
                (None, Some(module)) => module.symbolize(*rel_pc),
                (None, None) => continue,
            };
            if chain.is_empty() {
                continue;
            }
            let mapping_id = Some(super::mapping::intern_mapping(interner, mapping));
            // The unwinder gives the inline chain innermost first; stacks
            // are written outermost caller first.
            let named: Box<[FrameId]> = chain
                .iter()
                .rev()
                .map(|f| {
                    interner.intern_frame(
                        mapping_id,
                        *rel_pc,
                        f.function.as_deref(),
                        f.file.as_deref(),
                        f.line,
                    )
                })
                .collect();
            interner.set_expansion(*id, named);
        }
        let spent = started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.resolve_ns.fetch_add(spent, Ordering::Relaxed);
        queue.len()
    }

    /// Time spent symbolizing so far: before dumps
    /// ([`Symbolizer::resolve_pending`]) and on the warm-up thread.
    pub fn time_spent(&self) -> (Duration, Duration) {
        let get = |c: &AtomicU64| Duration::from_nanos(c.load(Ordering::Relaxed));
        (get(&self.resolve_ns), get(&self.warm_ns))
    }
}

impl Drop for Symbolizer {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_all();
    }
}

/// The warm-up thread's next frames: up to [`WARM_BATCH`] not yet answered
/// from `*next` on in the queue of generation `*generation` (from the
/// start of the queue when it changed). Waits while there are none; `None`
/// once the symbolizer is gone.
fn next_batch(shared: &Shared, generation: &mut u64, next: &mut usize) -> Option<Vec<WarmRequest>> {
    let mut st = shared.lock();
    loop {
        if st.closed {
            return None;
        }
        st.queued = false;
        if st.generation != *generation {
            *generation = st.generation;
            *next = 0;
        }
        let batch: Vec<WarmRequest> = st
            .queue
            .iter()
            .enumerate()
            .skip(*next)
            .filter(|(_, p)| p.answer.is_none())
            .take(WARM_BATCH)
            .map(|(index, p)| WarmRequest {
                index,
                id: p.id,
                mapping: Arc::clone(&p.mapping),
                rel_pc: p.rel_pc,
            })
            .collect();
        if let Some(last) = batch.last() {
            *next = last.index + 1;
            return Some(batch);
        }
        *next = st.queue.len();
        st.warm_waiting = true;
        st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
        st.warm_waiting = false;
    }
}

/// Starts the thread that symbolizes frames ahead of the dump (see the
/// module docs). If no thread can be started, the dump does all the work,
/// as without it.
fn start_warmer(shared: Arc<Shared>, dumping: Arc<AtomicBool>, spent_ns: Arc<AtomicU64>) {
    let _ = std::thread::Builder::new()
        .name("heapprofd-symwarm".into())
        .spawn(move || {
            // The last mapping seen and its copy without the module (frames
            // come in runs of one mapping). Weak: it keeps no module alive.
            let mut last: Option<(Weak<Mapping>, Arc<Mapping>)> = None;
            let (mut generation, mut next) = (0, 0);
            while let Some(batch) = next_batch(&shared, &mut generation, &mut next) {
                for req in batch {
                    warm_one(&shared, &dumping, &spent_ns, &mut last, generation, req);
                }
            }
        });
}

/// Symbolizes one queued frame and leaves the answer in its queue entry,
/// if the entry is still there (same generation, same frame).
fn warm_one(
    shared: &Shared,
    dumping: &AtomicBool,
    spent_ns: &AtomicU64,
    last: &mut Option<(Weak<Mapping>, Arc<Mapping>)>,
    generation: u64,
    req: WarmRequest,
) {
    while dumping.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let Some(module) = req.mapping.module.as_ref() else {
        return;
    };
    let started = Instant::now();
    let answer = module.warm_symbols(req.rel_pc);
    let spent = started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
    spent_ns.fetch_add(spent, Ordering::Relaxed);
    let Some(answer) = answer else {
        return;
    };
    let light = match last {
        Some((orig, light)) if std::ptr::eq(orig.as_ptr(), Arc::as_ptr(&req.mapping)) => {
            Arc::clone(light)
        }
        _ => {
            let light = Arc::new(Mapping {
                module: None,
                ..Mapping::clone(&req.mapping)
            });
            *last = Some((Arc::downgrade(&req.mapping), Arc::clone(&light)));
            light
        }
    };
    let mut st = shared.lock();
    if st.generation == generation
        && let Some(p) = st.queue.get_mut(req.index)
        && p.id == req.id
    {
        p.answer = Some(answer);
        p.mapping = light;
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use heapprofd_model::messages::Op;
    use heapprofd_unwinder::{
        CacheBudget, ModuleCache, NoMemory, ProcessContext, StaticMaps, SymbolizeOptions,
    };

    use super::*;
    use crate::runtime::stacks::tests::header;
    use crate::runtime::stacks::{InternCtx, StackCache};

    /// A module cache with `budget` for this test process.
    fn self_cache(budget: CacheBudget) -> Arc<ModuleCache> {
        Arc::new(ModuleCache::with_budget(
            SymbolizeOptions::default(),
            budget,
        ))
    }

    /// Interning into `interner`, new frames queued on `symbolizer`.
    fn symbolizing<'a>(interner: &'a Interner, symbolizer: &'a Symbolizer) -> InternCtx<'a> {
        InternCtx {
            interner,
            symbolizer,
            symbolize: true,
        }
    }

    /// This test process, its maps as they are now, no memory to read.
    fn self_process(cache: &Arc<ModuleCache>) -> ProcessContext {
        ProcessContext::new(
            std::process::id(),
            Box::new(StaticMaps(
                std::fs::read_to_string("/proc/self/maps").unwrap(),
            )),
            Box::new(NoMemory),
            Arc::clone(cache),
        )
    }

    /// Waits (at most 10 s) until every queued frame has the warm-up
    /// thread's answer and the thread waits for more.
    fn wait_until_warmed(symbolizer: &Symbolizer) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            {
                let st = symbolizer.shared.lock();
                if st.warm_waiting && st.queue.iter().all(|p| p.answer.is_some()) {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Frames queued after the warm-up thread caught up wait for a
    /// worker's kick (one per batch of records), which wakes it: they
    /// are answered before any dump.
    #[test]
    fn a_kick_wakes_the_warm_up_thread_for_frames_queued_since() {
        let cache = self_cache(CacheBudget {
            max_unused_modules: 64,
            max_unused_bytes: 1 << 30,
        });
        let (interner, symbolizer) = (Interner::new(), Symbolizer::new());
        let cx = symbolizing(&interner, &symbolizer);
        let mut process = self_process(&cache);
        let mut stacks = StackCache::default();
        let mut ops = Vec::new();
        let first = wait_until_warmed as *const () as usize as u64;
        stacks.stack_of(
            &mut process,
            &header(first + 4),
            &[],
            &(0..0),
            &cx,
            &mut ops,
        );
        assert!(
            wait_until_warmed(&symbolizer),
            "the first frame was never warmed"
        );
        let second =
            a_kick_wakes_the_warm_up_thread_for_frames_queued_since as *const () as usize as u64;
        stacks.stack_of(
            &mut process,
            &header(second + 4),
            &[],
            &(0..0),
            &cx,
            &mut ops,
        );
        assert_eq!(symbolizer.shared.lock().queue.len(), 2);
        symbolizer.kick();
        assert!(
            wait_until_warmed(&symbolizer),
            "the frame queued after the thread caught up was not warmed after the kick"
        );
        assert_eq!(symbolizer.resolve_pending(&interner), 2);
    }

    /// The process ends and its modules leave the cache before any dump,
    /// yet the frame it was unwound into keeps its name: the warm-up
    /// thread symbolizes the queued frame, leaves the answer in the queue
    /// and lets go of the module; the dump uses the answer.
    #[test]
    fn frames_warmed_before_eviction_keep_their_names() {
        let cache = self_cache(CacheBudget {
            max_unused_modules: 0,
            max_unused_bytes: 0,
        });
        let (interner, symbolizer) = (Interner::new(), Symbolizer::new());
        let cx = symbolizing(&interner, &symbolizer);
        let mut process = self_process(&cache);
        let pc = frames_warmed_before_eviction_keep_their_names as *const () as usize as u64;
        let mut stacks = StackCache::default();
        let mut ops = Vec::new();
        stacks.stack_of(&mut process, &header(pc + 4), &[], &(0..0), &cx, &mut ops);
        let Some(Op::Stack { frames, .. }) = ops.first() else {
            panic!("{ops:?}")
        };
        let frames = frames.clone();
        let modules = cache.len();
        assert!(modules >= 1);
        drop(process);
        // No dump yet: once warmed, the queued frame no longer holds its
        // module, so every module goes.
        let deadline = Instant::now() + Duration::from_secs(60);
        while {
            cache.trim();
            !cache.is_empty()
        } {
            assert!(Instant::now() < deadline, "the module was never released");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(cache.stats().evicted as usize, modules);
        assert!(symbolizer.resolve_pending(&interner) >= 1);
        let view = interner.read();
        let named = frames
            .iter()
            .find_map(|&f| view.expansion(f))
            .expect("the frame was symbolized");
        let name = view.function_name(*named.last().unwrap());
        assert!(
            name.as_deref()
                .is_some_and(|n| n.contains("frames_warmed_before_eviction_keep_their_names")),
            "{name:?}"
        );
    }
}
