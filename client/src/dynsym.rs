//! Looking a name up in one loaded object's dynamic symbol table, as the
//! dynamic loader does, without calling it.
//!
//! `dlsym` may allocate (its error state is `malloc`ed), and an allocation
//! made while the hooks do not yet know where to forward has nowhere to
//! go; so `originals` finds definitions by reading each object's own
//! tables: the GNU hash table (`DT_GNU_HASH`, what every object built in
//! the last fifteen years has), else the SysV one (`DT_HASH`), the symbol
//! table and the version indices (`DT_VERSYM`).
//!
//! A definition is what the loader binds a call to: a global, weak or
//! unique function (or untyped, or indirect: `STT_GNU_IFUNC`, whose
//! resolver is called as glibc calls it on x86_64) symbol with a section
//! and a non-zero value, in its default version (an index not marked
//! hidden). An undefined symbol with a value, a non-PIE program's
//! canonical PLT entry for a function whose address it takes, is not a
//! definition: the loader skips it for calls (`ELF_RTYPE_CLASS_PLT`), and
//! the entry jumps through the program's own slot to the real definition.

use core::ffi::{CStr, c_char};

use crate::elfdyn::{Dynamic, Sym};

const STT_NOTYPE: u8 = 0;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
const STB_GNU_UNIQUE: u8 = 10;
/// `DT_VERSYM` entries: index 0 is a local symbol; bit 15 marks a
/// non-default (hidden) version.
const VERSYM_HIDDEN: u16 = 0x8000;

/// The GNU hash of a name (the one `DT_GNU_HASH` uses).
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| {
        h.wrapping_mul(33).wrapping_add(u32::from(c))
    })
}

/// The SysV ELF hash of a name (the one `DT_HASH` uses).
fn sysv_hash(name: &[u8]) -> u32 {
    let mut h = 0u32;
    for &c in name {
        h = (h << 4).wrapping_add(u32::from(c));
        let g = h & 0xf000_0000;
        if g != 0 {
            h ^= g >> 24;
        }
        h &= !g;
    }
    h
}

/// The address the object `base`/`d` defines `name` at, if it defines it.
///
/// # Safety
/// `d` was read from a loaded object (with load address `base`) that stays
/// mapped during the call.
pub(crate) unsafe fn lookup(base: usize, d: &Dynamic, name: &CStr) -> Option<usize> {
    if d.symtab == 0 || d.strtab == 0 {
        return None;
    }
    let key = name.to_bytes();
    // SAFETY: the caller's contract; each candidate is checked by `defines`.
    let check = |i: u32| unsafe { defines(base, d, i as usize, key) };
    if d.gnu_hash != 0 {
        // SAFETY: the object's own GNU hash table.
        return unsafe { gnu_lookup(d.gnu_hash, key, check) };
    }
    if d.hash != 0 {
        // SAFETY: the object's own SysV hash table.
        return unsafe { sysv_lookup(d.hash, key, check) };
    }
    None
}

/// Walks the GNU hash chain of `key`; the first candidate `check` accepts.
///
/// # Safety
/// `table` is a loaded object's `DT_GNU_HASH` table.
unsafe fn gnu_lookup(
    table: usize,
    key: &[u8],
    check: impl Fn(u32) -> Option<usize>,
) -> Option<usize> {
    let h = gnu_hash(key);
    let words = table as *const u32;
    // SAFETY: the header (nbuckets, symoffset, bloom size, bloom shift),
    // the bloom words (one pointer each), the buckets and the chains are
    // laid out one after the other, as the loader reads them.
    unsafe {
        let nbuckets = *words;
        let symoffset = *words.add(1);
        let bloom_size = *words.add(2) as usize;
        if nbuckets == 0 {
            return None;
        }
        let word_bytes = core::mem::size_of::<usize>();
        let buckets = (table + 16 + bloom_size * word_bytes) as *const u32;
        let chains = buckets.add(nbuckets as usize);
        let first = *buckets.add((h % nbuckets) as usize);
        if first < symoffset {
            return None;
        }
        // Bounded: a chain ends with its low bit set; no object has this
        // many symbols under one hash.
        for i in first..first.saturating_add(1_000_000) {
            let ch = *chains.add((i - symoffset) as usize);
            if (ch | 1) == (h | 1)
                && let Some(a) = check(i)
            {
                return Some(a);
            }
            if ch & 1 != 0 {
                return None;
            }
        }
    }
    None
}

/// Walks the SysV hash chain of `key`; the first candidate `check` accepts.
///
/// # Safety
/// `table` is a loaded object's `DT_HASH` table.
unsafe fn sysv_lookup(
    table: usize,
    key: &[u8],
    check: impl Fn(u32) -> Option<usize>,
) -> Option<usize> {
    let words = table as *const u32;
    // SAFETY: nbucket, nchain, the buckets, then the chains.
    unsafe {
        let nbucket = *words;
        let nchain = *words.add(1);
        if nbucket == 0 {
            return None;
        }
        let buckets = words.add(2);
        let chains = buckets.add(nbucket as usize);
        let mut i = *buckets.add((sysv_hash(key) % nbucket) as usize);
        let mut steps = 0;
        while i != 0 && i < nchain && steps < nchain {
            if let Some(a) = check(i) {
                return Some(a);
            }
            i = *chains.add(i as usize);
            steps += 1;
        }
    }
    None
}

