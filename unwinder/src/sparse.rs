//! A module's file read in part: for unwinding, and (more of it) once it
//! is symbolized ([`ModuleBytes`]).
//!
//! Unwinding needs an ELF file's headers, notes (the build id) and its
//! CFI (`.eh_frame`, `.eh_frame_hdr`, `.debug_frame`); a large binary is
//! mostly other things (node: 98 MB, of which those are 3.3 MB). The part
//! is read into a zero-filled buffer of the file's length, so every offset
//! parses as in the file and the pages never read cost nothing (a large
//! `calloc` is fresh anonymous memory); the rest reads as zeros, which
//! nothing of unwinding looks at. Symbolization needs symbol
//! tables and DWARF, so the first symbol lookup reads, from the descriptor
//! opened at the handshake, once, every section that is not part of the
//! loaded image (`.symtab`, `.debug_*`, `.gnu_debugdata`, links...) plus
//! the dynamic symbol table and its strings; code and data (node: 75 of
//! its 98 MB) stay unread.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, OnceLock};

use object::Endianness;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};

use crate::elf::{FileBytes, READ_LIMIT};

/// Files below this size are read whole: a partial read saves little.
const SPARSE_MIN: u64 = 256 << 10;

/// The sections unwinding reads (see [`crate::elf::parse_elf`]).
const UNWIND_SECTIONS: &[&[u8]] = &[b".eh_frame", b".eh_frame_hdr", b".debug_frame"];

/// Which sections a partial read reads (besides headers and notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The CFI ([`UNWIND_SECTIONS`]).
    Unwind,
    /// The CFI, and every section symbolization may read: those not
    /// loaded (`SHF_ALLOC` clear) and the loaded symbol and string tables.
    Symbols,
}

/// A module's bytes: what unwinding reads now, what symbols need later.
#[derive(Debug)]
pub struct ModuleBytes {
    unwind: Arc<FileBytes>,
    /// The file, when `unwind` holds only part of it.
    file: Option<File>,
    symbols: OnceLock<Arc<FileBytes>>,
}

impl ModuleBytes {
    /// Bytes that are already the whole image (the vDSO, a file read whole).
    pub fn complete(bytes: Arc<FileBytes>) -> ModuleBytes {
        ModuleBytes {
            unwind: bytes,
            file: None,
            symbols: OnceLock::new(),
        }
    }

    /// Reads `file` for unwinding: in part when it is a large ELF file
    /// whose headers parse, else whole ([`FileBytes::map`]).
    pub fn read(file: &File) -> io::Result<ModuleBytes> {
        let len = file.metadata()?.len();
        if !(SPARSE_MIN..=READ_LIMIT).contains(&len) {
            return Ok(ModuleBytes::complete(Arc::new(FileBytes::map(file)?)));
        }
        match read_parts(file, len, Part::Unwind)? {
            Some(buf) => Ok(ModuleBytes {
                unwind: Arc::new(FileBytes::Owned(buf)),
                file: Some(file.try_clone()?),
                symbols: OnceLock::new(),
            }),
            None => Ok(ModuleBytes::complete(Arc::new(FileBytes::map(file)?))),
        }
    }

    /// What unwinding parses: every header, note and unwind section at its
    /// offset in the file.
    pub fn unwind(&self) -> &Arc<FileBytes> {
        &self.unwind
    }

    /// What symbolization parses, read at the first call: the unwind
    /// bytes plus the symbol tables, DWARF and the rest of the sections not
    /// loaded, at their offsets (the unwind bytes if that read fails: the
    /// file changed meanwhile; symbols are then missing).
    pub fn symbols(&self) -> Arc<FileBytes> {
        let Some(file) = &self.file else {
            return Arc::clone(&self.unwind);
        };
        let len = self.unwind.len() as u64;
        Arc::clone(
            self.symbols
                .get_or_init(|| match read_parts(file, len, Part::Symbols) {
                    Ok(Some(b)) if file.metadata().is_ok_and(|m| m.len() == len) => {
                        Arc::new(FileBytes::Owned(b))
                    }
                    _ => Arc::clone(&self.unwind),
                }),
        )
    }

    /// The file's length.
    pub(crate) fn len(&self) -> usize {
        self.unwind.len()
    }

    /// Whether only part of the file is read yet.
    #[cfg(test)]
    fn is_partial(&self) -> bool {
        self.file.is_some() && self.symbols.get().is_none()
    }
}

/// The file's headers, notes and the sections of `part` in a zero-filled
/// buffer of its length; `None` when it is not an ELF file whose headers
/// parse.
fn read_parts(file: &File, len: u64, part: Part) -> io::Result<Option<Vec<u8>>> {
    let Ok(n) = usize::try_from(len) else {
        return Ok(None);
    };
    let mut buf = vec![0u8; n];
    let head = n.min(4096);
    file.read_exact_at(&mut buf[..head], 0)?;
    let wide = buf.get(4) == Some(&2);
    let parts = if wide {
        part_ranges::<object::elf::FileHeader64<Endianness>>(file, &mut buf, part)?
    } else {
        part_ranges::<object::elf::FileHeader32<Endianness>>(file, &mut buf, part)?
    };
    Ok(parts.then_some(buf))
}

