//! The frames of a trace that have no function name, per module: what
//! `symbolize` looks up. Interned data is per packet sequence and is
//! dropped when a packet clears the sequence's incremental state; a frame
//! is resolved against its sequence's tables at the end of the packet that
//! interns it (its mapping may come in the same packet).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use heapprofd_proto::perfetto::{InternedData, Trace, TracePacket};

/// A module as a trace names it: its mapping's path and raw build id.
pub type ModuleKey = (String, Vec<u8>);

/// `SEQ_INCREMENTAL_STATE_CLEARED` of `TracePacket.sequence_flags`.
const INCREMENTAL_STATE_CLEARED: u32 = 1;

#[derive(Debug, Default)]
struct Tables {
    function_names: HashMap<u64, Vec<u8>>,
    build_ids: HashMap<u64, Vec<u8>>,
    mapping_paths: HashMap<u64, Vec<u8>>,
    /// Mapping iid -> (build id iid, path component iids).
    mappings: HashMap<u64, (u64, Vec<u64>)>,
}

impl Tables {
    fn add(&mut self, d: &InternedData) {
        for s in &d.function_names {
            self.function_names
                .insert(s.iid.unwrap_or(0), s.str.clone().unwrap_or_default());
        }
        for s in &d.build_ids {
            self.build_ids
                .insert(s.iid.unwrap_or(0), s.str.clone().unwrap_or_default());
        }
        for s in &d.mapping_paths {
            self.mapping_paths
                .insert(s.iid.unwrap_or(0), s.str.clone().unwrap_or_default());
        }
        for m in &d.mappings {
            self.mappings.insert(
                m.iid.unwrap_or(0),
                (m.build_id.unwrap_or(0), m.path_string_ids.clone()),
            );
        }
    }

    /// The module of mapping `iid`: `/`-joined path components (as
    /// trace_processor joins them) and the raw build id.
    fn module(&self, iid: u64) -> Option<ModuleKey> {
        let (build_id, comps) = self.mappings.get(&iid)?;
        let parts: Vec<String> = comps
            .iter()
            .map(|c| {
                String::from_utf8_lossy(self.mapping_paths.get(c).map_or(&[][..], |v| v))
                    .into_owned()
            })
            .collect();
        let joined = format!("/{}", parts.join("/"));
        let path = match joined.strip_prefix('/') {
            Some(rest) if rest.starts_with('/') => rest.to_string(),
            _ => joined,
        };
        Some((
            path,
            self.build_ids.get(build_id).cloned().unwrap_or_default(),
        ))
    }

    fn named(&self, function_name_id: Option<u64>) -> bool {
        function_name_id
            .filter(|&id| id != 0)
            .and_then(|id| self.function_names.get(&id))
            .is_some_and(|n| !n.is_empty())
    }
}

/// The `rel_pc`s of every unnamed frame, per module.
pub fn unsymbolized(trace: &Trace) -> BTreeMap<ModuleKey, BTreeSet<u64>> {
    let mut seqs: HashMap<u32, Tables> = HashMap::new();
    let mut out: BTreeMap<ModuleKey, BTreeSet<u64>> = BTreeMap::new();
    for p in &trace.packet {
        let seq = sequence(p);
        if p.sequence_flags.unwrap_or(0) & INCREMENTAL_STATE_CLEARED != 0 {
            seqs.remove(&seq);
        }
        let Some(d) = &p.interned_data else {
            continue;
        };
        let t = seqs.entry(seq).or_default();
        t.add(d);
        for f in &d.frames {
            if t.named(f.function_name_id) {
                continue;
            }
            if let Some(key) = f.mapping_id.and_then(|m| t.module(m)) {
                out.entry(key).or_default().insert(f.rel_pc.unwrap_or(0));
            }
        }
    }
    out
}

fn sequence(p: &TracePacket) -> u32 {
    match p.optional_trusted_packet_sequence_id {
        Some(
            heapprofd_proto::perfetto::trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(
                s,
            ),
        ) => s,
        None => 0,
    }
}
