//! Retiring interned entries nothing refers to any more, so that a long
//! profile of a program that keeps loading new code (each library a new
//! mapping with new frames, paths and build ids) stays bounded.
//!
//! The interner is shared with the unwinding workers, which keep their own
//! pc -> [`FrameId`] caches and may hold an id between interning it and
//! the bookkeeping thread receiving the stack that uses it. So an entry
//! goes in two steps, one [`Interner::retire_unused`] pass apart:
//!
//! 1. *condemned*: not reachable from what the caller keeps. Its content
//!    -> id entry moves aside and [`Interner::retire_generation`] changes,
//!    which tells every worker to forget its caches before its next
//!    record. Its data stays, so an id already on its way still resolves,
//!    and interning the same content again *revives* it (the same id: one
//!    content never has two live ids, which trace processor, merging
//!    frames by content, would see as one callsite under two ids).
//! 2. *dropped*, at the next pass, if neither revived nor reachable again
//!    (a stack that was on its way arrived: then it is revived).
//!
//! Reachable: the frames the caller keeps (the callsite tree's, the
//! sessions' context frames), the frames their expansions (inline chains)
//! name, every frame of the unknown mapping (error frames, which the
//! workers cache for good), the mappings of all those frames, and the
//! strings any of them name. The caller spaces passes (the runtime: at
//! least seconds) so that a worker's batch in flight is always delivered
//! within one; an id that still arrives after its entry was dropped
//! resolves to nothing, which the bookkeeping shows as an error frame.

use rustc_hash::FxHashSet;

use super::{FrameId, Interner, MappingId, StringId, Table, Tables};

/// What one [`Interner::retire_unused`] pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetiredEntries {
    /// Frames, mappings and strings condemned by this pass.
    pub condemned: (usize, usize, usize),
    /// Frames, mappings and strings dropped (condemned by the previous
    /// pass and still unreachable).
    pub dropped: (usize, usize, usize),
}

/// The reachable indices of each table.
#[derive(Default)]
struct Reachable {
    strings: FxHashSet<u32>,
    mappings: FxHashSet<u32>,
    frames: FxHashSet<u32>,
}

fn idx(index: usize) -> u32 {
    u32::try_from(index).unwrap_or(u32::MAX)
}

impl Reachable {
    fn of(t: &Tables, keep: impl IntoIterator<Item = FrameId>) -> Self {
        let mut r = Reachable::default();
        let mut todo: Vec<FrameId> = keep.into_iter().collect();
        let unknown = t.unknown_mapping;
        todo.extend(
            t.frames
                .by_id
                .iter()
                .filter(|(_, f)| Some(f.mapping) == unknown)
                .map(|(&i, _)| FrameId::from_index(i as usize)),
        );
        while let Some(id) = todo.pop() {
            let Some(f) = t.frames.get(id.index()) else {
                continue;
            };
            if !r.frames.insert(idx(id.index())) {
                continue;
            }
            r.mappings.insert(idx(f.mapping.index()));
            for s in [f.function, f.source_file].into_iter().flatten() {
                r.strings.insert(idx(s.index()));
            }
            if let Some(chain) = t.expansions.get(&id) {
                todo.extend(chain.iter().copied());
            }
        }
        if let Some(u) = unknown {
            r.mappings.insert(idx(u.index()));
        }
        for &m in &r.mappings {
            if let Some(data) = t.mappings.get(m as usize) {
                let strings = data.build_id.iter().chain(data.path.iter());
                r.strings.extend(strings.map(|s| idx(s.index())));
            }
        }
        r
    }
}

