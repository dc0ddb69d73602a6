//! What we keep from an ELF file for unwinding: build id, `PT_LOAD`
//! segments, and the unwind sections framehop reads, as zero-copy ranges.
//!
//! Vocabulary (as in framehop and samply): an **SVMA** is an address as
//! stated in the ELF file (a "virtual address" of its program headers and
//! symbols); an **AVMA** is an address in the profiled process. For one
//! mapping of the file, `avma = svma + bias`. The bias is computed from the
//! program headers ([`compute_bias`]), not as `mapping.start - offset`: the
//! two differ when a segment's `p_vaddr - p_offset` is not a multiple of the
//! page size relative to the first segment (the "SVMA gap" that e.g. rustc
//! and lld binaries have).

use std::fs::File;
use std::ops::{Deref, Range};
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, SegmentFlags};

/// The bytes of a module: owned bytes (files read into memory, the vDSO,
/// decompressed data), or a read-only mapping of a very large file.
#[derive(Debug)]
pub enum FileBytes {
    /// `mmap` of the file.
    Mmap(memmap2::Mmap),
    /// Bytes held in memory.
    Owned(Vec<u8>),
}

/// Files up to this size are read into memory rather than mapped.
pub const READ_LIMIT: u64 = 512 << 20;

/// Opens a file for reading without blocking in `open` (a FIFO someone put
/// at a profiled process's path would otherwise wait for a writer
/// forever); callers take only regular files ([`FileBytes::map`]'s users
/// check). `O_NONBLOCK` changes nothing for reads of a regular file.
pub fn open_nonblocking(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

impl FileBytes {
    /// Loads a whole file: read into memory when it is at most
    /// [`READ_LIMIT`] bytes (practically every binary and debug file), mapped
    /// read-only above that.
    ///
    /// Reading rather than mapping is what keeps the daemon alive when a
    /// profiled program's file is truncated or rewritten in place while we
    /// hold it (a `cp` over a library, a rebuild): a read copy is ours, while
    /// touching a mapping of the shrunk file would kill the daemon with
    /// SIGBUS and lose every session's data. Only files above the limit keep
    /// that residual risk, as in samply and libunwindstack.
    pub fn map(file: &File) -> std::io::Result<FileBytes> {
        use std::os::unix::fs::FileExt;
        let len = file.metadata()?.len();
        if len <= READ_LIMIT {
            let mut buf = vec![0u8; len as usize];
            file.read_exact_at(&mut buf, 0)?;
            return Ok(FileBytes::Owned(buf));
        }
        // SAFETY: the mapping is read-only and private; we never hand out
        // mutable access. The residual risk (the file truncated underneath
        // us) is documented above.
        let m = unsafe { memmap2::Mmap::map(file)? };
        Ok(FileBytes::Mmap(m))
    }
}

impl Deref for FileBytes {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mmap(m) => m,
            FileBytes::Owned(v) => v,
        }
    }
}

/// DWARF sections read in place: a range of the (debug) file's bytes, or
/// the decompressed bytes of a compressed section, never a copy of either.
pub(crate) type DwarfReader = gimli::EndianReader<gimli::RunTimeEndian, SectionBytes>;

/// A byte range of a [`FileBytes`], cheap to clone; framehop's section type.
#[derive(Debug, Clone)]
pub struct SectionBytes {
    file: Arc<FileBytes>,
    range: Range<usize>,
}

impl SectionBytes {
    /// A range of `file`; `None` if it is out of bounds.
    pub fn new(file: &Arc<FileBytes>, offset: u64, size: u64) -> Option<SectionBytes> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(size).ok()?)?;
        file.get(start..end)?;
        Some(SectionBytes {
            file: Arc::clone(file),
            range: start..end,
        })
    }

    /// Owned bytes (for decompressed sections).
    pub fn owned(bytes: Vec<u8>) -> SectionBytes {
        let len = bytes.len();
        SectionBytes {
            file: Arc::new(FileBytes::Owned(bytes)),
            range: 0..len,
        }
    }
}

