//! Interned strings, mappings and frames.
//!
//! The [`Interner`] is the one piece of bookkeeping shared between threads:
//! the unwinding workers intern the frames of the stacks they unwind, the
//! bookkeeping thread reads them back when it writes a dump. It is `Send +
//! Sync`; lookups of entries that already exist take a read lock only, so
//! workers rarely contend (and they keep their own pc → [`FrameId`] caches).
//!
//! Ids are small integers starting at 1 and never reused, so they can be used
//! as Perfetto interning ids directly (iid 0 means "unset" there). Each kind
//! has its own id space, like Perfetto's interning tables. One string id is
//! used for the same bytes whatever role they play (function name, mapping
//! path component, build id, source file); the trace writer emits a string in
//! every table it is used in.

use std::hash::Hash;
use std::num::NonZeroU32;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use rustc_hash::FxHashMap;

mod retire;
pub use retire::RetiredEntries;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(NonZeroU32);

        impl $name {
            /// The id as a number (>= 1).
            #[inline]
            pub const fn get(self) -> u32 {
                self.0.get()
            }

            /// The id as a Perfetto interning id.
            #[inline]
            pub const fn iid(self) -> u64 {
                self.0.get() as u64
            }

            /// The id with number `n`, if `n >= 1`.
            #[inline]
            pub const fn new(n: u32) -> Option<Self> {
                match NonZeroU32::new(n) {
                    Some(n) => Some(Self(n)),
                    None => None,
                }
            }

            /// Position in a 0-based table.
            #[inline]
            pub(crate) const fn index(self) -> usize {
                (self.0.get() - 1) as usize
            }

            /// The id of the entry at position `index` of a 0-based table.
            #[inline]
            pub(crate) fn from_index(index: usize) -> Self {
                // Tables never reach u32::MAX entries (memory runs out long
                // before); saturate rather than panic.
                let n = u32::try_from(index + 1).unwrap_or(u32::MAX);
                Self(NonZeroU32::new(n).unwrap_or(NonZeroU32::MAX))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_type!(
    /// An interned string (function name, path component, build id, file).
    StringId
);
id_type!(
    /// An interned mapping.
    MappingId
);
id_type!(
    /// An interned frame: (mapping, rel_pc, function, source file, line).
    FrameId
);

/// An interned mapping, as Perfetto's `Mapping` message describes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MappingData {
    /// Raw build id bytes (not hex), if the module has one.
    pub build_id: Option<StringId>,
    /// Path components (the path split on `/`, empty parts dropped).
    pub path: Box<[StringId]>,
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset of `start`.
    pub exact_offset: u64,
    /// File offset of the first mapping of the same file.
    pub start_offset: u64,
    /// `p_vaddr - p_offset` of the executable segment.
    pub load_bias: u64,
}

/// An interned frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameData {
    /// The mapping the pc is in ([`Interner::unknown_mapping`] for error
    /// frames and pcs outside every mapping).
    pub mapping: MappingId,
    /// ELF virtual address of the pc in its module.
    pub rel_pc: u64,
    /// Symbolized function name.
    pub function: Option<StringId>,
    /// Source file.
    pub source_file: Option<StringId>,
    /// Source line (0 = unknown).
    pub line: u32,
}

/// A mapping to intern, described by borrowed parts (see
/// [`Interner::intern_mapping`]). The model's own description of a mapping:
/// the daemon converts the unwinder's mappings into it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mapping<'a> {
    /// Path or pseudo-name (`[vdso]`); empty for anonymous memory.
    pub path: &'a [u8],
    /// Raw build id bytes.
    pub build_id: Option<&'a [u8]>,
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset of `start`.
    pub exact_offset: u64,
    /// File offset of the first mapping of the same file.
    pub start_offset: u64,
    /// `p_vaddr - p_offset` of the executable segment.
    pub load_bias: u64,
}

/// One id space: entries by id and ids by entry. Ids are handed out in
/// order and never reused. An entry condemned by a retirement pass (see
/// [`retire`]) has its id in `condemned` instead of `ids` until the next
/// pass drops it; interning the same content meanwhile revives it, so
/// one content never has two live ids.
#[derive(Debug)]
struct Table<K, I> {
    /// By 0-based index (the id minus 1).
    by_id: FxHashMap<u32, K>,
    ids: FxHashMap<K, I>,
    condemned: FxHashMap<K, I>,
    /// The index the next entry gets.
    next: u32,
}

