//! Offline symbols: the `ModuleSymbols` packets that `heapprofd-rs
//! symbolize` (and Perfetto's `traceconv symbolize`) append to a trace whose
//! frames have only build ids and addresses.
//!
//! They are matched as trace processor matches them (`ParseModuleSymbols`):
//! a module by its mapping's path (as trace processor shows it) and raw
//! build id, an address by the frame's `rel_pc`. Only frames without a
//! function name take them. An address's lines are its inline chain,
//! innermost first; the frame becomes that chain outermost first, every
//! entry with the frame's mapping and `rel_pc`, the way the trace writer
//! writes a symbolized frame (`Interner::set_expansion`), so the innermost
//! function names the place that allocated, as it does in a trace
//! symbolized while recording.

use std::sync::Arc;

use heapprofd_proto::perfetto as pf;
use rustc_hash::{FxHashMap, FxHashSet};

use super::data::{Frame, ResolvedFrame};
use super::interned::pooled;

/// One function of an address's inline chain.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    function: String,
    source_file: Option<String>,
    line: Option<u32>,
}

/// Every `ModuleSymbols` of a trace: per (mapping path, raw build id), per
/// address, the inline chain innermost first.
#[derive(Debug, Default)]
pub(super) struct ModuleSymbolTable {
    modules: FxHashMap<(String, Vec<u8>), FxHashMap<u64, Vec<Line>>>,
}

impl ModuleSymbolTable {
    /// Adds one packet's symbols (a later packet's address wins).
    pub(super) fn add(&mut self, m: pf::ModuleSymbols) {
        let key = (m.path.unwrap_or_default(), m.build_id.unwrap_or_default());
        let module = self.modules.entry(key).or_default();
        for a in m.address_symbols {
            let lines: Vec<Line> = a
                .lines
                .into_iter()
                .filter_map(|l| {
                    Some(Line {
                        function: l.function_name.filter(|f| !f.is_empty())?,
                        source_file: l.source_file_name.filter(|f| !f.is_empty()),
                        line: l.line_number.filter(|&n| n != 0),
                    })
                })
                .collect();
            if let (Some(addr), false) = (a.address, lines.is_empty()) {
                module.insert(addr, lines);
            }
        }
    }

    /// Whether there are no symbols at all.
    pub(super) fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// `frames` (outermost first) with every unnamed frame that has
    /// symbols replaced by its inline chain, outermost first; `None` if no
    /// frame changed.
    pub(super) fn apply(
        &self,
        frames: &[Frame],
        pool: &mut FxHashSet<Frame>,
    ) -> Option<Vec<Frame>> {
        let chain_of = |f: &ResolvedFrame| {
            if f.function.is_some() {
                return None;
            }
            let key = (f.mapping.clone()?, f.build_id.clone());
            self.modules.get(&key)?.get(&f.rel_pc)
        };
        if !frames.iter().any(|f| chain_of(f).is_some()) {
            return None;
        }
        let mut out = Vec::with_capacity(frames.len() + 2);
        for f in frames {
            match chain_of(f) {
                Some(chain) => out.extend(chain.iter().rev().map(|l| {
                    let named = ResolvedFrame {
                        function: Some(l.function.clone()),
                        source_file: l.source_file.clone(),
                        line: l.line,
                        ..ResolvedFrame::clone(f)
                    };
                    pooled(pool, named)
                })),
                None => out.push(Arc::clone(f)),
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(f: &str, file: &str, n: u32) -> pf::Line {
        pf::Line {
            function_name: Some(f.into()),
            source_file_name: Some(file.into()),
            line_number: Some(n),
        }
    }

    fn frame(mapping: &str, build_id: &[u8], rel_pc: u64) -> ResolvedFrame {
        ResolvedFrame {
            mapping: Some(mapping.into()),
            build_id: build_id.to_vec(),
            rel_pc,
            ..Default::default()
        }
    }

    #[test]
    fn unnamed_frames_of_the_module_become_their_inline_chain() {
        let mut t = ModuleSymbolTable::default();
        t.add(pf::ModuleSymbols {
            path: Some("/bin/app".into()),
            build_id: Some(vec![0xab, 0xcd]),
            address_symbols: vec![pf::AddressSymbols {
                address: Some(0x11ad),
                lines: vec![line("leaf", "a.c", 7), line("caller", "a.c", 20)],
            }],
        });
        let named = ResolvedFrame {
            function: Some("main".into()),
            ..frame("/bin/app", &[0xab, 0xcd], 0x11ad)
        };
        let stack: Vec<Frame> = [
            named.clone(),
            frame("/bin/app", &[0xab, 0xcd], 0x11ad),
            // Same address, other build id / other path: not this module.
            frame("/bin/app", &[0xee], 0x11ad),
            frame("/bin/other", &[0xab, 0xcd], 0x11ad),
        ]
        .map(Arc::new)
        .into();
        let mut pool = FxHashSet::default();
        let out = t.apply(&stack, &mut pool).expect("a frame changed");
        let names: Vec<String> = out.iter().map(|f| f.display_name()).collect();
        assert_eq!(
            names,
            ["main", "caller", "leaf", "app+0x11ad", "other+0x11ad"]
        );
        assert_eq!(out[2].source_file.as_deref(), Some("a.c"));
        assert_eq!(out[2].line, Some(7));
        assert_eq!(out[2].rel_pc, 0x11ad);
        assert_eq!(out[2].build_id, [0xab, 0xcd]);
        // A stack with nothing to symbolize is left alone.
        assert_eq!(t.apply(&stack[2..], &mut pool), None);
        // The frames made are shared by every stack that has them.
        let again = t.apply(&stack, &mut pool).unwrap();
        assert!(out.iter().zip(&again).all(|(a, b)| Arc::ptr_eq(a, b)));
    }
}