impl Deref for SectionBytes {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // The range was checked at construction and the bytes never change.
        self.file.get(self.range.clone()).unwrap_or(&[])
    }
}

// SAFETY: the bytes live in the `FileBytes` behind the `Arc` (a `Vec`'s heap
// buffer or a mapping), which is never mutated or moved while any clone
// holds it, so `deref` gives the same address for a value, its moves and its
// clones; gimli's `EndianReader` (DWARF read in place) relies on that.
unsafe impl gimli::StableDeref for SectionBytes {}
// SAFETY: as above; clones share the `Arc`.
unsafe impl gimli::CloneStableDeref for SectionBytes {}

/// One `PT_LOAD` program header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSegment {
    /// `p_vaddr`.
    pub vaddr: u64,
    /// `p_memsz`.
    pub memsz: u64,
    /// `p_offset`.
    pub offset: u64,
    /// `p_filesz`.
    pub filesz: u64,
    /// `p_flags & PF_X`.
    pub exec: bool,
}

/// Computes `bias = avma - svma` for a mapping of a file with these segments.
///
/// The segment is the `PT_LOAD` whose file range overlaps the mapping's file
/// range (preferring one whose executability matches the mapping). The byte
/// at file offset `p_offset` sits at `start + (p_offset - map_offset)` in the
/// process, and at `p_vaddr` in the file's address space. Returns `None` when
/// no segment overlaps (the caller then falls back to `start - offset`).
pub fn compute_bias(
    segments: &[LoadSegment],
    map_start: u64,
    map_end: u64,
    map_offset: u64,
    map_exec: bool,
) -> Option<u64> {
    let map_len = map_end.checked_sub(map_start)?;
    let map_file_end = map_offset.saturating_add(map_len);
    let overlaps = |s: &&LoadSegment| {
        s.filesz > 0 && s.offset < map_file_end && map_offset < s.offset.saturating_add(s.filesz)
    };
    let seg = segments
        .iter()
        .filter(overlaps)
        .find(|s| s.exec == map_exec)
        .or_else(|| segments.iter().find(overlaps))?;
    let seg_avma = map_start.wrapping_add(seg.offset.wrapping_sub(map_offset));
    Some(seg_avma.wrapping_sub(seg.vaddr))
}

/// Unwind sections for framehop, with their SVMA ranges.
#[derive(Debug, Clone, Default)]
pub struct UnwindSections {
    /// `.text` range. Its bytes are not kept: framehop analyzes
    /// instructions only in mach-O files (ELF's CFI covers prologues and
    /// epilogues), and not reading them is most of what
    /// [`crate::sparse::ModuleBytes`] saves.
    pub text_svma: Option<Range<u64>>,
    /// `.got` range.
    pub got_svma: Option<Range<u64>>,
    /// `.eh_frame` range and bytes.
    pub eh_frame: Option<(Range<u64>, SectionBytes)>,
    /// `.eh_frame_hdr` range and bytes.
    pub eh_frame_hdr: Option<(Range<u64>, SectionBytes)>,
    /// `.debug_frame` bytes (used only when there is no `.eh_frame`).
    pub debug_frame: Option<SectionBytes>,
}

impl UnwindSections {
    /// Whether framehop has any CFI for this module.
    pub fn has_cfi(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some()
    }

    /// framehop's view of the sections.
    pub fn to_framehop(&self, base_svma: u64) -> framehop::ExplicitModuleSectionInfo<SectionBytes> {
        framehop::ExplicitModuleSectionInfo {
            base_svma,
            text_svma: self.text_svma.clone(),
            text: None,
            got_svma: self.got_svma.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|e| e.0.clone()),
            eh_frame: self.eh_frame.as_ref().map(|e| e.1.clone()),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|e| e.0.clone()),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|e| e.1.clone()),
            debug_frame: self.debug_frame.clone(),
            stubs_svma: None,
            stub_helper_svma: None,
            unwind_info: None,
            text_segment_svma: None,
            text_segment: None,
        }
    }
}

