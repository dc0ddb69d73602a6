//! The interned tables of a trace (per packet sequence, and the
//! ProfilePacket-local ones of Android Q traces), and resolving a
//! callstack's ids into named frames through them.

use std::sync::Arc;

use heapprofd_proto::perfetto as pf;
use rustc_hash::{FxHashMap, FxHashSet};

use super::data::{Frame, ResolvedFrame};

/// Interned tables of one sequence generation (or one ProfilePacket group).
#[derive(Debug, Default)]
pub(super) struct Tables {
    pub(super) function_names: FxHashMap<u64, Vec<u8>>,
    pub(super) build_ids: FxHashMap<u64, Vec<u8>>,
    pub(super) mapping_paths: FxHashMap<u64, Vec<u8>>,
    pub(super) source_paths: FxHashMap<u64, Vec<u8>>,
    /// ProfilePacket.strings: one table for every role.
    pub(super) strings: FxHashMap<u64, Vec<u8>>,
    pub(super) mappings: FxHashMap<u64, pf::Mapping>,
    pub(super) frames: FxHashMap<u64, pf::Frame>,
    pub(super) callstacks: FxHashMap<u64, Vec<u64>>,
}

impl Tables {
    pub(super) fn add_interned(&mut self, d: pf::InternedData) {
        let put = |t: &mut FxHashMap<u64, Vec<u8>>, v: Vec<pf::InternedString>| {
            t.extend(v.into_iter().map(|s| (s.iid(), s.str.unwrap_or_default())));
        };
        put(&mut self.function_names, d.function_names);
        put(&mut self.build_ids, d.build_ids);
        put(&mut self.mapping_paths, d.mapping_paths);
        put(&mut self.source_paths, d.source_paths);
        self.mappings
            .extend(d.mappings.into_iter().map(|m| (m.iid(), m)));
        self.frames
            .extend(d.frames.into_iter().map(|f| (f.iid(), f)));
        self.callstacks
            .extend(d.callstacks.into_iter().map(|c| (c.iid(), c.frame_ids)));
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Resolves callstacks through a sequence's tables and a group's local
/// ones (looked up first), caching frames and collecting warnings.
pub(super) struct Resolver<'a> {
    pub(super) interned: &'a Tables,
    pub(super) local: &'a Tables,
    pub(super) cache: FxHashMap<u64, Frame>,
    /// Every distinct frame resolved so far, shared by all the stacks
    /// that hold it (see [`Frame`]).
    pub(super) pool: &'a mut FxHashSet<Frame>,
    pub(super) warnings: &'a mut Vec<String>,
}

/// The pooled copy of `f`: the one already in `pool`, or `f` added to it.
pub(super) fn pooled(pool: &mut FxHashSet<Frame>, f: ResolvedFrame) -> Frame {
    if let Some(p) = pool.get(&f) {
        return Arc::clone(p);
    }
    let f = Arc::new(f);
    pool.insert(Arc::clone(&f));
    f
}

impl Resolver<'_> {
    fn string(
        &mut self,
        iid: u64,
        table: fn(&Tables) -> &FxHashMap<u64, Vec<u8>>,
    ) -> Option<String> {
        if iid == 0 {
            return None;
        }
        if let Some(s) = self.local.strings.get(&iid) {
            return Some(lossy(s));
        }
        match table(self.interned).get(&iid) {
            Some(s) => Some(lossy(s)),
            None => {
                self.warnings.push(format!("string {iid} is not interned"));
                None
            }
        }
    }

    fn frame(&mut self, iid: u64) -> Frame {
        if let Some(f) = self.cache.get(&iid) {
            return Arc::clone(f);
        }
        let frame = self
            .local
            .frames
            .get(&iid)
            .or_else(|| self.interned.frames.get(&iid))
            .cloned();
        let Some(frame) = frame else {
            self.warnings.push(format!("frame {iid} is not interned"));
            return Arc::new(ResolvedFrame {
                function: Some(format!("<frame {iid}>")),
                ..Default::default()
            });
        };
        let function = self
            .string(frame.function_name_id(), |t| &t.function_names)
            .filter(|s| !s.is_empty());
        let source_file = self.string(frame.source_path_iid(), |t| &t.source_paths);
        let mut mapping = None;
        let mut build_id = Vec::new();
        let mid = frame.mapping_id();
        let m = self
            .local
            .mappings
            .get(&mid)
            .or_else(|| self.interned.mappings.get(&mid))
            .cloned();
        match m {
            Some(m) => {
                let comps: Vec<String> = m
                    .path_string_ids
                    .iter()
                    .filter_map(|&s| self.string(s, |t| &t.mapping_paths))
                    .collect();
                if !comps.is_empty() {
                    let path = format!("/{}", comps.join("/"));
                    mapping = Some(
                        path.strip_prefix('/')
                            .filter(|p| p.starts_with('/'))
                            .map_or(path.clone(), str::to_owned),
                    );
                }
                let b = m.build_id();
                if b != 0 {
                    build_id = match self.local.strings.get(&b) {
                        Some(s) => s.clone(),
                        None => match self.interned.build_ids.get(&b) {
                            Some(s) => s.clone(),
                            None => {
                                self.warnings.push(format!("build id {b} is not interned"));
                                Vec::new()
                            }
                        },
                    };
                }
            }
            None if mid != 0 => self.warnings.push(format!("mapping {mid} is not interned")),
            None => {}
        }
        let r = ResolvedFrame {
            function,
            mapping,
            build_id,
            rel_pc: frame.rel_pc(),
            source_file,
            line: frame.line_number.filter(|&l| l != 0),
        };
        let r = pooled(self.pool, r);
        self.cache.insert(iid, Arc::clone(&r));
        r
    }

    pub(super) fn callstack(&mut self, iid: u64) -> Vec<Frame> {
        let ids = self
            .local
            .callstacks
            .get(&iid)
            .or_else(|| self.interned.callstacks.get(&iid))
            .cloned();
        match ids {
            Some(ids) => ids.into_iter().map(|f| self.frame(f)).collect(),
            None => {
                self.warnings
                    .push(format!("callstack {iid} is not interned"));
                vec![Arc::new(ResolvedFrame {
                    function: Some(format!("<callstack {iid}>")),
                    ..Default::default()
                })]
            }
        }
    }
}
