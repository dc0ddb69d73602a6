//! Symbolization of one module: function names, files, lines, inline frames.
//!
//! Everything is lazy. The first lookup in a module finds its debug file
//! (see [`crate::debuginfo`]), builds a sorted symbol table from `.symtab`,
//! `.dynsym` and MiniDebugInfo, and the lookup over the DWARF (with the dwz
//! supplementary file attached): `addr2line` contexts of the units looked
//! up, or of the whole file when it does not allow that (see
//! [`crate::dwarf_units`]). Each answered address is
//! cached, so symbolizing a frame seen before is one hash-map lookup.
//!
//! Naming rule: DWARF gives the inline chain (innermost first) and the name
//! of each function; when DWARF has no name for the outermost function (or
//! there is no DWARF), the symbol table's name is used. Names are demangled
//! (Rust `{:#}` form without hash, C++ with parameters).

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use object::{Object, ObjectSection, ObjectSymbol};

use crate::checkout::CheckoutSlot;
use crate::debuginfo::{self, DebugFile};
use crate::dwarf_units::DwarfLookup;
use crate::elf::{DwarfReader as Reader, FileBytes, SectionBytes};
use crate::file_key::Observation;
use crate::sparse::ModuleBytes;
use crate::stored_answers::ToWrite;
use crate::symbol_frame::SymbolFrame;
use crate::symbol_store::{MAX_ANSWERS, StoreKey, Stored, SymbolStore};

/// Where a module's symbols came from (diagnostics and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SymbolSources {
    /// The separate debug file used for DWARF and `.symtab`, if any.
    pub debug_file: Option<PathBuf>,
    /// The dwz supplementary file, if any.
    pub sup_file: Option<PathBuf>,
    /// Whether DWARF was found (in the debug file or the module).
    pub has_dwarf: bool,
    /// Whether MiniDebugInfo contributed symbols.
    pub mini_debug_info: bool,
    /// Number of function symbols in the table.
    pub symbols: usize,
    /// Files the `.gnu_debuglink` named whose CRC32 was not the link's:
    /// another build's debug file, not used.
    pub refused_debug_files: Vec<PathBuf>,
}

/// Settings for symbolization, shared by all modules of a cache.
#[derive(Debug, Clone)]
pub struct SymbolizeOptions {
    /// When false, [`crate::Module::symbolize`] returns nothing and no
    /// debug file is ever opened (only build id + rel_pc reach the trace).
    pub enabled: bool,
    /// Global debug directories (default `/usr/lib/debug`).
    pub debug_dirs: Vec<PathBuf>,
    /// Where answers are kept between runs (modules with a build id), if
    /// anywhere: [`crate::SymbolStore`].
    pub store: Option<Arc<SymbolStore>>,
}

impl Default for SymbolizeOptions {
    fn default() -> Self {
        SymbolizeOptions {
            enabled: true,
            debug_dirs: vec![PathBuf::from("/usr/lib/debug")],
            store: None,
        }
    }
}

/// One function symbol; its name is `names[name.0..name.0 + name.1]` of
/// the table (one string for all: node has 200k symbols).
#[derive(Debug, Clone, Copy)]
struct Sym {
    addr: u64,
    size: u64,
    name: (u32, u32),
}

/// Function symbols sorted by address.
#[derive(Debug, Default)]
pub(crate) struct SymbolTable {
    syms: Vec<Sym>,
    names: String,
}

impl SymbolTable {
    /// Adds the function symbols of `file`'s `.symtab`, and those of its
    /// `.dynsym` at addresses `.symtab` does not name (in a linked file the
    /// dynamic symbols are a subset of the static ones, so this is usually
    /// none, and skips half of a big table's work).
    fn add_from(&mut self, file: &object::File<'_>) {
        let first = self.syms.len();
        for s in file.symbols() {
            self.push(&s);
        }
        if self.syms.len() == first {
            for s in file.dynamic_symbols() {
                self.push(&s);
            }
            return;
        }
        let mut named: Vec<u64> = self.syms[first..].iter().map(|s| s.addr).collect();
        named.sort_unstable();
        for s in file.dynamic_symbols() {
            if named.binary_search(&s.address()).is_err() {
                self.push(&s);
            }
        }
    }

    fn push<'d, S: ObjectSymbol<'d>>(&mut self, s: &S) {
        if s.kind() != object::SymbolKind::Text || s.is_undefined() || s.address() == 0 {
            return;
        }
        if let Ok(name) = s.name() {
            self.push_named(s.address(), s.size(), name);
        }
    }