/// The parts of an ELF file that unwinding and mapping description need.
#[derive(Debug, Clone)]
pub struct ElfInfo {
    /// `NT_GNU_BUILD_ID` bytes.
    pub build_id: Option<Arc<[u8]>>,
    /// `PT_LOAD` headers in file order.
    pub segments: Vec<LoadSegment>,
    /// SVMA of the first `PT_LOAD` (0 for PIE and shared objects).
    pub base_svma: u64,
    /// `p_vaddr - p_offset` of the first executable `PT_LOAD` (Perfetto's and
    /// libunwindstack's "load bias"; wrapping arithmetic).
    pub load_bias: u64,
    /// Sections framehop reads.
    pub unwind: UnwindSections,
}

/// Why an ELF could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfError(pub String);

impl std::fmt::Display for ElfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid ELF: {}", self.0)
    }
}

impl std::error::Error for ElfError {}

/// Extracts [`ElfInfo`] from the bytes of an ELF file (or an in-memory image
/// such as the vDSO, whose section addresses equal their offsets).
pub fn parse_elf(bytes: &Arc<FileBytes>) -> Result<ElfInfo, ElfError> {
    let file = object::File::parse(&***bytes).map_err(|e| ElfError(e.to_string()))?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(ElfError("not an ELF file".into()));
    }
    let build_id = file.build_id().ok().flatten().map(Arc::<[u8]>::from);
    let mut segments = Vec::new();
    for seg in file.segments() {
        let (p_type, p_flags) = match seg.flags() {
            SegmentFlags::Elf { p_type, p_flags } => (p_type.0, p_flags.0),
            _ => continue,
        };
        if p_type != 1 {
            continue; // PT_LOAD only
        }
        let (offset, filesz) = seg.file_range();
        segments.push(LoadSegment {
            vaddr: seg.address(),
            memsz: seg.size(),
            offset,
            filesz,
            exec: p_flags & 1 != 0,
        });
    }
    if segments.is_empty() {
        return Err(ElfError("no PT_LOAD segment".into()));
    }
    let base_svma = segments.iter().map(|s| s.vaddr).min().unwrap_or(0);
    let load_bias = segments
        .iter()
        .find(|s| s.exec)
        .map(|s| s.vaddr.wrapping_sub(s.offset))
        .unwrap_or(0);

    let section = |name: &str| -> Option<(Range<u64>, SectionBytes)> {
        let s = file.section_by_name(name)?;
        let svma = s.address()..s.address().checked_add(s.size())?;
        let range = s.compressed_file_range().ok()?;
        let data = if range.format == object::CompressionFormat::None {
            SectionBytes::new(bytes, range.offset, range.uncompressed_size)?
        } else {
            SectionBytes::owned(s.uncompressed_data().ok()?.into_owned())
        };
        Some((svma, data))
    };
    let unwind = UnwindSections {
        text_svma: file
            .section_by_name(".text")
            .map(|s| s.address()..s.address().saturating_add(s.size())),
        got_svma: file
            .section_by_name(".got")
            .map(|s| s.address()..s.address().saturating_add(s.size())),
        eh_frame: section(".eh_frame").filter(|s| !s.1.is_empty()),
        eh_frame_hdr: section(".eh_frame_hdr").filter(|s| !s.1.is_empty()),
        debug_frame: section(".debug_frame")
            .map(|s| s.1)
            .filter(|s| !s.is_empty()),
    };
    Ok(ElfInfo {
        build_id,
        segments,
        base_svma,
        load_bias,
        unwind,
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_loaded_file_survives_truncation() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("hp-elf-trunc-{}", std::process::id()));
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![0xabu8; 1 << 20]).unwrap();
        drop(f);
        let file = File::open(&path).unwrap();
        let bytes = FileBytes::map(&file).unwrap();
        // Someone rewrites the file in place: with a mapping, reading the
        // now-missing pages would raise SIGBUS and kill the daemon.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        assert!(bytes.iter().all(|&b| b == 0xab));
        std::fs::remove_file(&path).unwrap();
    }

    use super::*;

    fn seg(vaddr: u64, offset: u64, size: u64, exec: bool) -> LoadSegment {
        LoadSegment {
            vaddr,
            memsz: size,
            offset,
            filesz: size,
            exec,
        }
    }

    #[test]
    fn bias_pie() {
        // Typical gcc PIE: r--, r-x, r--, rw- with vaddr == offset.
        let segs = [
            seg(0, 0, 0x628, false),
            seg(0x1000, 0x1000, 0x1b5, true),
            seg(0x2000, 0x2000, 0x104, false),
            seg(0x3de8, 0x2de8, 0x248, false),
        ];
        let b = compute_bias(&segs, 0x5555_5555_5000, 0x5555_5555_6000, 0x1000, true);
        assert_eq!(b, Some(0x5555_5555_4000));
    }

    #[test]
    fn bias_non_pie() {
        let segs = [
            seg(0x400000, 0, 0x4e8, false),
            seg(0x401000, 0x1000, 0x1a5, true),
        ];
        assert_eq!(
            compute_bias(&segs, 0x401000, 0x402000, 0x1000, true),
            Some(0)
        );
        assert_eq!(compute_bias(&segs, 0x400000, 0x401000, 0, false), Some(0));
    }

    #[test]
    fn bias_svma_gap() {
        // rustc/lld layout: the R+X segment's vaddr is 0x1000 above its file
        // offset (0x49740 in the file, 0x4a740 in memory). The kernel maps it
        // from the page-aligned offset 0x49000.
        let segs = [
            seg(0, 0, 0x49740, false),
            seg(0x4a740, 0x49740, 0x9a000, true),
        ];
        let start = 0x555c_fe31_4000;
        let b = compute_bias(&segs, start, start + 0x9b000, 0x49000, true).unwrap();
        assert_eq!(b, 0x555c_fe2c_a000);
        // The naive start - offset would be off by a page.
        assert_ne!(b, start - 0x49000);
        // rel_pc of the first byte of the segment is its p_vaddr.
        assert_eq!(start + 0x740 - b, 0x4a740);
    }

    #[test]
    fn bias_no_overlap_or_bad_mapping() {
        let segs = [seg(0, 0, 0x1000, true)];
        assert_eq!(compute_bias(&segs, 0x1000, 0x2000, 0x10_0000, true), None);
        assert_eq!(compute_bias(&segs, 0x2000, 0x1000, 0, true), None);
        assert_eq!(compute_bias(&[], 0x1000, 0x2000, 0, true), None);
    }

    #[test]
    fn hostile_elf_bytes() {
        for bytes in [
            Vec::new(),
            b"\x7fELF".to_vec(),
            vec![0xff; 4096],
            b"\x7fELF\x02\x01\x01"
                .iter()
                .copied()
                .chain([0u8; 64])
                .collect(),
        ] {
            let b = Arc::new(FileBytes::Owned(bytes));
            assert!(parse_elf(&b).is_err());
        }
        assert!(SectionBytes::new(&Arc::new(FileBytes::Owned(vec![1, 2])), 1, 5).is_none());
        assert!(SectionBytes::new(&Arc::new(FileBytes::Owned(vec![1, 2])), u64::MAX, 5).is_none());
    }

    #[test]
    fn parses_own_executable() {
        let f = File::open("/proc/self/exe").unwrap();
        let b = Arc::new(FileBytes::map(&f).unwrap());
        let info = parse_elf(&b).unwrap();
        assert!(info.segments.iter().any(|s| s.exec));
        assert!(info.unwind.eh_frame.is_some());
        assert!(info.unwind.eh_frame_hdr.is_some());
        assert!(info.build_id.is_some());
    }
}
