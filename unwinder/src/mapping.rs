//! [`Mapping`]: one mapping of a profiled process, with what a Perfetto
//! `Mapping` needs and the parsed module behind it; and the lookup of an
//! address in a sorted list of them.

use std::sync::Arc;

use crate::cache::Module;
use crate::maps::{self, MapEntry};

/// One mapping of the process, with what a Perfetto `Mapping` needs.
#[derive(Debug, Clone)]
pub struct Mapping {
    /// First address (AVMA).
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset of `start` (Perfetto `exact_offset`).
    pub offset: u64,
    /// File offset of the first mapping of the same file (Perfetto
    /// `start_offset`; 0 except for libraries inside an archive such as an APK).
    pub start_offset: u64,
    /// Executable mapping.
    pub exec: bool,
    /// Path or pseudo-name from the maps line (empty for anonymous memory).
    pub path: String,
    /// `p_vaddr - p_offset` of the executable `PT_LOAD` (Perfetto `load_bias`).
    pub load_bias: u64,
    /// Build id bytes (raw, not hex), when the module has one.
    pub build_id: Option<Arc<[u8]>>,
    /// The parsed ELF, for executable file-backed mappings (and the vDSO).
    pub module: Option<Arc<Module>>,
    /// `avma - svma` for this mapping of the module.
    pub avma_bias: u64,
    /// Device and inode from the maps line.
    pub dev_inode: (u32, u32, u64),
}

impl Mapping {
    /// ELF virtual address of an address in this mapping (a frame's
    /// `rel_pc`); without a parsed ELF, the file offset of the address.
    #[inline]
    pub fn rel_pc(&self, avma: u64) -> u64 {
        avma.wrapping_sub(self.avma_bias)
    }

    /// Whether framehop has DWARF CFI for this mapping.
    pub fn has_unwind_info(&self) -> bool {
        self.module.as_ref().is_some_and(|m| m.elf.unwind.has_cfi())
    }

    /// Whether this mapping is the one `e` describes (same range, offset,
    /// permissions, file and path): kept across a re-read of the maps.
    pub(crate) fn same_as(&self, e: &MapEntry) -> bool {
        self.start == e.start
            && self.end == e.end
            && self.offset == e.offset
            && self.exec == e.exec
            && self.dev_inode == (e.dev_major, e.dev_minor, e.inode)
            && self.path == e.path
    }
}

/// The mapping containing `addr` in `mappings` (sorted, non-overlapping).
#[inline]
pub(crate) fn mapping_at(mappings: &[Arc<Mapping>], addr: u64) -> Option<&Arc<Mapping>> {
    let i = maps::find_entry(mappings, addr, |m| (m.start, m.end))?;
    mappings.get(i)
}
