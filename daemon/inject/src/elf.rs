//! ELF facts about the target's files: architecture, symbols, load bias.
//!
//! Everything is read from the files the *target* mapped (through
//! `/proc/PID/map_files/` when the kernel lets us, so a file replaced on
//! disk since is still the right one, else through its path); nothing
//! assumes the daemon's own libc is the same file.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use heapprofd_unwinder::{LoadSegment, MapEntry, compute_bias};
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use crate::error::{InjectError, Result};

/// `e_machine` of x86-64 and AArch64.
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

/// The `e_machine` this daemon was built for.
pub(crate) fn native_machine() -> u16 {
    if cfg!(target_arch = "aarch64") {
        EM_AARCH64
    } else {
        EM_X86_64
    }
}

/// A readable name for an ELF class and machine.
pub(crate) fn machine_name(class64: bool, machine: u16) -> String {
    let name = match machine {
        3 => "i386",
        8 => "MIPS",
        20 => "PowerPC",
        21 => "PowerPC64",
        40 => "ARM (32-bit)",
        EM_X86_64 if !class64 => return "x32".to_string(),
        EM_X86_64 => "x86_64",
        EM_AARCH64 => "aarch64",
        243 => "RISC-V",
        _ => return format!("ELF machine {machine}"),
    };
    if class64 || machine == 3 || machine == 40 {
        name.to_string()
    } else {
        format!("{name} (32-bit)")
    }
}

/// Reads the class (64-bit?) and machine from an ELF header.
pub(crate) fn elf_class_machine(header: &[u8]) -> Option<(bool, u16)> {
    if header.len() < 20 || &header[..4] != b"\x7fELF" {
        return None;
    }
    let class64 = header[4] == 2;
    let le = header[5] == 1;
    let m = [header[18], header[19]];
    let machine = if le {
        u16::from_le_bytes(m)
    } else {
        u16::from_be_bytes(m)
    };
    Some((class64, machine))
}

/// A file the target has mapped, with where it is loaded.
#[derive(Debug, Clone)]
pub(crate) struct LoadedObject {
    /// Path as the target's maps show it.
    pub path: String,
    /// Load bias (`avma - svma`).
    pub bias: u64,
    /// Every mapping of the file, `(start, end)`.
    pub ranges: Vec<(u64, u64)>,
    /// Where we read the file from.
    pub read_from: PathBuf,
}

impl LoadedObject {
    /// Finds the first file mapped by the target whose path satisfies
    /// `pred`, and computes its load bias from its program headers.
    pub(crate) fn find(
        pid: u32,
        maps: &[MapEntry],
        pred: impl Fn(&str) -> bool,
    ) -> Result<Option<LoadedObject>> {
        let Some(first) = maps.iter().find(|m| m.is_file() && pred(&m.path)) else {
            return Ok(None);
        };
        let same = |m: &&MapEntry| m.inode == first.inode && m.path == first.path;
        let ranges: Vec<(u64, u64)> = maps.iter().filter(same).map(|m| (m.start, m.end)).collect();
        let read_from = readable_path(pid, first);
        let (segments, _) = read_program_headers(&read_from).map_err(|e| {
            InjectError::io(
                format!(
                    "reading the ELF header of {} (mapped by the target)",
                    first.path
                ),
                e,
            )
        })?;
        let bias = compute_bias(&segments, first.start, first.end, first.offset, first.exec)
            .unwrap_or(first.start.wrapping_sub(first.offset));
        Ok(Some(LoadedObject {
            path: first.path.clone(),
            bias,
            ranges,
            read_from,
        }))
    }

    /// The object's symbols (`.dynsym` and `.symtab`).
    pub(crate) fn symbols(&self) -> Result<Symbols> {
        Symbols::read(&self.read_from)
    }
}

/// The `PT_LOAD` segments and `e_type` of a 64-bit little-endian ELF file,
/// from its first bytes only (the file may be a 100 MB program). A file that
/// is not one is an `InvalidData` error.
pub(crate) fn read_program_headers(path: &Path) -> io::Result<(Vec<LoadSegment>, u16)> {
    use std::os::unix::fs::FileExt;
    let f = File::open(path)?;
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0)?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return Err(invalid("not a 64-bit little-endian ELF file"));
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
    let e_type = u16_at(&h, 16);
    let phoff = u64_at(&h, 32);
    let phentsize = u16_at(&h, 54) as usize;
    let phnum = u16_at(&h, 56) as usize;
    if phentsize < 56 || phnum > 4096 {
        return Err(invalid("bad program header table"));
    }
    let mut ph = vec![0u8; phentsize * phnum];
    f.read_exact_at(&mut ph, phoff)?;
    let mut out = Vec::new();
    for e in ph.chunks_exact(phentsize) {
        // PT_LOAD
        if u32_at(e, 0) != 1 {
            continue;
        }
        out.push(LoadSegment {
            vaddr: u64_at(e, 16),
            memsz: u64_at(e, 40),
            offset: u64_at(e, 8),
            filesz: u64_at(e, 32),
            exec: u32_at(e, 4) & 1 != 0, // PF_X
        });
    }
    Ok((out, e_type))
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// `/proc/PID/map_files/START-END` if we may open it, else the path.
fn readable_path(pid: u32, m: &MapEntry) -> PathBuf {
    let mf = PathBuf::from(format!("/proc/{pid}/map_files/{}", m.map_files_name()));
    if File::open(&mf).is_ok() {
        mf
    } else {
        PathBuf::from(&m.path)
    }
}