impl<K, I> Default for Table<K, I> {
    fn default() -> Self {
        Table {
            by_id: FxHashMap::default(),
            ids: FxHashMap::default(),
            condemned: FxHashMap::default(),
            next: 0,
        }
    }
}

impl<K: Eq + Hash + Clone, I: Copy> Table<K, I> {
    /// The id of `k`: live, or condemned and revived now.
    fn find_or_revive<Q>(&mut self, k: &Q) -> Option<I>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(&id) = self.ids.get(k) {
            return Some(id);
        }
        let (k, id) = self.condemned.remove_entry(k)?;
        self.ids.insert(k, id);
        Some(id)
    }
}

impl<K, I> Table<K, I> {
    fn get(&self, index: usize) -> Option<&K> {
        self.by_id.get(&u32::try_from(index).ok()?)
    }

    /// The index for a new entry.
    fn take_index(&mut self) -> usize {
        let i = self.next as usize;
        self.next = self.next.saturating_add(1);
        i
    }
}

#[derive(Debug, Default)]
struct Tables {
    strings: Table<Arc<[u8]>, StringId>,
    mappings: Table<MappingData, MappingId>,
    frames: Table<FrameData, FrameId>,
    unknown_mapping: Option<MappingId>,
    /// Symbolized replacements of unnamed pc frames: the inline chain,
    /// outermost function first (see [`Interner::set_expansion`]).
    expansions: FxHashMap<FrameId, Box<[FrameId]>>,
}

impl Tables {
    fn string(&mut self, s: &[u8]) -> StringId {
        if let Some(id) = self.strings.find_or_revive(s) {
            return id;
        }
        let i = self.strings.take_index();
        let id = StringId::from_index(i);
        let s: Arc<[u8]> = Arc::from(s);
        self.strings.by_id.insert(i as u32, s.clone());
        self.strings.ids.insert(s, id);
        id
    }

    fn mapping(&mut self, m: MappingData) -> MappingId {
        if let Some(id) = self.mappings.find_or_revive(&m) {
            return id;
        }
        let i = self.mappings.take_index();
        let id = MappingId::from_index(i);
        self.mappings.by_id.insert(i as u32, m.clone());
        self.mappings.ids.insert(m, id);
        id
    }

    fn frame(&mut self, f: FrameData) -> FrameId {
        if let Some(id) = self.frames.find_or_revive(&f) {
            return id;
        }
        let i = self.frames.take_index();
        let id = FrameId::from_index(i);
        self.frames.by_id.insert(i as u32, f);
        self.frames.ids.insert(f, id);
        id
    }

    fn unknown_mapping(&mut self) -> MappingId {
        if let Some(id) = self.unknown_mapping {
            return id;
        }
        let id = self.mapping(MappingData {
            build_id: None,
            path: Box::new([]),
            start: 0,
            end: 0,
            exact_offset: 0,
            start_offset: 0,
            load_bias: 0,
        });
        self.unknown_mapping = Some(id);
        id
    }
}

/// Interned strings, mappings and frames; see the module docs.
#[derive(Debug, Default)]
pub struct Interner {
    tables: RwLock<Tables>,
    /// See [`Interner::retire_generation`].
    generation: std::sync::atomic::AtomicU64,
}

/// The function name of a synthetic error frame: `ERROR <WHAT>`.
pub fn error_frame_name(what: &str) -> String {
    format!("ERROR {what}")
}

