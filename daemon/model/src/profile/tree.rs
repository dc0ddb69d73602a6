//! The callsite tree: every distinct stack, as a path from the root.
//!
//! A node is (parent, [`FrameId`]); a stack, outermost caller first, is the
//! path from the root to its node, so stacks that share callers share
//! nodes. Node ids are Perfetto callstack iids: the root is 1 and is never
//! emitted (a stack always has at least one frame); ids are never reused,
//! so a callstack written to a trace keeps meaning the same frames.
//!
//! ```text
//!            root (1)
//!            /      \
//!        main (2)   thread_start (5)
//!         /    \          \
//!     foo (3)  bar (4)    worker (6)
//!                           \
//!                          malloc (7)     stack [thread_start, worker, malloc] = 7
//! ```
//!
//! Cumulative per-callsite values never decrease in a trace, so a node
//! keeps its id for as long as anything may still count under it. Nodes
//! nothing counts under any more (their callsites settled, idle, and held
//! by no session: see [`crate::profile::Profile::retire_idle`]) are removed
//! by [`CallsiteTree::retain`]; if their stack comes back it gets new ids,
//! whose totals start from zero. Trace processor adds the last values of
//! the old id to those of a new id with the same frames (its correction for
//! a source callstack that maps to a callsite it has seen), so its totals
//! stay cumulative; `report` sums callsites by their frames.

use std::num::NonZeroU32;

use rustc_hash::FxHashMap;

use super::interner::FrameId;

/// A node of the callsite tree: a stack, outermost caller first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallsiteId(NonZeroU32);

impl CallsiteId {
    /// The root: the empty stack. Never written to a trace.
    pub const ROOT: CallsiteId = CallsiteId(NonZeroU32::MIN);

    /// The id as a number (the root is 1).
    #[inline]
    pub const fn get(self) -> u32 {
        self.0.get()
    }

    /// The id as a Perfetto callstack iid.
    #[inline]
    pub const fn iid(self) -> u64 {
        self.0.get() as u64
    }

    /// The id with number `n`, if `n >= 1`.
    pub const fn new(n: u32) -> Option<Self> {
        match NonZeroU32::new(n) {
            Some(n) => Some(Self(n)),
            None => None,
        }
    }
}

impl std::fmt::Display for CallsiteId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[derive(Debug, Clone, Copy)]
struct Node {
    /// `None` only for the root.
    parent: Option<CallsiteId>,
    /// Meaningless for the root.
    frame: Option<FrameId>,
    depth: u32,
}

/// The callsite tree; see the module docs.
#[derive(Debug)]
pub struct CallsiteTree {
    /// By id; the root included.
    nodes: FxHashMap<CallsiteId, Node>,
    children: FxHashMap<(CallsiteId, FrameId), CallsiteId>,
    /// The id the next node gets (ids are never reused).
    next: u32,
}

impl Default for CallsiteTree {
    fn default() -> Self {
        Self::new()
    }
}

impl CallsiteTree {
    /// A tree with only the root.
    pub fn new() -> Self {
        let mut nodes = FxHashMap::default();
        nodes.insert(
            CallsiteId::ROOT,
            Node {
                parent: None,
                frame: None,
                depth: 0,
            },
        );
        CallsiteTree {
            nodes,
            children: FxHashMap::default(),
            next: 2,
        }
    }

    /// The child of `parent` for `frame`, created if needed.
    pub fn child(&mut self, parent: CallsiteId, frame: FrameId) -> CallsiteId {
        if let Some(&c) = self.children.get(&(parent, frame)) {
            return c;
        }
        let depth = self.nodes.get(&parent).map_or(0, |n| n.depth + 1);
        // Saturates instead of panicking; u32::MAX ids take longer than
        // any profile runs.
        let id = CallsiteId(NonZeroU32::new(self.next).unwrap_or(NonZeroU32::MAX));
        self.next = self.next.saturating_add(1);
        self.nodes.insert(
            id,
            Node {
                parent: Some(parent),
                frame: Some(frame),
                depth,
            },
        );
        self.children.insert((parent, frame), id);
        id
    }

    /// The node of `stack` (outermost caller first), created if needed. The
    /// empty stack is the root.
    pub fn intern(&mut self, stack: &[FrameId]) -> CallsiteId {
        stack
            .iter()
            .fold(CallsiteId::ROOT, |node, &f| self.child(node, f))
    }

    /// The node of `stack` if it exists.
    pub fn find(&self, stack: &[FrameId]) -> Option<CallsiteId> {
        stack.iter().try_fold(CallsiteId::ROOT, |node, &f| {
            self.children.get(&(node, f)).copied()
        })
    }

    /// Parent of `id` (`None` for the root and unknown ids).
    pub fn parent(&self, id: CallsiteId) -> Option<CallsiteId> {
        self.nodes.get(&id)?.parent
    }

    /// Innermost frame of `id` (`None` for the root and unknown ids).
    pub fn frame(&self, id: CallsiteId) -> Option<FrameId> {
        self.nodes.get(&id)?.frame
    }

    /// Number of frames of the stack `id` (0 for the root).
    pub fn depth(&self, id: CallsiteId) -> u32 {
        self.nodes.get(&id).map_or(0, |n| n.depth)
    }

    /// Whether `id` is a node of this tree.
    pub fn contains(&self, id: CallsiteId) -> bool {
        self.nodes.contains_key(&id)
    }

