//! The frames of a trace that have no function name, per module: what
//! `symbolize` looks up. Interned data is per packet sequence and is
//! dropped when a packet clears the sequence's incremental state; a frame
//! is resolved against its sequence's tables at the end of the packet that
//! interns it (its mapping may come in the same packet). Android 10's
//! heapprofd put its tables in the ProfilePacket itself (one `strings`
//! table for every kind, `mappings`, `frames`): those are looked up first,
//! as trace_processor does, and dropped when the dump's last packet
//! (`continued` unset) ends it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use heapprofd_proto::perfetto::{
    Frame, InternedData, Mapping, ProfilePacket, Trace, TracePacket, trace_packet,
};

/// A module as a trace names it: its mapping's path and raw build id.
pub type ModuleKey = (String, Vec<u8>);

/// `SEQ_INCREMENTAL_STATE_CLEARED` of `TracePacket.sequence_flags`.
const INCREMENTAL_STATE_CLEARED: u32 = 1;

/// One kind of interned string.
#[derive(Debug, Clone, Copy)]
enum Kind {
    FunctionName,
    BuildId,
    MappingPath,
}

#[derive(Debug, Default)]
struct Tables {
    function_names: HashMap<u64, Vec<u8>>,
    build_ids: HashMap<u64, Vec<u8>>,
    mapping_paths: HashMap<u64, Vec<u8>>,
    /// A ProfilePacket's `strings`: one table for every kind.
    strings: HashMap<u64, Vec<u8>>,
    /// Mapping iid -> (build id iid, path component iids).
    mappings: HashMap<u64, (u64, Vec<u64>)>,
}

impl Tables {
    fn add_mappings(&mut self, mappings: &[Mapping]) {
        for m in mappings {
            self.mappings.insert(
                m.iid.unwrap_or(0),
                (m.build_id.unwrap_or(0), m.path_string_ids.clone()),
            );
        }
    }

    fn add(&mut self, d: &InternedData) {
        for (table, v) in [
            (&mut self.function_names, &d.function_names),
            (&mut self.build_ids, &d.build_ids),
            (&mut self.mapping_paths, &d.mapping_paths),
        ] {
            for s in v {
                table.insert(s.iid.unwrap_or(0), s.str.clone().unwrap_or_default());
            }
        }
        self.add_mappings(&d.mappings);
    }

    fn add_profile_packet(&mut self, pp: &ProfilePacket) {
        for s in &pp.strings {
            self.strings
                .insert(s.iid.unwrap_or(0), s.str.clone().unwrap_or_default());
        }
        self.add_mappings(&pp.mappings);
    }

    fn kind(&self, kind: Kind) -> &HashMap<u64, Vec<u8>> {
        match kind {
            Kind::FunctionName => &self.function_names,
            Kind::BuildId => &self.build_ids,
            Kind::MappingPath => &self.mapping_paths,
        }
    }
}

/// A sequence's tables: its interned data and the current dump's
/// ProfilePacket tables (looked up first).
#[derive(Debug, Default)]
struct Sequence {
    interned: Tables,
    local: Tables,
}

impl Sequence {
    fn string(&self, iid: u64, kind: Kind) -> Option<&Vec<u8>> {
        self.local
            .strings
            .get(&iid)
            .or_else(|| self.interned.kind(kind).get(&iid))
    }

    /// The module of mapping `iid`: `/`-joined path components (as
    /// trace_processor joins them) and the raw build id.
    fn module(&self, iid: u64) -> Option<ModuleKey> {
        let (build_id, comps) = self
            .local
            .mappings
            .get(&iid)
            .or_else(|| self.interned.mappings.get(&iid))?;
        let parts: Vec<String> = comps
            .iter()
            .map(|&c| {
                String::from_utf8_lossy(self.string(c, Kind::MappingPath).map_or(&[][..], |v| v))
                    .into_owned()
            })
            .collect();
        let joined = format!("/{}", parts.join("/"));
        let path = match joined.strip_prefix('/') {
            Some(rest) if rest.starts_with('/') => rest.to_string(),
            _ => joined,
        };
        let build_id = self.string(*build_id, Kind::BuildId).cloned();
        Some((path, build_id.unwrap_or_default()))
    }

    fn named(&self, function_name_id: Option<u64>) -> bool {
        function_name_id
            .filter(|&id| id != 0)
            .and_then(|id| self.string(id, Kind::FunctionName))
            .is_some_and(|n| !n.is_empty())
    }