/// Whether symbol `i` of the object is a default-version definition of
/// `key`; its address if so.
///
/// # Safety
/// As [`lookup`]; `i` comes from the object's hash table.
unsafe fn defines(base: usize, d: &Dynamic, i: usize, key: &[u8]) -> Option<usize> {
    // SAFETY: `i` indexes the symbol table (it came from its hash table).
    let sym = unsafe { &*(d.symtab as *const Sym).add(i) };
    let (bind, ty) = (sym.info >> 4, sym.info & 0xf);
    if sym.shndx == 0
        || sym.value == 0
        || !matches!(bind, STB_GLOBAL | STB_WEAK | STB_GNU_UNIQUE)
        || !matches!(ty, STT_FUNC | STT_NOTYPE | STT_GNU_IFUNC)
        || (d.strsz != 0 && sym.name as usize >= d.strsz)
    {
        return None;
    }
    if d.versym != 0 {
        // SAFETY: DT_VERSYM has one entry per symbol.
        let v = unsafe { *(d.versym as *const u16).add(i) };
        if v == 0 || v & VERSYM_HIDDEN != 0 {
            return None;
        }
    }
    // SAFETY: a NUL-terminated name inside the string table.
    let n = unsafe { CStr::from_ptr((d.strtab + sym.name as usize) as *const c_char) };
    if n.to_bytes() != key {
        return None;
    }
    let addr = base.wrapping_add(sym.value as usize);
    if ty == STT_GNU_IFUNC {
        // SAFETY: an indirect function's value is its resolver.
        return unsafe { resolve_ifunc(addr) };
    }
    Some(addr)
}

/// The function an indirect symbol's resolver picks, called as glibc calls
/// it: with no arguments on x86_64; on aarch64 with `AT_HWCAP` (flagged
/// `_IFUNC_ARG_HWCAP`, bit 62) and a pointer to `{size, hwcap, hwcap2}`.
/// Elsewhere not resolved: not a definition we can forward to.
///
/// # Safety
/// `resolver` is an `STT_GNU_IFUNC` symbol's value in a loaded object.
unsafe fn resolve_ifunc(resolver: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller's contract; the resolver returns an address.
        let f = unsafe { core::mem::transmute::<usize, extern "C" fn() -> usize>(resolver) };
        let a = f();
        (a != 0).then_some(a)
    }
    #[cfg(target_arch = "aarch64")]
    {
        /// glibc's `__ifunc_arg_t`.
        #[repr(C)]
        struct IfuncArg {
            size: u64,
            hwcap: u64,
            hwcap2: u64,
        }
        const IFUNC_ARG_HWCAP: u64 = 1 << 62;
        // SAFETY: getauxval has no preconditions.
        let (hwcap, hwcap2) = unsafe {
            (
                libc::getauxval(libc::AT_HWCAP),
                libc::getauxval(libc::AT_HWCAP2),
            )
        };
        let arg = IfuncArg {
            size: core::mem::size_of::<IfuncArg>() as u64,
            hwcap,
            hwcap2,
        };
        // SAFETY: the caller's contract; the resolver returns an address.
        let f = unsafe {
            core::mem::transmute::<usize, extern "C" fn(u64, *const IfuncArg) -> usize>(resolver)
        };
        let a = f(hwcap | IFUNC_ARG_HWCAP, &arg);
        (a != 0).then_some(a)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = resolver;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_the_elf_specifications() {
        // Values from the generic ABI's algorithms, computed by hand for
        // short names (and checked against readelf's output for libc).
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"a"), 5381 * 33 + 97);
        assert_eq!(sysv_hash(b""), 0);
        assert_eq!(sysv_hash(b"a"), 97);
        assert_eq!(sysv_hash(b"ab"), (97 << 4) + 98);
    }

    /// Every object of the test process: each lookup agrees with dlsym on
    /// the object's own handle.
    #[test]
    fn lookup_agrees_with_dlsym_in_libc() {
        use core::ffi::{c_int, c_void};
        struct Q {
            found: usize,
        }
        unsafe extern "C" fn cb(
            info: *mut libc::dl_phdr_info,
            _: usize,
            data: *mut c_void,
        ) -> c_int {
            // SAFETY: glibc passes a valid info and our query.
            unsafe {
                let info = &*info;
                let q = &mut *data.cast::<Q>();
                let name = CStr::from_ptr(info.dlpi_name);
                if !name.to_bytes().ends_with(b"/libc.so.6") {
                    return 0;
                }
                let d = crate::elfdyn::read_dynamic(info).expect("libc has PT_DYNAMIC");
                for sym in [c"malloc", c"free", c"posix_memalign", c"execve", c"memcpy"] {
                    let ours = lookup(info.dlpi_addr as usize, &d, sym);
                    let h = libc::dlopen(info.dlpi_name, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
                    let theirs = libc::dlsym(h, sym.as_ptr()) as usize;
                    libc::dlclose(h);
                    assert_eq!(ours, Some(theirs), "{sym:?}");
                    q.found += 1;
                }
                assert_eq!(
                    lookup(info.dlpi_addr as usize, &d, c"no_such_symbol_x"),
                    None
                );
            }
            0
        }
        let mut q = Q { found: 0 };
        // SAFETY: the callback only reads what glibc passes.
        unsafe { libc::dl_iterate_phdr(Some(cb), (&mut q as *mut Q).cast()) };
        assert_eq!(q.found, 5);
    }
}