/// One pass over `table`: the entries condemned by the previous pass are
/// dropped if still unreachable (not revived since) or revived if a stack
/// that names them arrived; then the live entries that are not reachable
/// are condemned. Returns (dropped, condemned).
fn sweep<K, I>(
    table: &mut Table<K, I>,
    reachable: &FxHashSet<u32>,
    index_of: impl Fn(I) -> usize,
) -> (usize, usize)
where
    K: Eq + std::hash::Hash,
    I: Copy,
{
    let mut dropped = 0;
    for (k, id) in std::mem::take(&mut table.condemned) {
        let i = idx(index_of(id));
        if reachable.contains(&i) {
            table.ids.insert(k, id);
        } else if table.by_id.remove(&i).is_some() {
            dropped += 1;
        }
    }
    let mut condemned = 0;
    for (k, id) in std::mem::take(&mut table.ids) {
        if reachable.contains(&idx(index_of(id))) {
            table.ids.insert(k, id);
        } else {
            table.condemned.insert(k, id);
            condemned += 1;
        }
    }
    (dropped, condemned)
}

fn shrink<K: Eq + std::hash::Hash, I>(table: &mut Table<K, I>) {
    if table.by_id.len() * 4 < table.by_id.capacity() {
        table.by_id.shrink_to_fit();
    }
    if table.ids.len() * 4 < table.ids.capacity() {
        table.ids.shrink_to_fit();
    }
    table.condemned.shrink_to_fit();
}

