//! What the trace's `ProcessTree` packets say: every profiled process (pid,
//! parent, command line) and its threads (tid, name), and the parents of
//! profiled processes that are not profiled themselves (a shell's
//! subshell, `record` itself), named from what was read at the child's
//! handshake, so the Perfetto UI shows each process under a named parent
//! instead of under pid 0 or a bare pid. An entry is written again only
//! when it changed, and a thread only when it is new or renamed (a program
//! that starts threads all the time would otherwise have every thread it
//! ever had written again at every dump). Threads the profile forgot
//! (dead ones, see `ProcessState::forget_threads`) are forgotten here too.

use std::collections::BTreeMap;

use heapprofd_proto::perfetto::{ProcessTree, process_tree};
use rustc_hash::FxHashMap;

use crate::profile::{ParentProcess, Profile};

/// The entries written so far, by pid: what the next [`Self::update`]
/// compares against (a process entry, and per thread a hash of the name
/// written).
#[derive(Debug, Default)]
pub(super) struct WrittenProcesses {
    written: FxHashMap<u32, (process_tree::Process, FxHashMap<u32, u64>)>,
}

fn name_hash(name: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(name)
}

impl WrittenProcesses {
    /// The entries of `profile` not written yet, or changed since (then
    /// taken as written); `None` if there are none.
    pub(super) fn update(&mut self, profile: &Profile) -> Option<ProcessTree> {
        let parents: BTreeMap<u32, &ParentProcess> = profile
            .processes()
            .filter_map(|p| p.identity.parent.as_ref())
            .filter(|pp| profile.process(pp.pid).is_none())
            .map(|pp| (pp.pid, pp))
            .collect();
        // A parent's own parent is named only if the trace has it too (else
        // trace_processor would make a bare process of it).
        let known = |pid: u32| profile.process(pid).is_some() || parents.contains_key(&pid);
        let mut tree = ProcessTree::default();
        // Parents first, so their children's ppids meet a named process.
        for pp in parents.values() {
            let entry = process_tree::Process {
                pid: Some(pp.pid as i32),
                ppid: pp.ppid.filter(|&g| known(g)).map(|g| g as i32),
                cmdline: pp.cmdline.clone(),
                ..Default::default()
            };
            self.add(&mut tree, entry);
        }
        for p in profile.processes() {
            let entry = process_tree::Process {
                pid: Some(p.pid as i32),
                ppid: p.identity.ppid.map(|pp| pp as i32),
                cmdline: p.cmdline.clone(),
                ..Default::default()
            };
            let written = self.add(&mut tree, entry);
            let threads = &p.identity.threads;
            written.retain(|tid, _| threads.contains_key(tid));
            for (&tid, name) in threads {
                let h = name_hash(name);
                if written.insert(tid, h) == Some(h) {
                    continue;
                }
                tree.threads.push(process_tree::Thread {
                    tid: Some(tid as i32),
                    name: (!name.is_empty()).then(|| name.clone()),
                    tgid: Some(p.pid as i32),
                    ..Default::default()
                });
            }
        }
        (!tree.processes.is_empty() || !tree.threads.is_empty()).then_some(tree)
    }

    /// Puts `entry` in `tree` unless it was written unchanged; returns the
    /// process's written threads.
    fn add(
        &mut self,
        tree: &mut ProcessTree,
        entry: process_tree::Process,
    ) -> &mut FxHashMap<u32, u64> {
        let pid = entry.pid.unwrap_or(0) as u32;
        let slot = self.written.entry(pid).or_default();
        if slot.0 != entry {
            tree.processes.push(entry.clone());
            slot.0 = entry;
        }
        &mut slot.1
    }
}
