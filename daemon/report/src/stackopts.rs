//! The stack options `report` and `convert` share: `--focus`, `--ignore`,
//! `--fold-lib`, `--full-names` (and `convert`'s `--depth`), applied to a
//! trace before anything is computed from it.
//!
//! * `--focus P` keeps the stacks with a frame matching `P`, `--ignore P`
//!   leaves out those with one (both repeatable; a stack is kept if it
//!   matches any focus and no ignore, as pprof does).
//! * A pattern matches a frame when it is found in the function name (as
//!   the trace has it, or shortened) or the library path; with a `*` it is
//!   a glob over the whole name or path (`*::parse*`, `*/libssl*`).
//! * `--fold-lib L`: each run of consecutive frames inside a library whose
//!   file name contains `L` becomes its outermost frame, the function the
//!   program called (`main;printf;__vfprintf_internal;malloc` with
//!   `--fold-lib libc` becomes `main;printf`).
//! * Names are shortened ([`crate::names`]) unless `--full-names`.
//! * `--depth N` (convert) keeps the outermost `N` frames of each stack:
//!   the flame graph is at most `N` levels deep, deeper values are summed
//!   into the last kept frame.
//!
//! Stacks that become identical are merged (their values and statistics
//! summed), and each heap's timeline is rebuilt over the new stacks.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use heapprofd_model::trace::{
    CallstackValues, Counters, DumpPoint, Frame, HeapProfile, ResolvedFrame, TraceData,
};

use crate::names::shorten;
use heapprofd_model::profile::context::ContextLabels;

/// `--focus`, `--ignore`, `--fold-lib`, `--full-names`.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct StackOptions {
    /// Only stacks with a frame whose function or library matches PATTERN
    /// (a substring, or a glob with `*`); repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub focus: Vec<String>,
    /// Leave out stacks with a frame matching PATTERN; repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub ignore: Vec<String>,
    /// Collapse the frames inside library LIB (e.g. libc, libstdc++) into
    /// the function the program called; repeatable.
    #[arg(long, value_name = "LIB")]
    pub fold_lib: Vec<String>,
    /// Show C++ and Rust names in full (templates and parameter lists are
    /// elided by default).
    #[arg(long)]
    pub full_names: bool,
}

/// Whether `pattern` matches `text` (see the module docs).
pub fn pattern_matches(pattern: &str, text: &str) -> bool {
    if !pattern.contains('*') {
        return text.contains(pattern);
    }
    glob(pattern.as_bytes(), text.as_bytes())
}