pub(crate) fn load_segments(file: &object::File<'_>) -> Vec<LoadSegment> {
    let mut out = Vec::new();
    if let object::File::Elf64(elf) = file {
        use object::read::elf::ProgramHeader;
        let endian = elf.endian();
        for ph in elf.elf_program_headers() {
            if ph.p_type(endian) != object::elf::PT_LOAD {
                continue;
            }
            out.push(LoadSegment {
                vaddr: ph.p_vaddr(endian),
                memsz: ph.p_memsz(endian),
                offset: ph.p_offset(endian),
                filesz: ph.p_filesz(endian),
                exec: ph.p_flags(endian).0 & object::elf::PF_X.0 != 0,
            });
        }
    } else {
        for s in file.segments() {
            let (offset, filesz) = s.file_range();
            out.push(LoadSegment {
                vaddr: s.address(),
                memsz: s.size(),
                offset,
                filesz,
                exec: false,
            });
        }
    }
    out
}

/// Function symbols of one file: name -> (svma, size), plus every function
/// as a sorted list.
#[derive(Debug, Default)]
pub(crate) struct Symbols {
    by_name: HashMap<String, (u64, u64)>,
    /// `(svma, size, name, exported)` sorted by address.
    pub funcs: Vec<(u64, u64, String, bool)>,
    /// Build id, for finding a separate debug file.
    pub build_id: Option<Vec<u8>>,
    /// `.text`-like executable bytes with their svma (for byte searches).
    pub exec_bytes: Vec<(u64, Vec<u8>)>,
    /// The `PT_LOAD` segments (for the load bias of a new mapping).
    pub segments: Vec<LoadSegment>,
}

impl Symbols {
    /// Reads `.dynsym` and `.symtab` of `path`.
    pub(crate) fn read(path: &Path) -> Result<Symbols> {
        let data = std::fs::read(path)
            .map_err(|e| InjectError::io(format!("reading {}", path.display()), e))?;
        let file = object::File::parse(&*data).map_err(|e| {
            InjectError::io(
                format!("{} is not a valid ELF file", path.display()),
                invalid(&e.to_string()),
            )
        })?;
        let mut s = Symbols {
            build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec),
            ..Symbols::default()
        };
        for (syms, exported) in [(file.dynamic_symbols(), true), (file.symbols(), false)] {
            for sym in syms {
                if sym.kind() != SymbolKind::Text || sym.is_undefined() || sym.address() == 0 {
                    continue;
                }
                let Ok(name) = sym.name() else { continue };
                let name = name.split('@').next().unwrap_or(name).to_string();
                s.by_name
                    .entry(name.clone())
                    .or_insert((sym.address(), sym.size()));
                s.funcs.push((sym.address(), sym.size(), name, exported));
            }
        }
        s.funcs.sort_by_key(|f| (f.0, !f.3));
        s.segments = load_segments(&file);
        for seg in load_segments(&file) {
            if !seg.exec {
                continue;
            }
            let (o, n) = (seg.offset as usize, seg.filesz as usize);
            if let Some(bytes) = data.get(o..o.saturating_add(n)) {
                s.exec_bytes.push((seg.vaddr, bytes.to_vec()));
            }
        }
        Ok(s)
    }

    /// The svma of a function by exact name.
    pub(crate) fn address_of(&self, name: &str) -> Option<u64> {
        self.by_name.get(name).map(|&(a, _)| a)
    }

    /// The only function whose name contains `needle` (Rust-mangled names).
    pub(crate) fn unique_containing(&self, needle: &str) -> Option<u64> {
        let mut found = self
            .by_name
            .iter()
            .filter(|(n, _)| n.contains(needle))
            .map(|(_, &(a, _))| a);
        let first = found.next()?;
        found.all(|a| a == first).then_some(first)
    }

    /// Adds the function symbols of a separate debug file (same svmas).
    pub(crate) fn merge_debug_file(&mut self, path: &Path) {
        let Ok(debug) = Symbols::read(path) else {
            return;
        };
        for (a, size, name, _) in debug.funcs {
            self.by_name.entry(name.clone()).or_insert((a, size));
            self.funcs.push((a, size, name, false));
        }
        self.funcs.sort_by_key(|f| (f.0, !f.3));
    }

    /// Where the byte string first occurs in an executable segment (svma).
    pub(crate) fn find_bytes(&self, needle: &[u8]) -> Option<u64> {
        self.exec_bytes.iter().find_map(|(vaddr, bytes)| {
            bytes
                .windows(needle.len())
                .position(|w| w == needle)
                .map(|i| vaddr + i as u64)
        })
    }
}

