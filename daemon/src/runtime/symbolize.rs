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

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use heapprofd_unwinder::Mapping;

use crate::profile::{FrameId, Interner};

/// Frames waiting to be symbolized.
#[derive(Debug, Default)]
pub struct Symbolizer {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    queue: Vec<(FrameId, Arc<Mapping>, u64)>,
    seen: HashSet<FrameId>,
}

impl Symbolizer {
    /// A new, empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues bare frame `id` (the pc at `rel_pc` in `mapping`) once.
    pub fn request(&self, id: FrameId, mapping: &Arc<Mapping>, rel_pc: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.seen.insert(id) {
            st.queue.push((id, Arc::clone(mapping), rel_pc));
        }
    }

    /// Symbolizes everything queued and records the results in `interner`.
    /// Returns how many frames were symbolized.
    pub fn resolve_pending(&self, interner: &Interner) -> usize {
        let queue = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut st.queue)
        };
        for (id, mapping, rel_pc) in &queue {
            let Some(module) = mapping.module.as_ref() else {
                continue;
            };
            let chain = module.symbolize(*rel_pc);
            if chain.is_empty() {
                continue;
            }
            let mapping_id = Some(interner.intern_mapping(mapping));
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
        queue.len()
    }
}
