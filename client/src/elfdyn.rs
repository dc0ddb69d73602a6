//! Reading the dynamic sections of loaded objects (for `got`, `dynsym`
//! and `dlcaller`).
//!
//! Everything here reads the structures the dynamic loader itself used for
//! an object that `dl_iterate_phdr` reports, while the loader's lock keeps
//! it mapped: `PT_DYNAMIC` (whose pointers glibc has already relocated in
//! place; values below the load address are still file-relative), the
//! relocation tables (`Elf64_Rela`), the symbol table and its hash tables
//! and version indices.

#[repr(C)]
pub(crate) struct Dyn {
    pub(crate) tag: i64,
    pub(crate) val: u64,
}

#[repr(C)]
pub(crate) struct Rela {
    pub(crate) offset: u64,
    pub(crate) info: u64,
    pub(crate) addend: i64,
}

#[repr(C)]
pub(crate) struct Sym {
    pub(crate) name: u32,
    pub(crate) info: u8,
    pub(crate) other: u8,
    pub(crate) shndx: u16,
    pub(crate) value: u64,
    pub(crate) size: u64,
}

/// What `PT_DYNAMIC` says about an object's relocations.
#[derive(Default)]
pub(crate) struct Dynamic {
    /// Where `PT_DYNAMIC` is mapped: identifies the object.
    pub(crate) address: usize,
    pub(crate) symtab: usize,
    pub(crate) strtab: usize,
    pub(crate) strsz: usize,
    pub(crate) jmprel: usize,
    pub(crate) pltrelsz: usize,
    pub(crate) pltrel_is_rela: bool,
    pub(crate) rela: usize,
    pub(crate) relasz: usize,
    pub(crate) relaent: usize,
    pub(crate) relacount: usize,
    /// `DT_GNU_HASH` (0 = none).
    pub(crate) gnu_hash: usize,
    /// `DT_HASH` (0 = none).
    pub(crate) hash: usize,
    /// `DT_VERSYM` (0 = the object has no symbol versions).
    pub(crate) versym: usize,
    /// Whether the object has a `DT_RPATH` (its search path for the
    /// objects it and those it loaded `dlopen` by name).
    pub(crate) rpath: bool,
    /// Whether the object has a `DT_RUNPATH`.
    pub(crate) runpath: bool,
}

/// # Safety
/// `info` describes a loaded object that stays mapped during the call.
pub(crate) unsafe fn read_dynamic(info: &libc::dl_phdr_info) -> Option<Dynamic> {
    let base = info.dlpi_addr as usize;
    let mut dyn_addr = 0usize;
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr has dlpi_phnum entries.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == libc::PT_DYNAMIC {
            dyn_addr = base.wrapping_add(ph.p_vaddr as usize);
        }
    }
    if dyn_addr == 0 {
        return None;
    }
    // The loader relocates most d_ptr entries in place (glibc does); values
    // below the load address are still file-relative.
    let fix = |v: u64| -> usize {
        let v = v as usize;
        if v < base { v.wrapping_add(base) } else { v }
    };
    let mut d = Dynamic {
        address: dyn_addr,
        ..Dynamic::default()
    };
    let mut p = dyn_addr as *const Dyn;
    // Bounded: a dynamic section has far fewer entries.
    for _ in 0..4096 {
        // SAFETY: entries up to DT_NULL are part of the mapped object.
        let e = unsafe { &*p };
        let v = e.val;
        match e.tag as u64 {
            0 => break, // DT_NULL
            6 => d.symtab = fix(v),
            5 => d.strtab = fix(v),
            10 => d.strsz = v as usize,
            23 => d.jmprel = fix(v),
            2 => d.pltrelsz = v as usize,
            20 => d.pltrel_is_rela = v == 7, // DT_PLTREL == DT_RELA
            7 => d.rela = fix(v),
            8 => d.relasz = v as usize,
            9 => d.relaent = v as usize,
            0x6fff_fff9 => d.relacount = v as usize, // DT_RELACOUNT
            0x6fff_fef5 => d.gnu_hash = fix(v),      // DT_GNU_HASH
            4 => d.hash = fix(v),                    // DT_HASH
            0x6fff_fff0 => d.versym = fix(v),        // DT_VERSYM
            15 => d.rpath = true,                    // DT_RPATH
            29 => d.runpath = true,                  // DT_RUNPATH
            _ => {}
        }
        // SAFETY: still within the dynamic section (DT_NULL not reached).
        p = unsafe { p.add(1) };
    }
    Some(d)
}

/// Whether `addr` is inside one of the object's loaded segments (an
/// unresolved lazy-binding stub in its PLT).
pub(crate) fn in_object(info: &libc::dl_phdr_info, addr: usize) -> bool {
    let base = info.dlpi_addr as usize;
    (0..info.dlpi_phnum as usize).any(|i| {
        // SAFETY: dlpi_phdr has dlpi_phnum entries.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        let start = base.wrapping_add(ph.p_vaddr as usize);
        ph.p_type == libc::PT_LOAD && addr >= start && addr - start < ph.p_memsz as usize
    })
}
