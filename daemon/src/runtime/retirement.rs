//! When a profile retires what nothing counts under any more, and what
//! that touches outside the model (see `Profile::retire_idle` and
//! `Interner::retire_unused`): the pacing of the passes, the symbolizer's
//! memory of retired frames, and stacks that still name a dropped frame.
//!
//! A pass runs after a dump, once the callsite tree grew by a quarter (and
//! by at least [`MIN_GROWTH`] nodes) since the last one: it walks every
//! heap slot and tree node, so its cost is amortized over the nodes that
//! made it due. A profile that owns its interner (`record`) also retires
//! interned entries, at most every [`INTERNER_SPACING`]: an entry goes
//! two passes after it became unreachable, and the spacing is what lets a
//! worker's batch that still names it arrive in between.

use std::time::{Duration, Instant};

use heapprofd_model::bookkeeping::Bookkeeping;
use heapprofd_model::messages::{Op, SessionEvent};
use heapprofd_model::profile::Interner;

use super::symbolize::Symbolizer;

/// The fewest nodes the callsite tree must gain before a pass.
pub const MIN_GROWTH: usize = 4096;
/// The least time between two interner passes.
pub const INTERNER_SPACING: Duration = Duration::from_secs(2);
/// The error frame a stack gets in place of a frame dropped before the
/// stack arrived.
pub const DROPPED_FRAME: &str = "RETIRED_FRAME";

/// One profile's retirement state.
#[derive(Debug)]
pub struct Retirement {
    /// The tree size that makes the next dump run a pass.
    due_at: usize,
    /// Retire interned entries too (the profile owns the interner).
    interner: bool,
    last_interner_pass: Option<Instant>,
    /// Some interned frame was dropped: stacks that arrive are checked.
    dropped_frames: bool,
}

impl Retirement {
    /// The state of a new profile.
    pub fn new(owns_interner: bool) -> Self {
        Retirement {
            due_at: MIN_GROWTH,
            interner: owns_interner,
            last_interner_pass: None,
            dropped_frames: false,
        }
    }

    /// After a dump: a pass if one is due.
    pub fn after_dump(
        &mut self,
        book: &mut Bookkeeping,
        interner: &Interner,
        symbolizer: &Symbolizer,
    ) {
        let nodes = book.profile().tree().len();
        if nodes < self.due_at {
            return;
        }
        let t0 = Instant::now();
        let removed = book.retire_idle();
        let left = book.profile().tree().len();
        self.due_at = left + (left / 4).max(MIN_GROWTH);
        log::debug!(
            "retired {removed} idle callsites of {nodes} in {:.1} ms",
            t0.elapsed().as_secs_f64() * 1e3
        );
        let spaced = self
            .last_interner_pass
            .is_none_or(|t| t.elapsed() >= INTERNER_SPACING);
        if !self.interner || !spaced {
            return;
        }
        self.last_interner_pass = Some(Instant::now());
        let t0 = Instant::now();
        let r = book.retire_interned(interner);
        if r.dropped.0 > 0 {
            self.dropped_frames = true;
            symbolizer.retain_frames(|id| interner.has_frame(id));
        }
        log::debug!(
            "interner: condemned {:?}, dropped {:?} (frames, mappings, strings) in {:.1} ms",
            r.condemned,
            r.dropped,
            t0.elapsed().as_secs_f64() * 1e3
        );
    }

    /// Before the bookkeeping applies `event`: a frame of a stack or
    /// context that was dropped while the stack was on its way becomes
    /// the `ERROR RETIRED_FRAME` frame (never happens with batches that
    /// arrive within [`INTERNER_SPACING`]).
    pub fn check_frames(&self, event: &mut SessionEvent, interner: &Interner) {
        if !self.dropped_frames {
            return;
        }
        let SessionEvent::Ops { ops, .. } = event else {
            return;
        };
        for op in ops.iter_mut() {
            match op {
                Op::Stack { frames, .. } if frames.iter().any(|&f| !interner.has_frame(f)) => {
                    let err = interner.intern_error_frame(DROPPED_FRAME);
                    let fixed: Vec<_> = frames
                        .iter()
                        .map(|&f| if interner.has_frame(f) { f } else { err })
                        .collect();
                    *frames = fixed.into();
                }
                Op::Context { frame, .. } if !interner.has_frame(*frame) => {
                    *frame = interner.intern_error_frame(DROPPED_FRAME);
                }
                _ => {}
            }
        }
    }
}
