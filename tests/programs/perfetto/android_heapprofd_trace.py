#!/usr/bin/env python3
"""Writes a trace shaped exactly as Android's heapprofd (Perfetto) writes one,
with the official schema (the `perfetto` Python package), for the tests of
`heapprofd-rs symbolize` and `report` on traces from Perfetto's own heapprofd.

    android_heapprofd_trace.py [--android-q] SPEC.json OUT

SPEC (JSON): {"pid": N, "cmdline": "...", "heap": "libc.malloc",
  "interval": BYTES, "mappings": [{"path", "build_id" (hex), "start", "end",
  "exact_offset", "start_offset", "load_bias"}], "stacks": [{"frames":
  [[MAPPING_INDEX, REL_PC], ...] (outermost caller first), "alloc_count",
  "self_allocated"}]}

The shape, as src/profiling/memory/ (heapprofd_producer.cc,
bookkeeping_dump.cc) and src/profiling/common/interning_output.cc write it:
- traced's packets on their own sequence: a ClockSnapshot (BOOTTIME,
  MONOTONIC_COARSE, ...) and the process tree (traced_probes);
- heapprofd's sequence: first the fixed internings packet (iid 0 = "" in
  build_ids, mapping_paths and function_names, SEQ_INCREMENTAL_STATE_CLEARED),
  then per dump one TracePacket holding ProfilePacket{index 0, continued,
  process_dumps: [ProcessHeapSamples header + samples]} and, in the same
  TracePacket, the InternedData the samples need (per mapping: its path
  components, its build id as the RAW bytes of the ELF note, the Mapping;
  per frame: its function name string, the Frame; then the Callstacks,
  frame ids outermost first), then an empty ProfilePacket{index 1} closing
  the dump;
- one string interner for all three string kinds (ids from 1, a string used
  as two kinds emitted in each table); unsymbolized frames name the
  interned empty string; mappings and frames are numbered by interners of
  their own, callstack ids are trie node ids (the root, 1, is
  never emitted); no symbols anywhere.

--android-q: as Android 10 (Q) wrote it: the strings (one table for every
kind), mappings, frames and callstacks in the ProfilePacket itself, which
ends the dump (`continued` unset); no InternedData.
"""

import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

CLEARED = 1
BOOTTIME, MONOTONIC_COARSE, MONOTONIC, REALTIME = 6, 4, 3, 1
TRACED_SEQ, PROBES_SEQ, HEAPPROFD_SEQ = 1, 2, 3
T0 = 1_000_000_000_000  # BOOTTIME of the dump, ns
COARSE_OFFSET = 250_000_000  # MONOTONIC_COARSE = BOOTTIME - this (suspend time)


class Interner:
    """heapprofd's string interner: one id space, ids from 1."""

    def __init__(self):
        self.ids = {}

    def id(self, s):
        if s not in self.ids:
            self.ids[s] = len(self.ids) + 1
        return self.ids[s]


