#!/usr/bin/env python3
"""Writes a heap-profile trace laid out as Perfetto's own heapprofd writes it,
with the official trace schema (the `perfetto` PyPI package), independent of
heapprofd-rs's writer. Used by tests/tests/heapprofd_layout.rs.

The layout (../shared/research/perfetto-heapprofd-facts.md): one packet with
the fixed internings (iid 0 = "") that clears the sequence's incremental
state; then per dump a ProfilePacket with the samples (cumulative values,
continued = true), the interned data of the callstacks first used by it
(strings, mappings, frames, callstacks, in that order) in TracePacket
interned_data, and an empty ProfilePacket with the next index that ends the
group. Nothing in a ProfilePacket's own tables (those are Android Q's).
traced's ClockSnapshot relates the dumps' MONOTONIC_COARSE timestamps to
the packets' BOOTTIME.

As heapprofd's interners do (src/profiling/common/interner.h,
callstack_trie.h, interning_output.cc): one string interner for function
names, mapping path components and build ids (ids from 1, never reused, so
the iids of the three tables are disjoint); mappings and frames numbered by
their own interners; a callstack's iid is its leaf's node id in the
callstack trie, whose root (id 1) is never emitted, so callstack iids are
sparse and never 1. Mappings carry a raw (not hex) build id, exact_offset,
start_offset and load_bias; each dump's header has from_startup and
ProcessStats (no start_timestamp: heapprofd before 2026-07 writes none).

Usage: heapprofd_layout_trace.py OUT.pftrace {base|new}
  base: pid 42 (`/system/bin/app`), two dumps (1 s, 2 s):
        grow_site 100 MiB allocated at 1 s, all of it freed by 2 s (the peak
        is the first dump); keep_site 1 MiB, then 2 MiB; late_site (first
        seen in the second dump) 5 MiB; pid 43, one site of 64 KiB.
  new:  the same, but grow_site allocates 2 MiB more by the second dump.
"""

import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