    /// Replaces `out` with the frames of `id`, outermost caller first.
    pub fn stack(&self, id: CallsiteId, out: &mut Vec<FrameId>) {
        out.clear();
        let mut cur = Some(id);
        while let Some(c) = cur {
            let Some(node) = self.nodes.get(&c) else {
                break;
            };
            if let Some(f) = node.frame {
                out.push(f);
            }
            cur = node.parent;
        }
        out.reverse();
    }

    /// Number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The frames of every node (with repeats).
    pub fn frames(&self) -> impl Iterator<Item = FrameId> + '_ {
        self.nodes.values().filter_map(|n| n.frame)
    }

    /// The highest id given so far (ids are never reused).
    pub fn max_id(&self) -> u32 {
        self.next - 1
    }

    /// Keeps the nodes of `keep` and their callers (the root always),
    /// removes every other node; returns how many went. Ids that are not
    /// nodes are ignored.
    pub fn retain(&mut self, keep: impl IntoIterator<Item = CallsiteId>) -> usize {
        let mut kept: rustc_hash::FxHashSet<CallsiteId> = rustc_hash::FxHashSet::default();
        kept.insert(CallsiteId::ROOT);
        for id in keep {
            let mut cur = Some(id);
            while let Some(c) = cur {
                if !self.nodes.contains_key(&c) || !kept.insert(c) {
                    break;
                }
                cur = self.nodes.get(&c).and_then(|n| n.parent);
            }
        }
        let before = self.nodes.len();
        self.nodes.retain(|id, _| kept.contains(id));
        self.children.retain(|_, child| kept.contains(child));
        if self.nodes.len() * 4 < self.nodes.capacity() {
            self.nodes.shrink_to_fit();
            self.children.shrink_to_fit();
        }
        before - self.nodes.len()
    }

    /// Always false: the root is always there.
    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(n: u32) -> FrameId {
        FrameId::new(n).unwrap()
    }

    #[test]
    fn shared_prefixes_share_nodes() {
        let mut t = CallsiteTree::new();
        assert_eq!(t.intern(&[]), CallsiteId::ROOT);
        let a = t.intern(&[f(1), f(2), f(3)]);
        let b = t.intern(&[f(1), f(2), f(4)]);
        assert_ne!(a, b);
        assert_eq!(t.parent(a), t.parent(b));
        assert_eq!(t.len(), 5); // root, 1, 1/2, 1/2/3, 1/2/4
        assert_eq!(t.intern(&[f(1), f(2), f(3)]), a);
        assert_eq!(t.find(&[f(1), f(2)]), t.parent(a));
        assert_eq!(t.find(&[f(2)]), None);
        assert_eq!(t.depth(a), 3);
        assert_eq!(t.frame(a), Some(f(3)));
        assert_eq!(t.frame(CallsiteId::ROOT), None);
        assert_eq!(t.parent(CallsiteId::ROOT), None);
    }

    #[test]
    fn ids_are_sequential_from_two() {
        let mut t = CallsiteTree::new();
        let a = t.intern(&[f(9)]);
        let b = t.intern(&[f(9), f(9)]);
        assert_eq!((a.get(), b.get()), (2, 3));
        // Same frame under a different parent is a different node.
        assert_eq!(t.child(b, f(9)).get(), 4);
    }

    #[test]
    fn stack_walks_back_to_the_root() {
        let mut t = CallsiteTree::new();
        let stack = [f(5), f(6), f(7), f(5)];
        let id = t.intern(&stack);
        let mut out = vec![f(1)];
        t.stack(id, &mut out);
        assert_eq!(out, stack);
        t.stack(CallsiteId::ROOT, &mut out);
        assert!(out.is_empty());
        // Unknown ids give an empty stack, not a panic.
        t.stack(CallsiteId::new(1000).unwrap(), &mut out);
        assert!(out.is_empty());
        assert!(!t.contains(CallsiteId::new(1000).unwrap()));
    }

    #[test]
    fn retain_keeps_callers_and_new_stacks_get_new_ids() {
        let mut t = CallsiteTree::new();
        let a = t.intern(&[f(1), f(2), f(3)]);
        let b = t.intern(&[f(1), f(4)]);
        let c = t.intern(&[f(5)]);
        assert_eq!(t.len(), 6);
        // Keeping a keeps 1 and 1/2; b (1/4) and c (5) go.
        assert_eq!(t.retain([a]), 2);
        assert_eq!(t.len(), 4);
        assert!(t.contains(a) && !t.contains(b) && !t.contains(c));
        assert_eq!(t.find(&[f(1), f(2), f(3)]), Some(a));
        assert_eq!(t.find(&[f(1), f(4)]), None);
        // A stack that went comes back with ids never given before.
        let b2 = t.intern(&[f(1), f(4)]);
        assert!(b2.get() > c.get(), "{b2} after {c}");
        assert_eq!(t.parent(b2), t.parent(a).and_then(|p| t.parent(p)));
        let mut out = Vec::new();
        t.stack(b2, &mut out);
        assert_eq!(out, [f(1), f(4)]);
        // Nothing kept: only the root stays, and unknown ids are ignored.
        assert_eq!(t.retain([CallsiteId::new(999).unwrap()]), 4);
        assert_eq!(t.len(), 1);
        assert_eq!(t.max_id(), b2.get());
    }
}