    /// Adds one function. Names are kept mangled: demangling is done for
    /// the names looked up, not for the whole table (node's 100k+ C++
    /// symbols took seconds).
    fn push_named(&mut self, addr: u64, size: u64, name: &str) {
        let (Ok(at), Ok(len)) = (u32::try_from(self.names.len()), u32::try_from(name.len())) else {
            return;
        };
        if name.is_empty() || at.checked_add(len).is_none() {
            return;
        }
        self.names.push_str(name);
        self.syms.push(Sym {
            addr,
            size,
            name: (at, len),
        });
    }

    fn name(&self, s: &Sym) -> &str {
        name_in(&self.names, s)
    }

    fn finish(&mut self) {
        // Among symbols at one address, prefer sized, then global-looking
        // names (no leading underscore once demangled: a mangled C++ or
        // Rust name counts as global), deterministically.
        fn private(name: &str) -> bool {
            name.starts_with('_') && !name.starts_with("_Z") && !name.starts_with("_R")
        }
        let names = &self.names;
        self.syms.sort_unstable_by(|a, b| {
            a.addr
                .cmp(&b.addr)
                .then_with(|| b.size.cmp(&a.size))
                .then_with(|| {
                    let (na, nb) = (name_in(names, a), name_in(names, b));
                    private(na).cmp(&private(nb)).then_with(|| na.cmp(nb))
                })
        });
        self.syms.dedup_by_key(|s| s.addr);
    }

    /// Number of symbols.
    pub fn len(&self) -> usize {
        self.syms.len()
    }

    /// The demangled name of the function containing `svma`.
    pub fn function_name(&self, svma: u64) -> Option<String> {
        let name = self.lookup(svma)?;
        Some(addr2line::demangle_auto(Cow::Borrowed(name), None).into_owned())
    }

    /// The symbol (as in the file: mangled) of the function containing
    /// `svma`. A symbol of size 0 covers up to the next symbol.
    pub fn lookup(&self, svma: u64) -> Option<&str> {
        let i = self
            .syms
            .partition_point(|s| s.addr <= svma)
            .checked_sub(1)?;
        let s = &self.syms[i];
        if s.size == 0 || svma - s.addr < s.size {
            Some(self.name(s))
        } else {
            None
        }
    }
}

/// The name of `s` in its table's `names`.
fn name_in<'n>(names: &'n str, s: &Sym) -> &'n str {
    let (at, len) = (s.name.0 as usize, s.name.1 as usize);
    names.get(at..at + len).unwrap_or("")
}

/// Lazily built per-module symbolization state.
struct SymState {
    table: SymbolTable,
    dwarf: Option<DwarfLookup>,
    sources: SymbolSources,
}

/// u64-keyed hash (Fibonacci multiply), enough for addresses.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// Addresses whose answers one module keeps at most: past that the address
/// cache starts over (answers are found again from the loaded tables, a
/// few microseconds each). Bounds a long profile of a big module.
pub(crate) const MAX_CACHED_ADDRESSES: usize = 1 << 16;

/// Inserts an answer into a module's address cache, emptying it first when
/// it is full (see [`MAX_CACHED_ADDRESSES`]).
fn cache_answer(map: &mut AddrMap<Arc<[SymbolFrame]>>, svma: u64, frames: &Arc<[SymbolFrame]>) {
    if map.len() >= MAX_CACHED_ADDRESSES && !map.contains_key(&svma) {
        map.clear();
    }
    map.entry(svma).or_insert_with(|| Arc::clone(frames));
}

/// The symbolizer of one module; lives in the module cache.
pub(crate) struct ModuleSymbolizer {
    state: CheckoutSlot<SymState>,
    by_addr: RwLock<AddrMap<Arc<[SymbolFrame]>>>,
    /// Where the module was mapped, when its file was found elsewhere
    /// (offline symbolization): a `.gnu_debuglink` target is looked for
    /// at that directory under the debug directories too.
    mapped_path: Option<PathBuf>,
    /// Its file in the symbol store, if it may have one.
    store_key: Option<StoreKey>,
    /// What the store held for it, read at the first address not cached.
    stored: OnceLock<Option<Stored>>,
    /// The paths the state's load consulted for debug files.
    observed: Mutex<Option<Vec<Observation>>>,
    /// Answers were found that the store does not have.
    fresh: AtomicBool,
}

