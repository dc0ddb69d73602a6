//! What an unwind produces: [`Frame`]s and [`UnwindResult`] (with
//! mappings), [`RawUnwind`] (addresses only, the hot path), and
//! [`UnwindErrorKind`], why a stack ended early.

use std::sync::Arc;

use crate::mapping::Mapping;

/// Why an unwind stopped before the root of the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnwindErrorKind {
    /// A stack (or memory) read the unwind rules asked for failed: the copy
    /// was too short or the process memory was unreadable.
    MemoryInvalid,
    /// A frame's address is in no mapping of the process (after a re-read
    /// of the maps): a corrupt stack or garbage return address.
    InvalidMap,
    /// The code had no unwind information and the frame-pointer guess led
    /// nowhere (or the CFI gave an impossible result).
    UnwindInfo,
    /// More than the frame limit.
    MaxFramesExceeded,
    /// pc or sp are zero, or sp is outside the copied stack.
    InvalidRegisters,
}

impl UnwindErrorKind {
    /// Number of kinds.
    pub const COUNT: usize = 5;
    /// All kinds, in [`UnwindErrorKind::index`] order.
    pub const ALL: [UnwindErrorKind; Self::COUNT] = [
        Self::MemoryInvalid,
        Self::InvalidMap,
        Self::UnwindInfo,
        Self::MaxFramesExceeded,
        Self::InvalidRegisters,
    ];

    /// Dense index for counters.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Upper-case name, as used in the `ERROR <KIND>` frame (libunwindstack
    /// and Perfetto spell the first four the same way).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MemoryInvalid => "MEMORY_INVALID",
            Self::InvalidMap => "INVALID_MAP",
            Self::UnwindInfo => "UNWIND_INFO",
            Self::MaxFramesExceeded => "MAX_FRAMES_EXCEEDED",
            Self::InvalidRegisters => "INVALID_REGISTERS",
        }
    }
}

impl std::fmt::Display for UnwindErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One frame of an unwound stack.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Absolute pc: the interrupted pc for the first frame of the walk, a
    /// return address for the others. 0 for the error frame.
    pub pc: u64,
    /// Address to symbolize: `pc` for the first frame of the walk,
    /// `pc - 1` for return addresses.
    pub lookup_pc: u64,
    /// ELF virtual address of `lookup_pc` in its module (what offline
    /// symbolizers and Perfetto's `Frame.rel_pc` take).
    pub rel_pc: u64,
    /// The mapping `pc` falls in (`None` only for the error frame).
    pub mapping: Option<Arc<Mapping>>,
    /// Set on the synthetic last frame of a stack that ended in an error.
    pub error: Option<UnwindErrorKind>,
}

impl Frame {
    /// The synthetic last frame of a stack that ended in `kind`.
    pub(crate) fn error(kind: UnwindErrorKind) -> Frame {
        Frame {
            pc: 0,
            lookup_pc: 0,
            rel_pc: 0,
            mapping: None,
            error: Some(kind),
        }
    }
}

/// The result of [`ProcessContext::unwind`](crate::ProcessContext::unwind).
#[derive(Debug, Clone, Default)]
pub struct UnwindResult {
    /// Leaf first. When `error` is set, the last element is the synthetic
    /// error frame (`Frame::error` set).
    pub frames: Vec<Frame>,
    /// Why the walk stopped early, if it did.
    pub error: Option<UnwindErrorKind>,
}

impl UnwindResult {
    /// The real frames (without the synthetic error frame).
    pub fn real_frames(&self) -> &[Frame] {
        match self.frames.last() {
            Some(f) if f.error.is_some() => &self.frames[..self.frames.len() - 1],
            _ => &self.frames,
        }
    }
}

/// The addresses of one unwound sample, without mappings: what
/// [`ProcessContext::unwind_raw`](crate::ProcessContext::unwind_raw) fills in.
///
/// Reuse one value for many samples: its vector keeps its capacity, so the
/// hot path allocates nothing.
#[derive(Debug, Clone, Default)]
pub struct RawUnwind {
    /// Absolute pcs, leaf first, leading client-library frames dropped.
    pub pcs: Vec<u64>,
    /// Whether `pcs[0]` is a return address (looked up at `pc - 1`): true
    /// unless the first frame of the walk (the interrupted pc) was kept.
    /// Every later entry is a return address.
    pub leaf_is_return: bool,
    /// Why the walk stopped early: a framehop error (classified), the frame
    /// limit, or bad registers. Never [`UnwindErrorKind::InvalidMap`]: the
    /// walk does not look pcs up in the mappings (see
    /// [`ProcessContext::resolve_pc`](crate::ProcessContext::resolve_pc)).
    pub error: Option<UnwindErrorKind>,
}

impl RawUnwind {
    /// The address to symbolize of frame `i`: its pc for the interrupted
    /// pc, `pc - 1` (the call instruction) for return addresses.
    #[inline]
    pub fn lookup_pc(&self, i: usize) -> u64 {
        let pc = self.pcs[i];
        if i == 0 && !self.leaf_is_return {
            pc
        } else {
            pc.wrapping_sub(1)
        }
    }
}
