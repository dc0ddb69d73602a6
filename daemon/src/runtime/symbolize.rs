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

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use heapprofd_unwinder::{Mapping, SymbolFrame};

use heapprofd_model::profile::{FrameId, Interner};

/// A frame to symbolize ahead of the dump, and where it is in the queue.
struct WarmRequest {
    /// [`State::generation`] when it was queued.
    generation: u64,
    /// Its index in [`State::queue`].
    index: usize,
    id: FrameId,
    mapping: Arc<Mapping>,
    rel_pc: u64,
}

/// Frames waiting to be symbolized.
#[derive(Debug, Default)]
pub struct Symbolizer {
    state: Arc<Mutex<State>>,
    /// The warm-up thread's queue, started with the first request.
    warm: Mutex<Option<Sender<WarmRequest>>>,
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
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.queue.clear();
        st.seen = HashSet::new();
        st.generation += 1;
    }

    /// Forgets the frames `keep` says no (frames an interner retirement
    /// dropped): their queue entries and their place in the set of frames
    /// seen.
    pub fn retain_frames(&self, keep: impl Fn(FrameId) -> bool) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
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
        let (generation, index) = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if !st.seen.insert(id) {
                return;
            }
            st.queue.push(Pending {
                id,
                mapping: Arc::clone(mapping),
                rel_pc,
                answer: None,
            });
            (st.generation, st.queue.len() - 1)
        };
        let mut warm = self.warm.lock().unwrap_or_else(|e| e.into_inner());
        if warm.is_none() {
            *warm = start_warmer(
                Arc::clone(&self.state),
                Arc::clone(&self.dumping),
                Arc::clone(&self.warm_ns),
            );
        }
        if let Some(tx) = warm.as_ref() {
            let req = WarmRequest {
                generation,
                index,
                id,
                mapping: Arc::clone(mapping),
                rel_pc,
            };
            if tx.send(req).is_err() {
                *warm = None;
            }
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
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
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

/// Starts the thread that symbolizes frames ahead of the dump (see the
/// module docs). `None` if no thread could be started: the dump then does
/// all the work, as without it.
fn start_warmer(
    state: Arc<Mutex<State>>,
    dumping: Arc<AtomicBool>,
    spent_ns: Arc<AtomicU64>,
) -> Option<Sender<WarmRequest>> {
    let (tx, rx) = channel::<WarmRequest>();
    std::thread::Builder::new()
        .name("heapprofd-symwarm".into())
        .spawn(move || {
            // The last mapping seen and its copy without the module (frames
            // come in runs of one mapping). Weak: it keeps no module alive.
            let mut last: Option<(Weak<Mapping>, Arc<Mapping>)> = None;
            while let Ok(req) = rx.recv() {
                while dumping.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let Some(module) = req.mapping.module.as_ref() else {
                    continue;
                };
                let started = Instant::now();
                let answer = module.warm_symbols(req.rel_pc);
                let spent = started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
                spent_ns.fetch_add(spent, Ordering::Relaxed);
                let Some(answer) = answer else {
                    continue;
                };
                let light = match &last {
                    Some((orig, light))
                        if std::ptr::eq(orig.as_ptr(), Arc::as_ptr(&req.mapping)) =>
                    {
                        Arc::clone(light)
                    }
                    _ => {
                        let light = Arc::new(Mapping {
                            module: None,
                            ..Mapping::clone(&req.mapping)
                        });
                        last = Some((Arc::downgrade(&req.mapping), Arc::clone(&light)));
                        light
                    }
                };
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                if st.generation == req.generation
                    && let Some(p) = st.queue.get_mut(req.index)
                    && p.id == req.id
                {
                    p.answer = Some(answer);
                    p.mapping = light;
                }
            }
        })
        .ok()?;
    Some(tx)
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

    /// The process ends and its modules leave the cache before any dump,
    /// yet the frame it was unwound into keeps its name: the warm-up
    /// thread symbolizes the queued frame, leaves the answer in the queue
    /// and lets go of the module; the dump uses the answer.
    #[test]
    fn frames_warmed_before_eviction_keep_their_names() {
        let cache = Arc::new(ModuleCache::with_budget(
            SymbolizeOptions::default(),
            CacheBudget {
                max_unused_modules: 0,
                max_unused_bytes: 0,
            },
        ));
        let (interner, symbolizer) = (Interner::new(), Symbolizer::new());
        let cx = InternCtx {
            interner: &interner,
            symbolizer: &symbolizer,
            symbolize: true,
        };
        let mut process = ProcessContext::new(
            std::process::id(),
            Box::new(StaticMaps(
                std::fs::read_to_string("/proc/self/maps").unwrap(),
            )),
            Box::new(NoMemory),
            Arc::clone(&cache),
        );
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