fn glob(p: &[u8], t: &[u8]) -> bool {
    // Iterative wildcard match with backtracking to the last `*`.
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

fn frame_matches(pattern: &str, f: &ResolvedFrame) -> bool {
    if let Some(name) = f.function.as_deref()
        && (pattern_matches(pattern, name) || pattern_matches(pattern, &shorten(name)))
    {
        return true;
    }
    f.mapping
        .as_deref()
        .is_some_and(|m| pattern_matches(pattern, m))
}

fn in_lib(lib: &str, f: &ResolvedFrame) -> bool {
    f.mapping
        .as_deref()
        .and_then(|m| m.rsplit('/').next())
        .is_some_and(|base| base.contains(lib))
}

impl StackOptions {
    /// Whether the options change nothing but names.
    fn selects_all(&self) -> bool {
        self.focus.is_empty() && self.ignore.is_empty() && self.fold_lib.is_empty()
    }

    fn keeps(&self, frames: &[Frame]) -> bool {
        let any = |p: &String| frames.iter().any(|f| frame_matches(p, f));
        (self.focus.is_empty() || self.focus.iter().any(any)) && !self.ignore.iter().any(any)
    }

    /// `frames` as these options show them; `renamed` holds the frames
    /// whose names were shortened already, by the address of the original
    /// (the stacks of a trace share their frames, see [`Frame`]).
    fn transform(
        &self,
        frames: &[Frame],
        depth: Option<usize>,
        renamed: &mut FxHashMap<*const ResolvedFrame, Frame>,
    ) -> Vec<Frame> {
        let mut out: Vec<Frame> = Vec::with_capacity(frames.len());
        let mut run_lib: Option<&str> = None;
        for f in frames {
            let lib = self
                .fold_lib
                .iter()
                .find(|l| in_lib(l, f))
                .map(String::as_str);
            if lib.is_some() && lib == run_lib {
                continue; // inside a folded run: keep its outermost frame
            }
            run_lib = lib;
            if self.full_names || f.function.is_none() {
                out.push(Arc::clone(f));
                continue;
            }
            let short = renamed.entry(Arc::as_ptr(f)).or_insert_with(|| {
                Arc::new(ResolvedFrame {
                    function: f.function.as_deref().map(shorten),
                    ..ResolvedFrame::clone(f)
                })
            });
            out.push(Arc::clone(short));
        }
        if let Some(d) = depth {
            out.truncate(d.max(1));
        }
        out
    }

    /// The trace as these options show it (see the module docs); `depth`
    /// is `convert --depth`.
    pub fn apply(&self, data: &TraceData, depth: Option<usize>) -> TraceData {
        if self.selects_all() && self.full_names && depth.is_none() {
            return data.clone();
        }
        let heaps = data
            .heaps
            .iter()
            .map(|h| self.apply_heap(h, depth))
            .collect();
        TraceData {
            heaps,
            ..data.clone()
        }
    }

    fn apply_heap(&self, h: &HeapProfile, depth: Option<usize>) -> HeapProfile {
        type Key = (Option<ContextLabels>, Vec<Frame>);
        let mut renamed = FxHashMap::default();
        let mut by_stack: FxHashMap<Key, u32> = FxHashMap::default();
        let mut callstacks: Vec<CallstackValues> = Vec::new();
        let mut map: Vec<Option<u32>> = Vec::with_capacity(h.callstacks.len());
        for c in &h.callstacks {
            if !self.keeps(&c.frames) {
                map.push(None);
                continue;
            }
            let frames = self.transform(&c.frames, depth, &mut renamed);
            let key = (c.context.clone(), frames);
            match by_stack.get(&key) {
                Some(&j) => {
                    merge_values(&mut callstacks[j as usize], c);
                    map.push(Some(j));
                }
                None => {
                    let j = callstacks.len() as u32;
                    let frames = key.1.clone();
                    by_stack.insert(key, j);
                    callstacks.push(CallstackValues {
                        frames,
                        ..c.clone()
                    });
                    map.push(Some(j));
                }
            }
        }
        HeapProfile {
            callstacks,
            timeline: remap_timeline(&h.timeline, &map),
            ..h.clone()
        }
    }
}

/// Adds `b`'s values into `a` (two stacks that became one).
pub fn merge_values(a: &mut CallstackValues, b: &CallstackValues) {
    a.self_allocated += b.self_allocated;
    a.self_freed += b.self_freed;
    a.alloc_count += b.alloc_count;
    a.free_count += b.free_count;
    a.self_max += b.self_max;
    a.self_max_count += b.self_max_count;
    match (&mut a.stats, &b.stats) {
        (Some(x), Some(y)) => x.merge(y),
        (x @ None, y) => x.clone_from(y),
        _ => {}
    }
}

fn add(a: &mut Counters, b: &Counters) {
    a.allocated += b.allocated;
    a.freed += b.freed;
    a.alloc_count += b.alloc_count;
    a.free_count += b.free_count;
}

fn sub(a: &mut Counters, b: &Counters) {
    a.allocated = a.allocated.saturating_sub(b.allocated);
    a.freed = a.freed.saturating_sub(b.freed);
    a.alloc_count = a.alloc_count.saturating_sub(b.alloc_count);
    a.free_count = a.free_count.saturating_sub(b.free_count);
}

/// A timeline over new stack indices: old stack `i` is now `map[i]`
/// (`None`: left out); totals are recomputed over what is kept.
pub fn remap_timeline(timeline: &[DumpPoint], map: &[Option<u32>]) -> Vec<DumpPoint> {
    let mut latest_old: FxHashMap<u32, Counters> = FxHashMap::default();
    let mut latest_new: FxHashMap<u32, Counters> = FxHashMap::default();
    let mut totals = Counters::default();
    timeline
        .iter()
        .map(|p| {
            let mut touched: Vec<u32> = Vec::new();
            for &(i, c) in &p.changes {
                let Some(Some(j)) = map.get(i as usize).copied() else {
                    continue;
                };
                let old = latest_old.insert(i, c).unwrap_or_default();
                let v = latest_new.entry(j).or_default();
                sub(v, &old);
                add(v, &c);
                sub(&mut totals, &old);
                add(&mut totals, &c);
                if !touched.contains(&j) {
                    touched.push(j);
                }
            }
            touched.sort_unstable();
            DumpPoint {
                start: p.start,
                timestamp: p.timestamp,
                totals,
                changes: touched.iter().map(|&j| (j, latest_new[&j])).collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str, lib: &str) -> Frame {
        Arc::new(ResolvedFrame {
            function: Some(name.to_owned()),
            mapping: Some(format!("/usr/lib/{lib}")),
            ..Default::default()
        })
    }

    fn names(fs: &[Frame]) -> Vec<&str> {
        fs.iter().filter_map(|f| f.function.as_deref()).collect()
    }

    #[test]
    fn patterns() {
        assert!(pattern_matches("parse", "json::parse_value"));
        assert!(pattern_matches("*::parse*", "json::parse_value"));
        assert!(!pattern_matches("*::parse", "json::parse_value"));
        assert!(pattern_matches("*/libssl*", "/usr/lib/libssl.so.3"));
        assert!(pattern_matches("a*b*c", "aXXbYYc"));
        assert!(!pattern_matches("a*b*c", "aXXbYY"));
    }

    #[test]
    fn fold_focus_ignore_depth() {
        let stack = [
            f("main", "app"),
            f("printf", "libc.so.6"),
            f("__vfprintf_internal", "libc.so.6"),
            f("malloc", "libc.so.6"),
        ];
        let o = StackOptions {
            fold_lib: vec!["libc".into()],
            ..Default::default()
        };
        let mut renamed = FxHashMap::default();
        assert_eq!(
            names(&o.transform(&stack, None, &mut renamed)),
            ["main", "printf"]
        );
        assert_eq!(names(&o.transform(&stack, Some(1), &mut renamed)), ["main"]);
        let focus = StackOptions {
            focus: vec!["printf".into()],
            ..Default::default()
        };
        assert!(focus.keeps(&stack));
        assert!(!focus.keeps(&stack[..1]));
        let ignore = StackOptions {
            ignore: vec!["libc.so".into()],
            ..Default::default()
        };
        assert!(!ignore.keeps(&stack));
        assert!(ignore.keeps(&stack[..1]));
    }

    #[test]
    fn merged_stacks_keep_a_consistent_timeline() {
        let point = |changes: Vec<(u32, u64)>| DumpPoint {
            changes: changes
                .into_iter()
                .map(|(i, a)| {
                    (
                        i,
                        Counters {
                            allocated: a,
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            ..Default::default()
        };
        // Old stacks 0 and 1 merge into 0; stack 2 is left out.
        let t = [point(vec![(0, 10), (2, 5)]), point(vec![(1, 7), (0, 12)])];
        let r = remap_timeline(&t, &[Some(0), Some(0), None]);
        assert_eq!(r[0].totals.allocated, 10);
        assert_eq!(r[1].totals.allocated, 19);
        assert_eq!(
            r[1].changes,
            [(
                0,
                Counters {
                    allocated: 19,
                    ..Default::default()
                }
            )]
        );
    }
}