impl std::fmt::Debug for ModuleSymbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleSymbolizer").finish_non_exhaustive()
    }
}

impl ModuleSymbolizer {
    pub(crate) fn new(mapped_path: Option<PathBuf>, store_key: Option<StoreKey>) -> Self {
        ModuleSymbolizer {
            state: CheckoutSlot::default(),
            by_addr: RwLock::new(AddrMap::default()),
            mapped_path,
            store_key,
            stored: OnceLock::new(),
            observed: Mutex::new(None),
            fresh: AtomicBool::new(false),
        }
    }

    /// The store's answer for `svma`, cached as found.
    fn stored_answer(&self, svma: u64, options: &SymbolizeOptions) -> Option<Arc<[SymbolFrame]>> {
        let (store, key) = (options.store.as_ref()?, self.store_key.as_ref()?);
        let stored = self
            .stored
            .get_or_init(|| store.load(key, &options.debug_dirs))
            .as_ref()?;
        let frames = stored.answers.get(svma)?;
        cache_answer(&mut write(&self.by_addr), svma, &frames);
        Some(frames)
    }

    /// Writes the answers found since the store was read (with those it
    /// had) to the store; false if there was nothing new to write.
    pub(crate) fn persist(&self, options: &SymbolizeOptions) -> std::io::Result<bool> {
        let (Some(store), Some(key)) = (options.store.as_ref(), self.store_key.as_ref()) else {
            return Ok(false);
        };
        let Some(observed) = lock(&self.observed).clone() else {
            return Ok(false);
        };
        if !self.fresh.swap(false, Ordering::AcqRel) {
            return Ok(false);
        }
        let by_addr = read(&self.by_addr);
        // Older answers only if they were made from the same debug files.
        let older = self
            .stored
            .get()
            .and_then(Option::as_ref)
            .filter(|s| s.observed == observed)
            .map(|s| &s.answers);
        let mut answers: Vec<ToWrite<'_>> = by_addr
            .iter()
            .map(|(&pc, f)| ToWrite::New(pc, Arc::clone(f)))
            .chain(
                older
                    .into_iter()
                    .flat_map(|a| a.kept())
                    .filter(|(pc, _)| !by_addr.contains_key(pc))
                    .map(|(pc, bytes)| ToWrite::Kept(pc, bytes)),
            )
            // The file's limit, the new answers first (as before sorting).
            .take(MAX_ANSWERS)
            .collect();
        // In address order: the next load's index is sorted as read.
        answers.sort_unstable_by_key(ToWrite::pc);
        store.save(key, &options.debug_dirs, &observed, answers.into_iter())?;
        Ok(true)
    }

    /// Symbolizes `svma` (a rel_pc) of the module whose file is `bytes`
    /// (read in full, or all but code and data, at the first load of its
    /// symbols: [`ModuleBytes::symbols`]).
    pub(crate) fn symbolize(
        &self,
        module_path: &Path,
        bytes: &ModuleBytes,
        svma: u64,
        options: &SymbolizeOptions,
    ) -> Arc<[SymbolFrame]> {
        if let Some(hit) = read(&self.by_addr).get(&svma) {
            return Arc::clone(hit);
        }
        if let Some(hit) = self.stored_answer(svma, options) {
            return hit;
        }
        let frames: Arc<[SymbolFrame]> = self.state.with(
            || self.load_state(module_path, bytes, options),
            |state| lookup(state, svma).into(),
        );
        cache_answer(&mut write(&self.by_addr), svma, &frames);
        self.fresh.store(true, Ordering::Release);
        frames
    }

    /// Symbolizes `svma` ahead of need, from a background thread: the
    /// answer lands in the address cache, where [`Self::symbolize`] finds it,
    /// and is returned.
    ///
    /// It checks the state out (or loads it) and looks up with no lock held;
    /// a [`Self::symbolize`] caller needing the module meanwhile waits for
    /// the state to come back instead of loading a second one (the warm-up
    /// thread runs at normal priority, so that wait is bounded by the load
    /// itself). If the state is out already, nothing is done: `None`.
    pub(crate) fn warm(
        &self,
        module_path: &Path,
        bytes: &ModuleBytes,
        svma: u64,
        options: &SymbolizeOptions,
    ) -> Option<Arc<[SymbolFrame]>> {
        if let Some(hit) = read(&self.by_addr).get(&svma) {
            return Some(Arc::clone(hit));
        }
        if let Some(hit) = self.stored_answer(svma, options) {
            return Some(hit);
        }
        let state = self
            .state
            .check_out(|| self.load_state(module_path, bytes, options))?;
        let frames: Arc<[SymbolFrame]> = lookup(&state, svma).into();
        cache_answer(&mut write(&self.by_addr), svma, &frames);
        self.fresh.store(true, Ordering::Release);
        Some(frames)
    }