/// Reads into `buf` (the file's first page already there) its program and
/// section headers, the section names, and then the notes and the
/// sections of `part`. False when the headers do not parse.
fn part_ranges<H: FileHeader<Endian = Endianness>>(
    file: &File,
    buf: &mut [u8],
    part: Part,
) -> io::Result<bool> {
    let header: H = match H::parse(&*buf) {
        Ok(h) => *h,
        Err(_) => return Ok(false),
    };
    let Ok(endian) = header.endian() else {
        return Ok(false);
    };
    let phoff = header.e_phoff(endian).into();
    let phsize = u64::from(header.e_phnum(endian)) * u64::from(header.e_phentsize(endian));
    read_range(file, buf, phoff, phsize)?;
    let shoff: u64 = header.e_shoff(endian).into();
    let shentsize = u64::from(header.e_shentsize(endian));
    // An extended section count is in section 0's sh_size.
    read_range(file, buf, shoff, shentsize)?;
    let Ok(shnum) = header.shnum(endian, &*buf) else {
        return Ok(false);
    };
    read_range(file, buf, shoff, shnum as u64 * shentsize)?;
    let mut ranges: Vec<Range<u64>> = Vec::new();
    let mut unwind_found = false;
    if let Ok(phdrs) = header.program_headers(endian, &*buf) {
        for p in phdrs {
            if p.p_type(endian) == object::elf::PT_NOTE {
                let off: u64 = p.p_offset(endian).into();
                ranges.push(off..off.saturating_add(p.p_filesz(endian).into()));
            }
        }
    }
    let Ok(shstrndx) = header.shstrndx(endian, &*buf) else {
        return Ok(false);
    };
    let names_at = header
        .section_headers(endian, &*buf)
        .ok()
        .and_then(|h| h.get(shstrndx as usize))
        .and_then(|s| s.file_range(endian));
    if let Some((off, size)) = names_at {
        read_range(file, buf, off, size)?;
    }
    let Ok(sections) = header.sections(endian, &*buf) else {
        return Ok(false);
    };
    for s in sections.iter() {
        let Some((off, size)) = s.file_range(endian) else {
            continue; // SHT_NOBITS
        };
        let kind = s.sh_type(endian);
        let flags = s.sh_flags(endian).0;
        let cfi = sections
            .section_name(endian, s)
            .is_ok_and(|n| UNWIND_SECTIONS.contains(&n));
        unwind_found |= cfi;
        let wanted = kind == object::elf::SHT_NOTE
            || cfi
            || (part == Part::Symbols
                && (flags & object::elf::SHF_ALLOC.0 == 0
                    || matches!(
                        kind,
                        object::elf::SHT_SYMTAB | object::elf::SHT_DYNSYM | object::elf::SHT_STRTAB
                    )));
        if wanted {
            ranges.push(off..off.saturating_add(size));
        }
    }
    if !unwind_found {
        // No CFI section by name (section headers stripped, say): what
        // unwinding reads is found otherwise (`PT_GNU_EH_FRAME`), so the
        // file is read whole.
        return Ok(false);
    }
    for r in ranges {
        read_range(file, buf, r.start, r.end - r.start)?;
    }
    Ok(true)
}