/// Splits a mapping path into components the way heapprofd does (on `/`,
/// dropping empty parts); trace readers show `/` + the components joined.
pub fn path_components(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

impl Interner {
    /// An empty interner.
    pub fn new() -> Self {
        Self::default()
    }

    fn read_tables(&self) -> RwLockReadGuard<'_, Tables> {
        // A panic while holding the lock cannot leave the tables
        // inconsistent (every insert is a push then a map insert of a fresh
        // key), so a poisoned lock is still usable.
        self.tables.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_tables(&self) -> std::sync::RwLockWriteGuard<'_, Tables> {
        self.tables.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Interns `s`.
    pub fn intern_string(&self, s: &[u8]) -> StringId {
        if let Some(&id) = self.read_tables().strings.ids.get(s) {
            return id;
        }
        self.write_tables().string(s)
    }

    /// Interns a mapping described by its parts.
    pub fn intern_mapping(&self, spec: &Mapping<'_>) -> MappingId {
        {
            // Fast path under the read lock: every part already interned.
            let t = self.read_tables();
            let build_id = match spec.build_id.filter(|b| !b.is_empty()) {
                None => Some(None),
                Some(b) => t.strings.ids.get(b).map(|&id| Some(id)),
            };
            let path: Option<Box<[StringId]>> = path_components(spec.path)
                .map(|c| t.strings.ids.get(c).copied())
                .collect();
            if let (Some(build_id), Some(path)) = (build_id, path) {
                let key = MappingData {
                    build_id,
                    path,
                    start: spec.start,
                    end: spec.end,
                    exact_offset: spec.exact_offset,
                    start_offset: spec.start_offset,
                    load_bias: spec.load_bias,
                };
                if let Some(&id) = t.mappings.ids.get(&key) {
                    return id;
                }
            }
        }
        let mut t = self.write_tables();
        let build_id = spec.build_id.filter(|b| !b.is_empty()).map(|b| t.string(b));
        let path: Box<[StringId]> = path_components(spec.path).map(|c| t.string(c)).collect();
        t.mapping(MappingData {
            build_id,
            path,
            start: spec.start,
            end: spec.end,
            exact_offset: spec.exact_offset,
            start_offset: spec.start_offset,
            load_bias: spec.load_bias,
        })
    }

    /// The empty mapping (no path, no range) that frames outside every
    /// mapping and error frames refer to. Perfetto's trace processor drops
    /// frames whose mapping is not interned, so every frame needs one.
    pub fn unknown_mapping(&self) -> MappingId {
        if let Some(id) = self.read_tables().unknown_mapping {
            return id;
        }
        self.write_tables().unknown_mapping()
    }

    /// Interns a frame. `mapping` `None` means [`Interner::unknown_mapping`];
    /// `line` `None` (or 0) means unknown.
    pub fn intern_frame(
        &self,
        mapping: Option<MappingId>,
        rel_pc: u64,
        function: Option<&str>,
        source_file: Option<&str>,
        line: Option<u32>,
    ) -> FrameId {
        let line = line.unwrap_or(0);
        {
            let t = self.read_tables();
            let lookup = |s: Option<&str>| match s {
                None => Some(None),
                Some(s) => t.strings.ids.get(s.as_bytes()).map(|&id| Some(id)),
            };
            let mapping = match mapping {
                Some(m) => Some(m),
                None => t.unknown_mapping,
            };
            if let (Some(mapping), Some(function), Some(source_file)) =
                (mapping, lookup(function), lookup(source_file))
            {
                let key = FrameData {
                    mapping,
                    rel_pc,
                    function,
                    source_file,
                    line,
                };
                if let Some(&id) = t.frames.ids.get(&key) {
                    return id;
                }
            }
        }
        let mut t = self.write_tables();
        let mapping = match mapping {
            Some(m) => m,
            None => t.unknown_mapping(),
        };
        let function = function.map(|s| t.string(s.as_bytes()));
        let source_file = source_file.map(|s| t.string(s.as_bytes()));
        t.frame(FrameData {
            mapping,
            rel_pc,
            function,
            source_file,
            line,
        })
    }

    /// Interns the synthetic frame `ERROR <WHAT>` (e.g. `what` =
    /// `MEMORY_INVALID`) that ends a stack whose unwinding failed. It has the
    /// unknown mapping and rel_pc 0.
    pub fn intern_error_frame(&self, what: &str) -> FrameId {
        self.intern_frame(None, 0, Some(&error_frame_name(what)), None, None)
    }

    /// Records that pc frame `id` (interned without a name) stands for the
    /// named frames `chain`, outermost function first (an inline chain).
    /// The trace writer writes `chain` wherever `id` appears in a stack.
    ///
    /// This lets the unwinding workers intern bare pcs and leave
    /// symbolization, which can take tens of milliseconds the first time a
    /// module is seen, to the dump path. Set it before the first dump that
    /// writes a stack containing `id`: stacks are written once.
    pub fn set_expansion(&self, id: FrameId, chain: Box<[FrameId]>) {
        if chain.is_empty() || chain[..] == [id] {
            return;
        }
        let mut t = self.write_tables();
        // A frame retired meanwhile (see [`retire`]) gets none.
        if t.frames.get(id.index()).is_some() {
            t.expansions.insert(id, chain);
        }
    }

    /// The expansion set for `id`, if any.
    pub fn expansion(&self, id: FrameId) -> Option<Box<[FrameId]>> {
        self.read_tables().expansions.get(&id).cloned()
    }

    /// A read-locked view for many lookups in a row (the dump path). Keep it
    /// short-lived: workers that intern new entries wait while it is held.
    pub fn read(&self) -> InternerView<'_> {
        InternerView {
            t: self.read_tables(),
        }
    }

    /// The bytes of a string.
    pub fn string(&self, id: StringId) -> Option<Arc<[u8]>> {
        self.read_tables().strings.get(id.index()).cloned()
    }

    /// A mapping.
    pub fn mapping(&self, id: MappingId) -> Option<MappingData> {
        self.read_tables().mappings.get(id.index()).cloned()
    }

    /// A frame.
    pub fn frame(&self, id: FrameId) -> Option<FrameData> {
        self.read_tables().frames.get(id.index()).copied()
    }

    /// Forgets everything interned: every id handed out so far is invalid
    /// afterwards. For an owner that knows no id is held any more: the
    /// service between profiles (mappings are interned with their
    /// addresses, so each process adds its own, and a long-lived service
    /// would otherwise keep every process's mappings and frames for ever).
    pub fn clear(&self) {
        *self.write_tables() = Tables::default();
    }

    /// Numbers of interned (strings, mappings, frames).
    pub fn counts(&self) -> (usize, usize, usize) {
        let t = self.read_tables();
        (
            t.strings.by_id.len(),
            t.mappings.by_id.len(),
            t.frames.by_id.len(),
        )
    }
}