    /// Adds the unnamed ones of `frames` to `out`.
    fn collect(&self, frames: &[Frame], out: &mut BTreeMap<ModuleKey, BTreeSet<u64>>) {
        for f in frames {
            if self.named(f.function_name_id) {
                continue;
            }
            if let Some(key) = f.mapping_id.and_then(|m| self.module(m)) {
                out.entry(key).or_default().insert(f.rel_pc.unwrap_or(0));
            }
        }
    }
}

/// The `rel_pc`s of every unnamed frame, per module.
pub fn unsymbolized(trace: &Trace) -> BTreeMap<ModuleKey, BTreeSet<u64>> {
    let mut seqs: HashMap<u32, Sequence> = HashMap::new();
    let mut out: BTreeMap<ModuleKey, BTreeSet<u64>> = BTreeMap::new();
    for p in &trace.packet {
        let seq = sequence(p);
        if p.sequence_flags.unwrap_or(0) & INCREMENTAL_STATE_CLEARED != 0 {
            seqs.remove(&seq);
        }
        let pp = match &p.data {
            Some(trace_packet::Data::ProfilePacket(pp)) => Some(pp),
            _ => None,
        };
        if p.interned_data.is_none() && pp.is_none() {
            continue;
        }
        let s = seqs.entry(seq).or_default();
        if let Some(d) = &p.interned_data {
            s.interned.add(d);
        }
        if let Some(pp) = pp {
            s.local.add_profile_packet(pp);
        }
        if let Some(d) = &p.interned_data {
            s.collect(&d.frames, &mut out);
        }
        if let Some(pp) = pp {
            s.collect(&pp.frames, &mut out);
            if !pp.continued.unwrap_or(false) {
                s.local = Tables::default();
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

#[cfg(test)]
mod tests {
    use super::*;
    use heapprofd_proto::perfetto::{InternedString, profile_packet};

    fn string(iid: u64, s: &[u8]) -> InternedString {
        InternedString {
            iid: Some(iid),
            str: Some(s.to_vec()),
        }
    }

    fn frame(iid: u64, name: u64, mapping: u64, rel_pc: u64) -> Frame {
        Frame {
            iid: Some(iid),
            function_name_id: Some(name),
            mapping_id: Some(mapping),
            rel_pc: Some(rel_pc),
            ..Default::default()
        }
    }

    fn packet(pp: ProfilePacket) -> TracePacket {
        TracePacket {
            data: Some(trace_packet::Data::ProfilePacket(pp)),
            optional_trusted_packet_sequence_id: Some(
                trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(3),
            ),
            ..Default::default()
        }
    }

    /// Android 10's shape: the tables in the ProfilePacket, one string
    /// table for every kind, looked up until the dump's last packet.
    #[test]
    fn profile_packet_tables_until_the_dump_ends() {
        let strings = vec![
            string(1, b"system"),
            string(2, b"bin"),
            string(3, b"app"),
            string(4, &[0xab, 0xcd, 0xef]),
            string(5, b""),
            string(6, b"named"),
        ];
        let first = ProfilePacket {
            strings,
            mappings: vec![Mapping {
                iid: Some(1),
                build_id: Some(4),
                path_string_ids: vec![1, 2, 3],
                ..Default::default()
            }],
            frames: vec![frame(1, 5, 1, 0x1234), frame(2, 6, 1, 0x99)],
            process_dumps: vec![profile_packet::ProcessHeapSamples::default()],
            continued: Some(true),
            index: Some(0),
            ..Default::default()
        };
        // Still the same dump: its tables hold.
        let second = ProfilePacket {
            frames: vec![frame(3, 5, 1, 0x5678)],
            index: Some(1),
            ..Default::default()
        };
        // A new dump: the old tables are gone, mapping 1 unknown.
        let third = ProfilePacket {
            frames: vec![frame(4, 5, 1, 0x9abc)],
            index: Some(2),
            ..Default::default()
        };
        let trace = Trace {
            packet: vec![packet(first), packet(second), packet(third)],
        };
        let got = unsymbolized(&trace);
        let key = ("/system/bin/app".to_string(), vec![0xab, 0xcd, 0xef]);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[&key], BTreeSet::from([0x1234, 0x5678]));
    }
}