    /// Which files were used (loads the state if needed).
    pub(crate) fn sources(
        &self,
        module_path: &Path,
        bytes: &ModuleBytes,
        options: &SymbolizeOptions,
    ) -> SymbolSources {
        self.state.with(
            || self.load_state(module_path, bytes, options),
            |state| state.sources.clone(),
        )
    }

    /// Whether the state was ever loaded (tests).
    #[cfg(test)]
    pub(crate) fn state_loaded(&self) -> bool {
        lock(&self.observed).is_some()
    }

    /// Number of addresses cached.
    pub(crate) fn cached_addresses(&self) -> usize {
        read(&self.by_addr).len()
    }

    fn load_state(
        &self,
        module_path: &Path,
        bytes: &ModuleBytes,
        options: &SymbolizeOptions,
    ) -> SymState {
        let (state, observed) = crate::debuginfo::consulted_during(|| {
            load_state(
                module_path,
                self.mapped_path.as_deref(),
                &bytes.symbols(),
                options,
            )
        });
        *lock(&self.observed) = Some(observed);
        state
    }
}

/// Locks a mutex, ignoring poisoning (the data is caches; a panic while
/// holding the lock leaves them consistent enough to read).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

fn lookup(state: &SymState, svma: u64) -> Vec<SymbolFrame> {
    let mut out = Vec::new();
    if let Some(ctx) = state.dwarf.as_ref().and_then(|d| d.context_for(svma))
        && let Ok(mut iter) = ctx.find_frames(svma).skip_all_loads()
    {
        while let Ok(Some(f)) = iter.next() {
            let function = f
                .function
                .as_ref()
                .and_then(|n| n.demangle().ok())
                .map(Cow::into_owned);
            let (file, line) = match f.location {
                Some(l) => (l.file.map(str::to_owned), l.line),
                None => (None, None),
            };
            out.push(SymbolFrame {
                function,
                file,
                line,
            });
            if out.len() >= 256 {
                break;
            }
        }
    }
    let sym = state.table.function_name(svma);
    match out.last_mut() {
        Some(last) if last.function.is_none() => last.function = sym,
        Some(_) => {}
        None => out.push(SymbolFrame {
            function: sym,
            file: None,
            line: None,
        }),
    }
    out
}

fn load_state(
    module_path: &Path,
    mapped_path: Option<&Path>,
    bytes: &Arc<FileBytes>,
    options: &SymbolizeOptions,
) -> SymState {
    let mut sources = SymbolSources::default();
    let mut table = SymbolTable::default();
    let Ok(file) = object::File::parse(&***bytes) else {
        return SymState {
            table,
            dwarf: None,
            sources,
        };
    };
    table.add_from(&file);

    let build_id = file.build_id().ok().flatten();
    let debug = build_id
        .and_then(|id| debuginfo::find_by_build_id(&options.debug_dirs, id))
        .or_else(|| {
            let (name, crc) = file.gnu_debuglink().ok().flatten()?;
            let link = debuginfo::find_by_debuglink(
                &options.debug_dirs,
                module_path,
                mapped_path,
                name,
                crc,
            );
            sources.refused_debug_files = link.refused;
            link.found
        });

    let mut dwarf = None;
    match &debug {
        Some(DebugFile { path, bytes: dbg }) => {
            sources.debug_file = Some(path.clone());
            if let Ok(dfile) = object::File::parse(&***dbg) {
                table.add_from(&dfile);
                dwarf = load_dwarf(&dfile, dbg, path, options, &mut sources);
            }
        }
        None => {
            if debuginfo::has_dwarf(&file) {
                dwarf = load_dwarf(&file, bytes, module_path, options, &mut sources);
            }
        }
    }
    if let Some(mini) = debuginfo::mini_debug_info(&file)
        && let Ok(mfile) = object::File::parse(&mini[..])
    {
        let before = table.len();
        table.add_from(&mfile);
        sources.mini_debug_info = table.len() > before;
    }
    table.finish();
    sources.symbols = table.len();
    sources.has_dwarf = dwarf.is_some();
    SymState {
        table,
        dwarf,
        sources,
    }
}