/// Lookups under one read lock; see [`Interner::read`].
#[derive(Debug)]
pub struct InternerView<'a> {
    t: RwLockReadGuard<'a, Tables>,
}

impl InternerView<'_> {
    /// The bytes of a string.
    pub fn string(&self, id: StringId) -> Option<&[u8]> {
        self.t.strings.get(id.index()).map(|s| &**s)
    }

    /// A mapping.
    pub fn mapping(&self, id: MappingId) -> Option<&MappingData> {
        self.t.mappings.get(id.index())
    }

    /// A frame.
    pub fn frame(&self, id: FrameId) -> Option<FrameData> {
        self.t.frames.get(id.index()).copied()
    }

    /// The mapping of frames outside any known mapping (error frames), if
    /// one was interned (see [`Interner::unknown_mapping`]).
    pub fn unknown_mapping(&self) -> Option<MappingId> {
        self.t.unknown_mapping
    }

    /// The named frames pc frame `id` stands for, outermost first (see
    /// [`Interner::set_expansion`]).
    pub fn expansion(&self, id: FrameId) -> Option<&[FrameId]> {
        self.t.expansions.get(&id).map(|c| &**c)
    }

    /// The function name of a frame, lossily decoded, or `None`.
    pub fn function_name(&self, id: FrameId) -> Option<String> {
        let f = self.frame(id)?;
        let s = self.string(f.function?)?;
        Some(String::from_utf8_lossy(s).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_start_at_one_and_are_stable() {
        let i = Interner::new();
        let a = i.intern_string(b"malloc");
        let b = i.intern_string(b"main");
        assert_eq!(a.get(), 1);
        assert_eq!(b.get(), 2);
        assert_eq!(i.intern_string(b"malloc"), a);
        assert_eq!(&*i.string(b).unwrap(), b"main");
        assert!(i.string(StringId::new(3).unwrap()).is_none());
    }

    #[test]
    fn mappings_split_paths_and_dedupe() {
        let i = Interner::new();
        let spec = Mapping {
            path: b"/usr/lib/libc.so.6",
            build_id: Some(&[0xab, 0xcd]),
            start: 0x1000,
            end: 0x2000,
            exact_offset: 0x1000,
            start_offset: 0,
            load_bias: 0,
        };
        let m = i.intern_mapping(&spec);
        assert_eq!(m.get(), 1);
        assert_eq!(i.intern_mapping(&spec), m);
        let other = i.intern_mapping(&Mapping {
            start: 0x3000,
            ..spec
        });
        assert_ne!(other, m);
        let v = i.read();
        let data = v.mapping(m).unwrap();
        let comps: Vec<&[u8]> = data.path.iter().map(|&s| v.string(s).unwrap()).collect();
        assert_eq!(comps, [&b"usr"[..], b"lib", b"libc.so.6"]);
        assert_eq!(v.string(data.build_id.unwrap()).unwrap(), &[0xab, 0xcd]);
    }

    #[test]
    fn frames_dedupe_on_every_field() {
        let i = Interner::new();
        let m = i.intern_mapping(&Mapping {
            path: b"/bin/x",
            ..Default::default()
        });
        let f1 = i.intern_frame(Some(m), 0x10, Some("main"), Some("x.c"), Some(3));
        assert_eq!(
            i.intern_frame(Some(m), 0x10, Some("main"), Some("x.c"), Some(3)),
            f1
        );
        let f2 = i.intern_frame(Some(m), 0x10, Some("inlined"), Some("x.c"), Some(3));
        let f3 = i.intern_frame(Some(m), 0x10, Some("main"), Some("x.c"), Some(4));
        let f4 = i.intern_frame(Some(m), 0x11, None, None, None);
        let all = [f1, f2, f3, f4];
        for (a, x) in all.iter().enumerate() {
            for y in &all[a + 1..] {
                assert_ne!(x, y);
            }
        }
        assert_eq!(i.frame(f4).unwrap().function, None);
        assert_eq!(i.read().function_name(f2).as_deref(), Some("inlined"));
    }

    #[test]
    fn clear_forgets_everything() {
        let i = Interner::new();
        let e = i.intern_error_frame("X");
        let s = i.intern_string(b"abc");
        i.clear();
        assert_eq!(i.counts(), (0, 0, 0));
        assert!(i.frame(e).is_none() && i.string(s).is_none());
        assert!(i.read().unknown_mapping().is_none());
        // Usable again, from the first ids.
        assert_eq!(i.intern_string(b"def"), Interner::new().intern_string(b"x"));
    }

    #[test]
    fn error_frames_use_the_unknown_mapping() {
        let i = Interner::new();
        let e = i.intern_error_frame("MEMORY_INVALID");
        assert_eq!(i.intern_error_frame("MEMORY_INVALID"), e);
        let f = i.frame(e).unwrap();
        assert_eq!(f.mapping, i.unknown_mapping());
        assert_eq!(
            i.read().function_name(e).as_deref(),
            Some("ERROR MEMORY_INVALID")
        );
        let m = i.mapping(f.mapping).unwrap();
        assert!(m.path.is_empty() && m.build_id.is_none());
        // A frame without a mapping lands there too.
        let g = i.intern_frame(None, 5, None, None, None);
        assert_eq!(i.frame(g).unwrap().mapping, f.mapping);
    }

    #[test]
    fn concurrent_interning_agrees() {
        let i = Arc::new(Interner::new());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let i = i.clone();
                std::thread::spawn(move || {
                    (0..500u64)
                        .map(|n| {
                            let name = format!("f{}", (n + t * 7) % 300);
                            (
                                name.clone(),
                                i.intern_frame(None, n % 300, Some(&name), None, None),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen: FxHashMap<(String, u64), FrameId> = FxHashMap::default();
        for t in threads {
            for (name, id) in t.join().unwrap() {
                let f = i.frame(id).unwrap();
                let prev = seen.insert((name.clone(), f.rel_pc), id);
                assert!(prev.is_none_or(|p| p == id));
                assert_eq!(i.read().function_name(id).unwrap(), name);
            }
        }
        let (_, _, frames) = i.counts();
        assert_eq!(frames, seen.len());
    }

    #[test]
    fn interner_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Interner>();
    }
}