/// Reads `size` bytes at `off` into the same place of `buf`, clamped to the
/// buffer (a header that points past the end reads what there is).
fn read_range(file: &File, buf: &mut [u8], off: u64, size: u64) -> io::Result<()> {
    let start = usize::try_from(off).unwrap_or(usize::MAX).min(buf.len());
    let end = usize::try_from(off.saturating_add(size))
        .unwrap_or(usize::MAX)
        .min(buf.len());
    if start < end {
        file.read_exact_at(&mut buf[start..end], off)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::parse_elf;

    /// The largest ELF file of a few the test machine surely has.
    fn big_elf() -> Option<std::path::PathBuf> {
        [
            "/usr/bin/node",
            "/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1",
            "/usr/bin/gdb",
        ]
        .iter()
        .map(std::path::PathBuf::from)
        .chain(std::env::current_exe().ok())
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.len() >= SPARSE_MIN))
    }

    #[test]
    fn a_partial_read_parses_as_the_whole_file_for_unwinding() {
        let Some(path) = big_elf() else {
            eprintln!("no ELF file of {SPARSE_MIN} bytes or more here");
            return;
        };
        let file = File::open(&path).unwrap();
        let part = ModuleBytes::read(&file).unwrap();
        assert!(part.is_partial(), "{} read whole", path.display());
        let whole = Arc::new(FileBytes::map(&file).unwrap());
        let a = parse_elf(part.unwind()).unwrap();
        let b = parse_elf(&whole).unwrap();
        assert_eq!(a.build_id, b.build_id);
        assert!(b.build_id.is_some(), "{} has no build id", path.display());
        assert_eq!(a.segments, b.segments);
        assert_eq!(a.load_bias, b.load_bias);
        let u = (&a.unwind, &b.unwind);
        assert_eq!(u.0.text_svma, u.1.text_svma);
        assert_eq!(u.0.got_svma, u.1.got_svma);
        let bytes = |s: &Option<crate::elf::SectionBytes>| s.as_ref().map(|s| s.to_vec());
        let pair = |s: &Option<(Range<u64>, crate::elf::SectionBytes)>| {
            s.as_ref().map(|(r, b)| (r.clone(), b.to_vec()))
        };
        assert!(u.1.eh_frame.is_some());
        assert_eq!(pair(&u.0.eh_frame), pair(&u.1.eh_frame));
        assert_eq!(pair(&u.0.eh_frame_hdr), pair(&u.1.eh_frame_hdr));
        assert_eq!(bytes(&u.0.debug_frame), bytes(&u.1.debug_frame));
        // Symbols read more, once.
        let syms = part.symbols();
        assert!(!part.is_partial());
        assert!(Arc::ptr_eq(&syms, &part.symbols()));
        assert_same_for_symbols(&syms, &whole);
    }

    /// Everything symbolization reads is the same in `part` as in `whole`:
    /// the symbols of both tables, and each section not loaded.
    fn assert_same_for_symbols(part: &[u8], whole: &[u8]) {
        use object::{Object, ObjectSection, ObjectSymbol};
        let a = object::File::parse(part).unwrap();
        let b = object::File::parse(whole).unwrap();
        let list = |f: &object::File<'_>| -> Vec<(u64, u64, String)> {
            f.symbols()
                .chain(f.dynamic_symbols())
                .map(|s| (s.address(), s.size(), s.name().unwrap_or("?").to_owned()))
                .collect()
        };
        let (la, lb) = (list(&a), list(&b));
        assert!(lb.len() > 100, "{} symbols", lb.len());
        assert_eq!(la, lb);
        let mut unloaded = 0;
        for (sa, sb) in a.sections().zip(b.sections()) {
            assert_eq!(sa.name().ok(), sb.name().ok());
            let loaded = match sb.flags() {
                object::SectionFlags::Elf { sh_flags, .. } => {
                    sh_flags.0 & object::elf::SHF_ALLOC.0 != 0
                }
                _ => true,
            };
            if !loaded {
                unloaded += 1;
                assert_eq!(sa.data().ok(), sb.data().ok(), "{:?}", sb.name());
            }
        }
        assert!(unloaded > 0);
        // And code was not read: the part is smaller in what it holds.
        let held = |d: &[u8]| d.iter().filter(|&&x| x != 0).count();
        assert!(
            held(part) < held(whole),
            "the symbol part holds the whole file"
        );
    }

    /// A stripped library (`.dynsym` only) and the JVM, where present.
    #[test]
    fn the_symbol_part_of_other_large_files_reads_as_the_whole_file() {
        let others = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1",
            "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so",
        ];
        for path in others.iter().filter(|p| std::path::Path::new(p).exists()) {
            let file = File::open(path).unwrap();
            let part = ModuleBytes::read(&file).unwrap();
            assert!(part.is_partial(), "{path} read whole");
            let whole = FileBytes::map(&file).unwrap();
            assert_same_for_symbols(&part.symbols(), &whole);
        }
    }

    /// A file whose section headers are gone (`e_shoff` and `e_shnum` 0)
    /// names no CFI section: read whole, where unwinding finds its CFI
    /// through the program headers.
    #[test]
    fn a_file_without_section_headers_is_read_whole() {
        let Ok(mut bytes) = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6") else {
            return;
        };
        bytes[0x28..0x30].fill(0);
        bytes[0x3c..0x3e].fill(0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-sections.so");
        std::fs::write(&path, &bytes).unwrap();
        let m = ModuleBytes::read(&File::open(&path).unwrap()).unwrap();
        assert!(!m.is_partial());
        assert_eq!(&m.unwind()[..], &bytes[..]);
    }

    #[test]
    fn small_and_non_elf_files_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk");
        std::fs::write(&junk, vec![0x7fu8; (SPARSE_MIN + 4096) as usize]).unwrap();
        let m = ModuleBytes::read(&File::open(&junk).unwrap()).unwrap();
        assert!(!m.is_partial());
        assert_eq!(m.unwind().len() as u64, SPARSE_MIN + 4096);
        let small = dir.path().join("small");
        std::fs::write(&small, b"\x7fELF").unwrap();
        let m = ModuleBytes::read(&File::open(&small).unwrap()).unwrap();
        assert!(!m.is_partial());
        assert_eq!(&m.symbols()[..], b"\x7fELF");
    }
}