/// The DWARF sections of `file`, whose bytes are `bytes`: uncompressed
/// sections are ranges of `bytes`, compressed ones are decompressed once
/// into their own buffer (libc's debug file: 8.5 MB, which a copy into
/// fresh memory would fault in a second time).
pub(crate) fn load_sections(
    file: &object::File<'_>,
    bytes: &Arc<FileBytes>,
) -> Result<gimli::DwarfSections<Reader>, gimli::Error> {
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let empty = || SectionBytes::owned(Vec::new());
    gimli::DwarfSections::load(|id| -> Result<Reader, gimli::Error> {
        // Location and macro lists are never needed for names and lines.
        let skip = matches!(
            id,
            gimli::SectionId::DebugLoc
                | gimli::SectionId::DebugLocLists
                | gimli::SectionId::DebugMacinfo
                | gimli::SectionId::DebugMacro
        );
        let data = match file.section_by_name(id.name()) {
            Some(s) if !skip => match s.uncompressed_data() {
                Ok(Cow::Owned(v)) => SectionBytes::owned(v),
                Ok(Cow::Borrowed(d)) => {
                    in_file(bytes, d).unwrap_or_else(|| SectionBytes::owned(d.to_vec()))
                }
                Err(_) => empty(),
            },
            _ => empty(),
        };
        Ok(gimli::EndianReader::new(data, endian))
    })
}

/// `d`, a slice of `bytes`, as a range of them (`None` if it is not one).
fn in_file(bytes: &Arc<FileBytes>, d: &[u8]) -> Option<SectionBytes> {
    let base = bytes.as_ptr() as usize;
    let offset = (d.as_ptr() as usize).checked_sub(base)?;
    SectionBytes::new(bytes, offset as u64, d.len() as u64)
}