impl Interner {
    /// One retirement pass (see the module docs): entries unreachable from
    /// `keep` are condemned; those the previous pass condemned and still
    /// unreachable are dropped.
    pub fn retire_unused(&self, keep: impl IntoIterator<Item = FrameId>) -> RetiredEntries {
        let mut t = self.write_tables();
        let r = Reachable::of(&t, keep);
        let frames = sweep(&mut t.frames, &r.frames, FrameId::index);
        let mappings = sweep(&mut t.mappings, &r.mappings, MappingId::index);
        let strings = sweep(&mut t.strings, &r.strings, StringId::index);
        let dropped = (frames.0, mappings.0, strings.0);
        let condemned = (frames.1, mappings.1, strings.1);
        let tables = &mut *t;
        let frames_left = &tables.frames.by_id;
        tables
            .expansions
            .retain(|id, _| frames_left.contains_key(&idx(id.index())));
        shrink(&mut t.frames);
        shrink(&mut t.mappings);
        shrink(&mut t.strings);
        if condemned != (0, 0, 0) {
            self.generation
                .fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        RetiredEntries { condemned, dropped }
    }

    /// Changes whenever a retirement pass condemned entries: a worker that
    /// sees a new value forgets its pc -> frame caches before it interns
    /// again.
    pub fn retire_generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether frame `id` still resolves (not dropped by a retirement).
    pub fn has_frame(&self, id: FrameId) -> bool {
        self.read_tables().frames.get(id.index()).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Interner, Mapping};
    use super::*;

    fn mapping(i: &Interner, path: &[u8], build_id: &[u8], start: u64) -> MappingId {
        i.intern_mapping(&Mapping {
            path,
            build_id: Some(build_id),
            start,
            end: start + 0x1000,
            ..Mapping::default()
        })
    }

    #[test]
    fn unreachable_entries_are_condemned_then_dropped() {
        let i = Interner::new();
        let a = mapping(&i, b"/lib/liba.so", b"aa", 0x1000);
        let b = mapping(&i, b"/tmp/fresh_1.so", b"bb", 0x9000);
        let fa = i.intern_frame(Some(a), 0x10, Some("shared"), None, None);
        let fb = i.intern_frame(Some(b), 0x20, Some("shared"), Some("b.c"), None);
        let fb2 = i.intern_frame(Some(b), 0x30, Some("only_b"), None, None);
        let err = i.intern_error_frame("MEMORY_INVALID");
        let g0 = i.retire_generation();
        // Pass 1: b's frames, b, and the strings only they name are
        // condemned; they still resolve, but interning them again makes
        // new ids.
        let r = i.retire_unused([fa]);
        // fb, fb2; b; b.c, only_b, and b's path components and build id
        // (tmp, fresh_1.so, bb). They still resolve.
        assert_eq!(r.condemned, (2, 1, 5));
        assert_eq!(r.dropped, (0, 0, 0));
        assert_ne!(i.retire_generation(), g0);
        assert!(i.has_frame(fb) && i.mapping(b).is_some());
        // Pass 2: still unreachable and not interned again: dropped.
        let r = i.retire_unused([fa]);
        assert_eq!(r.dropped, (2, 1, 5));
        assert_eq!(r.condemned, (0, 0, 0));
        assert!(!i.has_frame(fb) && !i.has_frame(fb2) && i.mapping(b).is_none());
        // Interned again after that: new ids (never reused).
        let b_again = mapping(&i, b"/tmp/fresh_1.so", b"bb", 0x9000);
        assert!(b_again.get() > b.get());
        // What fa needs stays, and error frames always do.
        assert!(i.has_frame(fa) && i.has_frame(err));
        assert_eq!(i.read().function_name(fa).as_deref(), Some("shared"));
        assert!(i.mapping(a).is_some());
        // Ids are never reused.
        let fresh = i.intern_frame(Some(a), 0x40, Some("new"), None, None);
        assert!(fresh.get() > fb2.get());
    }

    #[test]
    fn a_condemned_frame_that_becomes_reachable_stays() {
        let i = Interner::new();
        let b = mapping(&i, b"/tmp/fresh_2.so", b"cc", 0x9000);
        let f = i.intern_frame(Some(b), 0x20, Some("f"), None, None);
        i.retire_unused([]);
        // A stack naming f arrived before the next pass: f is kept, with
        // its mapping and strings, and interning it again finds it.
        let r = i.retire_unused([f]);
        assert_eq!(r.dropped, (0, 0, 0));
        assert_eq!(r.condemned, (0, 0, 0));
        assert!(i.has_frame(f));
        assert_eq!(i.intern_frame(Some(b), 0x20, Some("f"), None, None), f);
        assert_eq!(mapping(&i, b"/tmp/fresh_2.so", b"cc", 0x9000), b);
    }

    #[test]
    fn interning_a_condemned_entry_again_revives_its_id() {
        let i = Interner::new();
        let b = mapping(&i, b"/tmp/fresh_3.so", b"dd", 0x9000);
        let f = i.intern_frame(Some(b), 0x20, Some("g"), None, None);
        assert_eq!(i.retire_unused([]).condemned, (1, 1, 4));
        // A worker that forgot its caches interns the same pc again: the
        // same ids, never a second id for the same content.
        assert_eq!(mapping(&i, b"/tmp/fresh_3.so", b"dd", 0x9000), b);
        assert_eq!(i.intern_frame(Some(b), 0x20, Some("g"), None, None), f);
        // Revived but (its stack not arrived yet) still unreachable: the
        // next pass condemns it again instead of dropping it.
        let r = i.retire_unused([]);
        assert_eq!((r.dropped, r.condemned), ((0, 0, 0), (1, 1, 4)));
        assert!(i.has_frame(f));
    }

    #[test]
    fn the_frames_of_a_kept_frames_expansion_stay() {
        let i = Interner::new();
        let m = mapping(&i, b"/lib/libx.so", b"xx", 0x1000);
        let pc = i.intern_frame(Some(m), 0x10, None, None, None);
        let outer = i.intern_frame(Some(m), 0x10, Some("outer"), Some("x.c"), Some(3));
        let inner = i.intern_frame(Some(m), 0x10, Some("inner"), Some("x.c"), Some(9));
        i.set_expansion(pc, vec![outer, inner].into());
        i.retire_unused([pc]);
        let r = i.retire_unused([pc]);
        assert_eq!(r.dropped, (0, 0, 0));
        assert_eq!(i.expansion(pc).as_deref(), Some(&[outer, inner][..]));
        // Without pc, the chain goes too, and so does the expansion.
        i.retire_unused([]);
        i.retire_unused([]);
        assert!(!i.has_frame(pc) && !i.has_frame(inner));
        assert!(i.expansion(pc).is_none());
        // A late expansion of a dropped frame is not kept.
        i.set_expansion(pc, vec![outer].into());
        assert!(i.expansion(pc).is_none());
    }
}