def main(argv):
    q = argv[1:2] == ["--android-q"]
    if q:
        argv = argv[:1] + argv[2:]
    spec = json.load(open(argv[1]))
    trace = pb.Trace()

    p = trace.packet.add()
    p.trusted_packet_sequence_id = TRACED_SEQ
    p.trusted_uid = 9999
    p.timestamp = T0 - 1_000_000
    cs = p.clock_snapshot
    for cid, ts in ((BOOTTIME, T0 - 1_000_000), (MONOTONIC_COARSE, T0 - 1_000_000 - COARSE_OFFSET),
                    (MONOTONIC, T0 - 1_000_000 - COARSE_OFFSET), (REALTIME, 1_700_000_000_000_000_000)):
        c = cs.clocks.add()
        c.clock_id = cid
        c.timestamp = ts
    cs.primary_trace_clock = BOOTTIME

    p = trace.packet.add()
    p.trusted_packet_sequence_id = PROBES_SEQ
    p.trusted_uid = 9999
    p.timestamp = T0 - 500_000
    proc = p.process_tree.processes.add()
    proc.pid = spec["pid"]
    proc.ppid = 1
    proc.uid = 10123
    proc.cmdline.append(spec["cmdline"])

    # The fixed internings packet.
    p = trace.packet.add() if not q else pb.TracePacket()
    p.trusted_packet_sequence_id = HEAPPROFD_SEQ
    p.trusted_uid = 1067
    p.sequence_flags = CLEARED
    for table in (p.interned_data.build_ids, p.interned_data.mapping_paths, p.interned_data.function_names):
        s = table.add()
        s.iid = 0
        s.str = b""

    # The dump: samples, then in the same TracePacket the interned data.
    p = trace.packet.add()
    p.trusted_packet_sequence_id = HEAPPROFD_SEQ
    p.trusted_uid = 1067
    p.timestamp = T0
    pp = p.profile_packet
    pp.index = 0
    pp.continued = not q
    d = pp.process_dumps.add()
    d.pid = spec["pid"]
    d.from_startup = False
    d.rejected_concurrent = False
    d.disconnected = False
    d.buffer_overran = False
    d.buffer_corrupted = False
    d.hit_guardrail = False
    d.heap_name = spec["heap"]
    d.sampling_interval_bytes = spec["interval"]
    d.orig_sampling_interval_bytes = spec["interval"]
    d.timestamp = T0 - COARSE_OFFSET
    d.stats.unwinding_errors = 0
    d.stats.heap_samples = sum(s["alloc_count"] for s in spec["stacks"])
    d.stats.map_reparses = 0
    d.stats.total_unwinding_time_us = 300 * d.stats.heap_samples

    strings = Interner()
    interned = pp if q else p.interned_data
    dumped = {"build_ids": set(), "mapping_paths": set(), "function_names": set(), "strings": set()}

    def write_string(kind, s):
        kind = "strings" if q else kind
        iid = strings.id(s)
        if iid not in dumped[kind]:
            e = getattr(interned, kind).add()
            e.iid = iid
            e.str = s
            dumped[kind].add(iid)
        return iid

    # Mappings and frames have interners of their own (ids from 1 each).
    mapping_ids = {}
    frame_ids = {}

    def write_mapping(i):
        if i in mapping_ids:
            return mapping_ids[i]
        m = spec["mappings"][i]
        comps = [c for c in m["path"].split("/") if c]
        comp_ids = [write_string("mapping_paths", c.encode()) for c in comps]
        bid = write_string("build_ids", bytes.fromhex(m["build_id"]))
        pm = interned.mappings.add()
        pm.iid = len(mapping_ids) + 1
        pm.exact_offset = m["exact_offset"]
        pm.start_offset = m["start_offset"]
        pm.start = m["start"]
        pm.end = m["end"]
        pm.load_bias = m["load_bias"]
        pm.build_id = bid
        pm.path_string_ids.extend(comp_ids)
        mapping_ids[i] = pm.iid
        return pm.iid

    def write_frame(mi, rel_pc):
        key = (mi, rel_pc)
        if key in frame_ids:
            return frame_ids[key]
        mid = write_mapping(mi)
        name = write_string("function_names", b"")
        f = interned.frames.add()
        f.iid = len(frame_ids) + 1
        f.function_name_id = name
        f.mapping_id = mid
        f.rel_pc = rel_pc
        frame_ids[key] = f.iid
        return f.iid

    # Callstack ids are trie node ids: the root is 1 and never emitted.
    nodes = {(): 1}
    callstacks = []
    for st in spec["stacks"]:
        path = ()
        for fr in st["frames"]:
            path = path + (tuple(fr),)
            if path not in nodes:
                nodes[path] = len(nodes) + 1
        fids = [write_frame(mi, pc) for mi, pc in st["frames"]]
        cid = nodes[path]
        callstacks.append((cid, fids))
        sample = d.samples.add()
        sample.callstack_id = cid
        sample.self_allocated = st["self_allocated"]
        sample.self_freed = 0
        sample.alloc_count = st["alloc_count"]
        sample.free_count = 0
    for cid, fids in callstacks:
        c = interned.callstacks.add()
        c.iid = cid
        c.frame_ids.extend(fids)

    # The empty ProfilePacket that closes the dump.
    p = trace.packet.add() if not q else pb.TracePacket()
    p.trusted_packet_sequence_id = HEAPPROFD_SEQ
    p.trusted_uid = 1067
    p.timestamp = T0
    p.profile_packet.index = 1

    with open(argv[2], "wb") as f:
        f.write(trace.SerializeToString())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