fn load_dwarf(
    file: &object::File<'_>,
    bytes: &Arc<FileBytes>,
    path: &Path,
    options: &SymbolizeOptions,
    sources: &mut SymbolSources,
) -> Option<DwarfLookup> {
    if !debuginfo::has_dwarf(file) {
        return None;
    }
    let sections = load_sections(file, bytes).ok()?;
    let mut sup_sections = None;
    if let Ok(Some((alt_path, alt_id))) = file.gnu_debugaltlink()
        && let Some(sup) = debuginfo::find_altlink(&options.debug_dirs, path, alt_path, alt_id)
        && let Ok(sfile) = object::File::parse(&**sup.bytes)
        && let Ok(s) = load_sections(&sfile, &sup.bytes)
    {
        sup_sections = Some(s);
        sources.sup_file = Some(sup.path);
    }
    DwarfLookup::new(sections, sup_sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An uncompressed section is read in place: a range of the file's own
    /// bytes, not a copy; a slice from elsewhere is not taken for one.
    #[test]
    fn uncompressed_sections_are_ranges_of_the_file() {
        let bytes = Arc::new(FileBytes::Owned((0u8..64).collect()));
        let section = in_file(&bytes, &bytes[8..24]).expect("a range of the file");
        assert_eq!(section.as_ptr(), bytes[8..].as_ptr());
        assert_eq!(&section[..], &bytes[8..24]);
        let elsewhere = vec![0u8; 16];
        assert!(in_file(&bytes, &elsewhere).is_none());
    }

    fn table(entries: &[(u64, u64, &str)]) -> SymbolTable {
        let mut t = SymbolTable::default();
        for &(addr, size, name) in entries {
            t.push_named(addr, size, name);
        }
        t.finish();
        t
    }

    #[test]
    fn symbol_table_lookup() {
        let t = table(&[
            (0x1000, 0x10, "a"),
            (0x1000, 0x10, "_a_alias"),
            (0x2000, 0, "unsized"),
            (0x3000, 0x8, "c"),
        ]);
        assert_eq!(t.len(), 3);
        assert_eq!(t.lookup(0xfff), None);
        assert_eq!(t.lookup(0x1000), Some("a"));
        assert_eq!(t.lookup(0x100f), Some("a"));
        assert_eq!(t.lookup(0x1010), None);
        assert_eq!(t.lookup(0x2fff), Some("unsized"));
        assert_eq!(t.lookup(0x3008), None);
        assert_eq!(t.lookup(u64::MAX), None);
    }

    #[test]
    fn a_table_has_each_function_address_of_both_symbol_tables_once() {
        // This test binary has a .symtab and a .dynsym.
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let file = object::File::parse(&exe[..]).unwrap();
        let mut want: Vec<u64> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| {
                s.kind() == object::SymbolKind::Text
                    && !s.is_undefined()
                    && s.address() != 0
                    && s.name().is_ok_and(|n| !n.is_empty())
            })
            .map(|s| s.address())
            .collect();
        want.sort_unstable();
        want.dedup();
        assert!(file.dynamic_symbols().count() > 0);
        let mut t = SymbolTable::default();
        t.add_from(&file);
        t.finish();
        let got: Vec<u64> = t.syms.iter().map(|s| s.addr).collect();
        assert!(got.len() > 1000, "{} functions", got.len());
        assert_eq!(got, want);
        for s in file
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        {
            assert!(t.lookup(s.address()).is_some());
        }
    }

    #[test]
    fn symbol_names_are_demangled_when_looked_up() {
        let t = table(&[
            (0x1000, 0x10, "_ZN3foo3barEv"),
            (0x2000, 0x10, "_ZN4core3fmt5write17h0123456789abcdefE"),
            (0x3000, 0x10, "plain_c"),
        ]);
        assert_eq!(t.function_name(0x1004).as_deref(), Some("foo::bar()"));
        assert_eq!(t.function_name(0x2004).as_deref(), Some("core::fmt::write"));
        assert_eq!(t.function_name(0x3004).as_deref(), Some("plain_c"));
        assert_eq!(t.function_name(0x4000), None);
    }

    #[test]
    fn garbage_module_gives_unnamed_frame() {
        let s = ModuleSymbolizer::new(None, None);
        let bytes = ModuleBytes::complete(Arc::new(FileBytes::Owned(vec![
            0x7f, b'E', b'L', b'F', 2, 1,
        ])));
        let f = s.symbolize(
            Path::new("/x"),
            &bytes,
            0x1234,
            &SymbolizeOptions::default(),
        );
        assert_eq!(
            &f[..],
            &[SymbolFrame {
                function: None,
                file: None,
                line: None
            }]
        );
        assert_eq!(s.cached_addresses(), 1);
    }

    #[test]
    fn a_warm_up_caches_its_answer_and_gives_the_state_back() {
        let s = ModuleSymbolizer::new(None, None);
        let bytes = ModuleBytes::complete(Arc::new(FileBytes::Owned(vec![
            0x7f, b'E', b'L', b'F', 2, 1,
        ])));
        let (path, opts) = (Path::new("/x"), SymbolizeOptions::default());
        let warmed = s
            .warm(path, &bytes, 0x20, &opts)
            .expect("the state was free");
        assert_eq!(s.cached_addresses(), 1);
        // The answer given is the one cached.
        assert!(Arc::ptr_eq(
            &warmed,
            &s.symbolize(path, &bytes, 0x20, &opts)
        ));
        // The state is back in its slot (not out for good): a second
        // warm-up and a foreground lookup both get it without waiting.
        assert!(s.warm(path, &bytes, 0x30, &opts).is_some());
        assert_eq!(s.cached_addresses(), 2);
        let fg = s.symbolize(path, &bytes, 0x40, &opts);
        assert_eq!(fg.len(), 1);
        assert_eq!(s.cached_addresses(), 3);
    }

    #[test]
    fn the_address_cache_is_bounded() {
        let s = ModuleSymbolizer::new(None, None);
        let bytes = ModuleBytes::complete(Arc::new(FileBytes::Owned(vec![
            0x7f, b'E', b'L', b'F', 2, 1,
        ])));
        let (path, opts) = (Path::new("/x"), SymbolizeOptions::default());
        for a in 0..MAX_CACHED_ADDRESSES as u64 {
            s.symbolize(path, &bytes, a, &opts);
        }
        assert_eq!(s.cached_addresses(), MAX_CACHED_ADDRESSES);
        // An address cached already is answered without starting over.
        s.symbolize(path, &bytes, 7, &opts);
        assert_eq!(s.cached_addresses(), MAX_CACHED_ADDRESSES);
        // A new one starts over: the cache never passes its bound.
        s.symbolize(path, &bytes, u64::MAX, &opts);
        assert!(s.warm(path, &bytes, u64::MAX - 1, &opts).is_some());
        assert_eq!(s.cached_addresses(), 2);
    }
}