/// The svma of `name` in `path`'s `.dynsym` if it is undefined there but has
/// an address: a non-PIE program's canonical PLT entry for an imported
/// function whose address it takes.
pub(crate) fn canonical_plt_entry(path: &Path, name: &str) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    // Only the section headers, .dynsym and .dynstr are read (the program
    // may be 100 MB).
    let f = File::open(path).ok()?;
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0).ok()?;
    let u16_at = |b: &[u8], o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |b: &[u8], o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |b: &[u8], o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let shoff = u64_at(&h, 40)?;
    let shentsize = u16_at(&h, 58)? as usize;
    let shnum = u16_at(&h, 60)? as usize;
    if shentsize < 64 || shnum > 65535 {
        return None;
    }
    let mut sh = vec![0u8; shentsize * shnum];
    f.read_exact_at(&mut sh, shoff).ok()?;
    let sections: Vec<&[u8]> = sh.chunks_exact(shentsize).collect();
    // SHT_DYNSYM = 11; sh_link names its string table.
    let dynsym = sections.iter().find(|s| u32_at(s, 4) == Some(11))?;
    let strtab = sections.get(u32_at(dynsym, 40)? as usize)?;
    let read = |s: &[u8]| -> Option<Vec<u8>> {
        let (off, size) = (u64_at(s, 24)?, u64_at(s, 32)?);
        if size > 256 << 20 {
            return None;
        }
        let mut buf = vec![0u8; size as usize];
        f.read_exact_at(&mut buf, off).ok()?;
        Some(buf)
    };
    let (syms, strs) = (read(dynsym)?, read(strtab)?);
    syms.chunks_exact(24).find_map(|e| {
        let name_off = u32_at(e, 0)? as usize;
        let shndx = u16_at(e, 6)?;
        let value = u64_at(e, 8)?;
        let rest = strs.get(name_off..)?;
        let n = &rest[..rest.iter().position(|&b| b == 0)?];
        (shndx == 0 && value != 0 && n == name.as_bytes()).then_some(value)
    })
}

/// The load bias of the first mapping of a file named `file_name` in
/// `maps`, from the file's segments (no file read).
pub(crate) fn bias_in_maps(
    maps: &[MapEntry],
    file_name: &str,
    segments: &[LoadSegment],
) -> Option<u64> {
    let m = maps
        .iter()
        .find(|m| m.is_file() && m.path.rsplit('/').next() == Some(file_name))?;
    Some(
        compute_bias(segments, m.start, m.end, m.offset, m.exec)
            .unwrap_or(m.start.wrapping_sub(m.offset)),
    )
}

/// The separate debug file of a build id, if installed
/// (`/usr/lib/debug/.build-id/xx/rest.debug`).
pub(crate) fn debug_file_for(build_id: &[u8]) -> Option<PathBuf> {
    let p = heapprofd_unwinder::build_id_path(Path::new("/usr/lib/debug"), build_id)?;
    p.is_file().then_some(p)
}

/// The libc this (test) process has loaded.
#[cfg(test)]
pub(crate) fn own_libc() -> LoadedObject {
    let text = std::fs::read_to_string("/proc/self/maps").unwrap();
    let maps = heapprofd_unwinder::parse_maps(&text).entries;
    LoadedObject::find(std::process::id(), &maps, |p| {
        p.rsplit('/')
            .next()
            .is_some_and(|f| f.starts_with("libc.so"))
    })
    .unwrap()
    .expect("libc is mapped")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_class_and_machine() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(
            elf_class_machine(&exe[..64]),
            Some((true, native_machine()))
        );
        assert_eq!(elf_class_machine(b"#!/bin/sh\n"), None);
        assert_eq!(machine_name(false, 3), "i386");
        assert_eq!(machine_name(true, EM_X86_64), "x86_64");
        assert_eq!(machine_name(false, EM_X86_64), "x32");
    }

    #[test]
    fn finds_dlopen_in_our_own_libc() {
        let libc = own_libc();
        let syms = libc.symbols().unwrap();
        let dlopen = syms.address_of("dlopen").expect("dlopen in libc");
        let here = libc.bias + dlopen;
        // libc's own definition (RTLD_DEFAULT would find the client's
        // `dlopen` first when the client is preloaded or installed).
        // SAFETY: dlopen of a loaded library without loading; dlsym with a
        // valid handle and name.
        let ours = unsafe {
            let h = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            assert!(!h.is_null(), "libc.so.6 is loaded");
            libc::dlsym(h, c"dlopen".as_ptr())
        } as u64;
        assert_eq!(here, ours);
        assert!(libc.ranges.iter().any(|&(s, e)| s <= here && here < e));
    }
}