MIB = 1 << 20
BOOT_OFFSET = 3_000_000_000
SEQ = 7


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("base", "new"):
        sys.exit(__doc__)
    out, variant = sys.argv[1], sys.argv[2]
    extra = 2 * MIB if variant == "new" else 0

    trace = pb.Trace()

    def packet(ts=None):
        p = trace.packet.add()
        p.trusted_packet_sequence_id = SEQ
        if ts is not None:
            p.timestamp = ts
        return p

    # traced's clock snapshot (its own sequence): BOOTTIME is the trace
    # clock (packet timestamps); heap dumps carry MONOTONIC_COARSE, here
    # BOOT_OFFSET behind it.
    snap = trace.packet.add()
    snap.trusted_packet_sequence_id = 1
    snap.timestamp = BOOT_OFFSET + 500_000_000
    cs = snap.clock_snapshot
    cs.primary_trace_clock = 6
    for clock_id, value in ((6, BOOT_OFFSET + 500_000_000), (4, 500_000_000),
                            (3, 500_000_000), (1, 1_700_000_000_000_000_000)):
        c = cs.clocks.add()
        c.clock_id = clock_id
        c.timestamp = value

    first = packet()
    first.sequence_flags = 1  # SEQ_INCREMENTAL_STATE_CLEARED
    first.interned_data.build_ids.add(iid=0, str=b"")
    first.interned_data.mapping_paths.add(iid=0, str=b"")
    first.interned_data.function_names.add(iid=0, str=b"")

    # Interned tables: strings, one mapping per library, frames, callstacks.
    # One string interner for every kind (heapprofd's); `dumped` remembers
    # which table each string was emitted in.
    strings = {}
    dumped = set()

    def string_id(s):
        return strings.setdefault(s, len(strings) + 1)

    def name_id(s):
        return string_id(s)

    def path_id(s):
        return string_id(s)

    mappings = {  # iid -> (path components, start, end, raw build id)
        1: (["system", "bin", "app"], 0x5000_0000, 0x5010_0000, bytes.fromhex("a1b2c3d4e5f60718")),
        2: (["system", "lib64", "libc.so"], 0x7000_0000, 0x7010_0000, bytes.fromhex("0badc0de00ff1122")),
    }
    frames = {  # iid -> (function, mapping iid, rel_pc)
        1: ("__libc_init", 2, 0x1200),
        2: ("main", 1, 0x400),
        3: ("grow_site", 1, 0x800),
        4: ("keep_site", 1, 0x900),
        5: ("late_site", 1, 0xA00),
        6: ("malloc", 2, 0x3000),
        7: ("other_site", 1, 0xB00),
    }
    # Callstacks by name (frames root first); the iid is the trie node id
    # of the leaf: nodes numbered as they are created, root = 1.
    trie = {(): 1}

    def node_id(frames_root_first):
        for i in range(1, len(frames_root_first) + 1):
            trie.setdefault(tuple(frames_root_first[:i]), len(trie) + 1)
        return trie[tuple(frames_root_first)]

    stacks_by_name = {
        "grow": [1, 2, 3, 6],
        "keep": [1, 2, 4, 6],
        "late": [1, 2, 5, 6],
        "other": [1, 2, 7, 6],
    }
    sid = {k: node_id(v) for k, v in stacks_by_name.items()}
    callstacks = {sid[k]: v for k, v in stacks_by_name.items()}
    assert 1 not in callstacks and sorted(callstacks) != list(range(1, 5))
    emitted = set()

    def intern(p, css):
        """Interned data for the callstacks not yet emitted, in dependency order."""
        new = [c for c in css if c not in emitted]
        if not new:
            return
        d = p.interned_data
        fr = sorted({f for c in new for f in callstacks[c]} - emitted_frames)
        mp = sorted({frames[f][1] for f in fr} - emitted_mappings)
        for m in mp:
            for comp in mappings[m][0]:
                if (comp, "path") not in dumped:
                    d.mapping_paths.add(iid=path_id(comp), str=comp.encode())
                    dumped.add((comp, "path"))
            build = mappings[m][3]
            if (build, "build") not in dumped:
                d.build_ids.add(iid=string_id(build), str=build)
                dumped.add((build, "build"))
        for f in fr:
            fn = frames[f][0]
            if (fn, "name") not in dumped:
                d.function_names.add(iid=name_id(fn), str=fn.encode())
                dumped.add((fn, "name"))
        for m in mp:
            comps, start, end, build = mappings[m]
            d.mappings.add(
                iid=m,
                build_id=string_id(build),
                exact_offset=0,
                start_offset=0,
                start=start,
                end=end,
                load_bias=0,
                path_string_ids=[path_id(c) for c in comps],
            )
            emitted_mappings.add(m)
        for f in fr:
            fn, m, pc = frames[f]
            d.frames.add(iid=f, function_name_id=name_id(fn), mapping_id=m, rel_pc=pc)
            emitted_frames.add(f)
        for c in new:
            d.callstacks.add(iid=c, frame_ids=callstacks[c])
            emitted.add(c)

    emitted_frames = set()
    emitted_mappings = set()

    # (ts, {pid: [(callstack, allocated, freed, alloc_count, free_count)]})
    dumps = [
        (
            1_000_000_000,
            {
                42: [(sid["grow"], 100 * MIB, 0, 100, 0), (sid["keep"], 1 * MIB, 0, 1, 0)],
                43: [(sid["other"], 64 << 10, 0, 1, 0)],
            },
        ),
        (
            2_000_000_000,
            {
                42: [
                    (sid["grow"], 100 * MIB + extra, 100 * MIB + extra,
                     100 + extra // MIB, 100 + extra // MIB),
                    (sid["keep"], 2 * MIB, 0, 2, 0),
                    (sid["late"], 5 * MIB, 0, 5, 0),
                ],
                43: [(sid["other"], 64 << 10, 0, 1, 0)],
            },
        ),
    ]
    index = 0
    for ts, per_pid in dumps:
        p = packet(BOOT_OFFSET + ts)
        pp = p.profile_packet
        pp.index = index
        pp.continued = True
        index += 1
        for pid, samples in per_pid.items():
            d = pp.process_dumps.add()
            d.pid = pid
            d.from_startup = True
            d.timestamp = ts
            st = d.stats
            st.heap_samples = sum(na for _, _, _, na, _ in samples)
            st.unwinding_errors = 0
            st.total_unwinding_time_us = 40 * st.heap_samples
            for i in range(20):  # LogHistogram: 1 << i us, the last unbounded
                b = st.unwinding_time_us.buckets.add()
                if i < 19:
                    b.upper_limit = 1 << i
                else:
                    b.max_bucket = True
                b.count = st.heap_samples if i == 6 else 0
            d.heap_name = "libc.malloc"
            d.sampling_interval_bytes = 1
            d.orig_sampling_interval_bytes = 1
            for cs, alloc, freed, na, nf in samples:
                s = d.samples.add()
                s.callstack_id = cs
                s.self_allocated = alloc
                s.self_freed = freed
                s.alloc_count = na
                s.free_count = nf
        intern(packet(), [cs for samples in per_pid.values() for cs, *_ in samples])
        end = packet(BOOT_OFFSET + ts)
        end.profile_packet.index = index
        index += 1

    with open(out, "wb") as f:
        f.write(trace.SerializeToString())


if __name__ == "__main__":
    main()
