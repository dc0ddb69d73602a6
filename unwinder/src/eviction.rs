//! Which modules the [`crate::ModuleCache`] lets go of: the rule, apart
//! from the cache's locking and maps.
//!
//! A module is *in use* while anything besides the cache holds it: a
//! mapping of a process being profiled (its `Arc<Module>`), or a frame
//! waiting to be symbolized (which holds the mapping until its name is
//! known: the daemon's warm-up thread names each new frame at once).
//! Those are never evicted: their memory would stay anyway, and a second
//! copy would be parsed for the next process that maps the same file. A module nobody
//! else holds is *unused*: the process that mapped it unloaded it or ended.
//! Unused modules are kept, least recently looked up first out, within a
//! [`CacheBudget`] (a count and the bytes of their files), so that a
//! library that short-lived processes map one after another (libc under
//! the service) is not read and parsed again for each; beyond the budget
//! they are evicted, symbol caches and DWARF with them.

/// How many unused modules the cache keeps (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheBudget {
    /// Unused modules kept at most.
    pub max_unused_modules: usize,
    /// Bytes of unused modules' files kept at most.
    pub max_unused_bytes: u64,
}

impl Default for CacheBudget {
    /// 64 unused modules, 128 MiB of their files.
    fn default() -> Self {
        CacheBudget {
            max_unused_modules: 64,
            max_unused_bytes: 128 << 20,
        }
    }
}

/// What the rule needs to know of one cached module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate<K> {
    /// The cache's key of the module.
    pub(crate) key: K,
    /// Logical time of its last lookup (larger is more recent).
    pub(crate) last_used: u64,
    /// Bytes of its file.
    pub(crate) bytes: u64,
    /// Something besides the cache holds it.
    pub(crate) in_use: bool,
}

/// The keys to evict so that the unused modules left fit `budget`: the
/// least recently used unused ones; never a module in use.
pub(crate) fn victims<K: Copy>(mut all: Vec<Candidate<K>>, budget: CacheBudget) -> Vec<K> {
    all.retain(|c| !c.in_use);
    let mut count = all.len();
    let mut bytes: u64 = all.iter().map(|c| c.bytes).sum();
    if count <= budget.max_unused_modules && bytes <= budget.max_unused_bytes {
        return Vec::new();
    }
    all.sort_unstable_by_key(|c| c.last_used);
    let mut out = Vec::new();
    for c in all {
        if count <= budget.max_unused_modules && bytes <= budget.max_unused_bytes {
            break;
        }
        out.push(c.key);
        count -= 1;
        bytes -= c.bytes;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(key: u32, last_used: u64, bytes: u64, in_use: bool) -> Candidate<u32> {
        Candidate {
            key,
            last_used,
            bytes,
            in_use,
        }
    }

    fn budget(n: usize, b: u64) -> CacheBudget {
        CacheBudget {
            max_unused_modules: n,
            max_unused_bytes: b,
        }
    }

    #[test]
    fn within_budget_nothing_goes() {
        let all = vec![c(1, 1, 10, false), c(2, 2, 10, false), c(3, 3, 10, true)];
        assert!(victims(all, budget(2, 20)).is_empty());
    }

    #[test]
    fn least_recently_used_unused_go_first() {
        let all = vec![
            c(1, 5, 10, false),
            c(2, 1, 10, false),
            c(3, 3, 10, false),
            c(4, 9, 10, false),
        ];
        assert_eq!(victims(all.clone(), budget(2, 1000)), vec![2, 3]);
        assert_eq!(victims(all, budget(10, 25)), vec![2, 3]);
    }

    #[test]
    fn a_module_in_use_is_never_a_victim() {
        // Oldest, biggest, and over a budget of nothing: kept while in use.
        let all = vec![c(1, 0, 1 << 30, true), c(2, 7, 10, false)];
        assert_eq!(victims(all, budget(0, 0)), vec![2]);
        let all = vec![c(1, 0, 1 << 30, true)];
        assert!(victims(all, budget(0, 0)).is_empty());
    }

    #[test]
    fn budget_of_nothing_evicts_every_unused_module() {
        let all = vec![c(1, 2, 1, false), c(2, 1, 0, false), c(3, 0, 5, true)];
        let mut v = victims(all, budget(0, 0));
        v.sort_unstable();
        assert_eq!(v, vec![1, 2]);
    }
}
