#!/usr/bin/env python3
"""Check a Perfetto trace (or our .proto schema) against the OFFICIAL schema.

Uses the `perfetto` Python package (`pip install perfetto`), whose
perfetto.protos.perfetto.trace.perfetto_trace_pb2 is generated from the
official Perfetto protos.

    check_trace.py [--strict] [--brief] TRACE
        Parses TRACE as perfetto.protos.Trace, walks every message at every
        depth and reports fields the official schema does not know (unknown
        field numbers, wire-type mismatches and, proto2 being what it is,
        unknown enum values). Prints JSON: packet count, unknown-field paths,
        warnings (semantic problems trace processor would complain about,
        e.g. dangling interned ids) and a summary of what was parsed.
        One field is not unknown: heapprofd-rs's own extension, field
        EXTENSION_FIELD (2^29 - 1) of TracePacket (see daemon/model/src/
        trace/extension.rs); it is counted under "extensions", and only at
        the top level of a TracePacket.

    check_trace.py --schema FILE_DESCRIPTOR_SET
        Compares every message, field and enum of an encoded
        google.protobuf.FileDescriptorSet (heapprofd_proto::perfetto::
        FILE_DESCRIPTOR_SET) with the official descriptors: names, numbers,
        types, labels, oneofs, packing, enum values, reserved numbers.

Exit status: 0 ok; 1 unknown fields, parse failure or schema mismatch (or,
with --strict, any warning); 2 bad usage or unreadable input; 3 the perfetto
or protobuf package is missing.
"""

import argparse
import json
import sys

try:
    import google.protobuf
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
except ImportError as e:  # pragma: no cover - exercised by the Rust tests
    sys.stderr.write(
        "check_trace.py: cannot import the official Perfetto protos (%s).\n"
        "Install them with: pip install perfetto\n" % e
    )
    sys.exit(3)

SEQ_INCREMENTAL_STATE_CLEARED = 1
SEQ_NEEDS_INCREMENTAL_STATE = 2
CLOCK_MONOTONIC_COARSE = 4
CLOCK_BOOTTIME = 6

# heapprofd-rs's extension field of TracePacket (heapprofd_model::trace::
# extension::EXTENSION_FIELD): a length-delimited field Perfetto skips.
EXTENSION_FIELD = (1 << 29) - 1

WIRE_TYPES = {0: "varint", 1: "fixed64", 2: "len", 3: "start_group", 4: "end_group", 5: "fixed32"}

# ---------------------------------------------------------------------------
# Unknown fields
# ---------------------------------------------------------------------------


def _unknown_via_set(msg):
    from google.protobuf import unknown_fields

    return [(f.field_number, f.wire_type) for f in unknown_fields.UnknownFieldSet(msg)]


def _unknown_via_method(msg):
    return [(f.field_number, f.wire_type) for f in msg.UnknownFields()]


def _unknown_via_private(msg):
    out = []
    for tag_bytes, _value in msg._unknown_fields:  # pure-Python implementation
        tag, shift = 0, 0
        for b in bytearray(tag_bytes):
            tag |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        out.append((tag >> 3, tag & 7))
    return out


def _pick_unknown_api():
    """Returns (name, function) of the first unknown-field API that works on
    this protobuf version, proven on a message with a known unknown field."""
    probe = pb.ProfilePacket.HeapSample()
    # Field 7 is reserved in HeapSample: varint 1.
    probe.ParseFromString(b"\x38\x01")
    for name, fn in (
        ("google.protobuf.unknown_fields.UnknownFieldSet", _unknown_via_set),
        ("Message.UnknownFields", _unknown_via_method),
        ("Message._unknown_fields", _unknown_via_private),
    ):
        try:
            if fn(probe) == [(7, 0)]:
                return name, fn
        except Exception:  # noqa: BLE001 - API absent or unimplemented
            continue
    sys.stderr.write(
        "check_trace.py: no working unknown-field API in protobuf %s\n" % google.protobuf.__version__
    )
    sys.exit(3)


UNKNOWN_API_NAME, unknown_fields_of = _pick_unknown_api()


def walk_unknown(msg, path, out):
    """Appends 'path#number (wire type)' for every unknown field under msg
    (heapprofd-rs's extension at the top of a TracePacket excepted)."""
    top_packet = path.startswith("packet[") and "." not in path
    for number, wire_type in unknown_fields_of(msg):
        if top_packet and number == EXTENSION_FIELD and wire_type == 2:
            continue
        out.append("%s#%d (%s)" % (path or "<root>", number, WIRE_TYPES.get(wire_type, wire_type)))
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        name = "%s.%s" % (path, field.name) if path else field.name
        if field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            if value_field.message_type is not None:
                for key in value:
                    walk_unknown(value[key], "%s[%r]" % (name, key), out)
        elif field.is_repeated:
            for i, item in enumerate(value):
                walk_unknown(item, "%s[%d]" % (name, i), out)
        else:
            walk_unknown(value, name, out)


def _varint(data, pos):
    v, shift = 0, 0
    while True:
        b = data[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, pos


def extension_bytes(data):
    """(count, bytes) of heapprofd-rs extension fields at the top level of
    the trace's packets, found by scanning the raw bytes (independent of the
    protobuf library)."""
    count = size = 0
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        length, pos = _varint(data, pos) if key & 7 == 2 else (0, pos)
        end = pos + length
        if key >> 3 == 1 and key & 7 == 2:
            p = pos
            in_packet = 0
            while p < end:
                start = p
                k, p = _varint(data, p)
                wt = k & 7
                if wt == 0:
                    _, p = _varint(data, p)
                elif wt == 1:
                    p += 8
                elif wt == 5:
                    p += 4
                elif wt == 2:
                    n, p = _varint(data, p)
                    p += n
                else:
                    break
                if k >> 3 == EXTENSION_FIELD and wt == 2:
                    count += 1
                    in_packet += p - start
            # The packet's length prefix shrinks with it.
            size += in_packet + _varint_len(length) - _varint_len(length - in_packet)
        pos = end
    return count, size


def _varint_len(v):
    n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------


def text(b):
    """bytes -> str for JSON (lossless for UTF-8)."""
    if isinstance(b, str):
        return b
    return b.decode("utf-8", "backslashreplace")


def raw(b):
    """A proto2 `string` field holding raw bytes comes back as bytes."""
    return b if isinstance(b, bytes) else b.encode("utf-8", "surrogateescape")


def opt(msg, name):
    return getattr(msg, name) if msg.HasField(name) else None


def enum_name(enum_type, value):
    v = enum_type.values_by_number.get(value)
    return v.name if v is not None else value


def mapping_path(components):
    path = "/" + "/".join(components)
    return path[1:] if path.startswith("//") else path


class Tables(object):
    """Interned tables of one generation of one sequence."""

    KINDS = ("function_names", "frames", "callstacks", "build_ids", "mapping_paths", "source_paths", "mappings")

    def __init__(self):
        for k in self.KINDS:
            setattr(self, k, {})

    def add(self, interned):
        for k in self.KINDS:
            table = getattr(self, k)
            for entry in getattr(interned, k):
                table[entry.iid] = entry


class Checker(object):
    def __init__(self, brief):
        self.brief = brief
        self.warnings = []
        self.sequences = {}  # seq id -> {"generations": [Tables], ...}
        self.module_symbols = {}  # (path, raw build id) -> {address: [function names]}
        self.deferred = []  # closures run once every interned table is known

    def warn(self, msg):
        if msg not in self.warnings:
            self.warnings.append(msg)

    def seq_state(self, seq):
        if seq not in self.sequences:
            self.sequences[seq] = {
                "generations": [Tables()],
                "packets": 0,
                "cleared": 0,
                "profile_index": None,
            }
        return self.sequences[seq]

    def resolve_frames(self, tables, where, callstack_id):
        """Callstack -> list of frame dicts (bottom frame first)."""
        if not callstack_id:
            return []
        cs = tables.callstacks.get(callstack_id)
        if cs is None:
            self.warn("%s: callstack %d not interned" % (where, callstack_id))
            return None
        frames = []
        for fid in cs.frame_ids:
            fr = tables.frames.get(fid)
            if fr is None:
                self.warn("%s: frame %d of callstack %d not interned" % (where, fid, callstack_id))
                frames.append({"frame_id": fid})
                continue
            out = {"frame_id": fid, "rel_pc": fr.rel_pc, "function": None, "mapping": None, "build_id": None}
            if fr.function_name_id:
                s = tables.function_names.get(fr.function_name_id)
                if s is None:
                    self.warn("%s: function name %d of frame %d not interned" % (where, fr.function_name_id, fid))
                else:
                    out["function"] = text(s.str)
            build_id = b""
            if fr.mapping_id:
                m = tables.mappings.get(fr.mapping_id)
                if m is None:
                    self.warn("%s: mapping %d of frame %d not interned" % (where, fr.mapping_id, fid))
                else:
                    comps = []
                    for sid in m.path_string_ids:
                        s = tables.mapping_paths.get(sid)
                        if s is None:
                            self.warn("%s: mapping path %d of mapping %d not interned" % (where, sid, m.iid))
                        else:
                            comps.append(text(s.str))
                    out["mapping"] = mapping_path(comps)
                    if m.build_id:
                        s = tables.build_ids.get(m.build_id)
                        if s is None:
                            self.warn("%s: build id %d of mapping %d not interned" % (where, m.build_id, m.iid))
                        else:
                            build_id = s.str
                    out["build_id"] = build_id.hex()
            kind = fr.WhichOneof("kind_field")
            if kind == "kind":
                out["kind"] = enum_name(pb.Frame.Kind.DESCRIPTOR, fr.kind)
            elif kind == "kind_str":
                out["kind"] = fr.kind_str
            syms = self.module_symbols.get((out["mapping"], build_id), {}).get(fr.rel_pc)
            if syms is not None:
                out["symbols"] = syms
            frames.append(out)
        return frames

    def run(self, trace):
        s = {
            "packet_fields": {},
            "sequences": {},
            "timestamp_clock_ids": set(),
            "clock_snapshots": [],
            "processes": [],
            "threads": [],
            "process_stats": [],
            "interned": dict((k, 0) for k in Tables.KINDS),
            "profile_packets": [],
            "heap_dumps": [],
            "heap_samples": [],
            "perf_samples": [],
            "module_symbols": [],
        }
        coarse_related = False
        for i, pkt in enumerate(trace.packet):
            for field, _ in pkt.ListFields():
                s["packet_fields"][field.name] = s["packet_fields"].get(field.name, 0) + 1
            seq = pkt.trusted_packet_sequence_id if pkt.HasField("trusted_packet_sequence_id") else 0
            st = self.seq_state(seq)
            st["packets"] += 1
            cleared = bool(pkt.sequence_flags & SEQ_INCREMENTAL_STATE_CLEARED) or pkt.incremental_state_cleared
            if cleared:
                if seq == 0:
                    self.warn("packet[%d]: incremental state cleared without trusted_packet_sequence_id" % i)
                st["cleared"] += 1
                st["generations"].append(Tables())
            elif pkt.sequence_flags & SEQ_NEEDS_INCREMENTAL_STATE and st["cleared"] == 0:
                self.warn("packet[%d]: needs incremental state but sequence %d was never cleared" % (i, seq))
            tables = st["generations"][-1]
            if pkt.HasField("timestamp_clock_id"):
                s["timestamp_clock_ids"].add(pkt.timestamp_clock_id)
            if pkt.HasField("trace_packet_defaults") and pkt.trace_packet_defaults.HasField("timestamp_clock_id"):
                s["timestamp_clock_ids"].add(pkt.trace_packet_defaults.timestamp_clock_id)
            if pkt.HasField("interned_data"):
                tables.add(pkt.interned_data)
                for k in Tables.KINDS:
                    s["interned"][k] += len(getattr(pkt.interned_data, k))
            ts = opt(pkt, "timestamp")
            data = pkt.WhichOneof("data")
            if data == "clock_snapshot":
                cs = pkt.clock_snapshot
                clocks = dict((str(c.clock_id), c.timestamp) for c in cs.clocks)
                trace_clock = cs.primary_trace_clock if cs.HasField("primary_trace_clock") else CLOCK_BOOTTIME
                if str(CLOCK_MONOTONIC_COARSE) in clocks and str(trace_clock) in clocks:
                    coarse_related = True
                s["clock_snapshots"].append(
                    {"packet": i, "timestamp": ts, "primary_trace_clock": opt(cs, "primary_trace_clock"), "clocks": clocks}
                )
            elif data == "process_tree":
                for p in pkt.process_tree.processes:
                    s["processes"].append(
                        {"pid": p.pid, "ppid": opt(p, "ppid"), "cmdline": list(p.cmdline), "uid": opt(p, "uid")}
                    )
                for t in pkt.process_tree.threads:
                    s["threads"].append({"tid": t.tid, "tgid": opt(t, "tgid"), "name": opt(t, "name")})
            elif data == "process_stats":
                # Memory counters: trace processor makes counter tracks of
                # them, and their times bound the trace's time range.
                s["process_stats"].append(
                    {"packet": i, "timestamp": ts, "pids": [p.pid for p in pkt.process_stats.processes]}
                )
            elif data == "profile_packet":
                self.profile_packet(s, i, seq, st, tables, ts, pkt.profile_packet)
            elif data == "perf_sample":
                self.perf_sample(s, i, seq, tables, ts, pkt.perf_sample)
            elif data == "module_symbols":
                ms = pkt.module_symbols
                by_addr = self.module_symbols.setdefault((ms.path, raw(ms.build_id)), {})
                syms = []
                for a in ms.address_symbols:
                    lines = [
                        {"function": l.function_name, "file": opt(l, "source_file_name"), "line": opt(l, "line_number")}
                        for l in a.lines
                    ]
                    by_addr[a.address] = [l["function"] for l in lines]
                    syms.append({"address": a.address, "lines": lines})
                entry = {"path": ms.path, "build_id": raw(ms.build_id).hex(), "addresses": len(syms)}
                if not self.brief:
                    entry["symbols"] = syms
                s["module_symbols"].append(entry)
        for fn in self.deferred:
            fn()
        if s["heap_dumps"] and not coarse_related:
            self.warn(
                "heap dumps present but no ClockSnapshot relates MONOTONIC_COARSE (4) to the trace clock: "
                "trace processor drops them"
            )
        for seq, st in sorted(self.sequences.items()):
            s["sequences"][str(seq)] = {
                "packets": st["packets"],
                "incremental_state_cleared": st["cleared"],
                "profile_packets": 0 if st["profile_index"] is None else st["profile_index"] + 1,
            }
        s["timestamp_clock_ids"] = sorted(s["timestamp_clock_ids"])
        return s

    def profile_packet(self, s, i, seq, st, tables, ts, pp):
        expected = 0 if st["profile_index"] is None else st["profile_index"] + 1
        if pp.index != expected:
            self.warn("packet[%d]: ProfilePacket.index %d, expected %d on sequence %d" % (i, pp.index, expected, seq))
        st["profile_index"] = pp.index
        if pp.strings or pp.frames or pp.callstacks or pp.mappings:
            self.warn("packet[%d]: legacy ProfilePacket interning tables are not resolved by this script" % i)
        s["profile_packets"].append(
            {"packet": i, "seq": seq, "index": pp.index, "continued": pp.continued, "process_dumps": len(pp.process_dumps)}
        )
        for d in pp.process_dumps:
            dump = {
                "packet": i,
                "seq": seq,
                "packet_timestamp": ts,
                "pid": d.pid,
                "heap_name": opt(d, "heap_name"),
                "timestamp": opt(d, "timestamp"),
                "start_timestamp": opt(d, "start_timestamp"),
                "sampling_interval_bytes": opt(d, "sampling_interval_bytes"),
                "orig_sampling_interval_bytes": opt(d, "orig_sampling_interval_bytes"),
                "client_error": enum_name(pb.ProfilePacket.ProcessHeapSamples.ClientError.DESCRIPTOR, d.client_error),
                "num_samples": len(d.samples),
            }
            for flag in (
                "from_startup",
                "rejected_concurrent",
                "disconnected",
                "buffer_overran",
                "buffer_corrupted",
                "hit_guardrail",
            ):
                dump[flag] = getattr(d, flag)
            for total in ("self_allocated", "self_freed", "alloc_count", "free_count", "self_max", "self_max_count"):
                dump[total] = sum(getattr(x, total) for x in d.samples)
            if d.HasField("stats"):
                st_ = d.stats
                dump["stats"] = {
                    "unwinding_errors": st_.unwinding_errors,
                    "heap_samples": st_.heap_samples,
                    "map_reparses": st_.map_reparses,
                    "total_unwinding_time_us": st_.total_unwinding_time_us,
                    "client_spinlock_blocked_us": st_.client_spinlock_blocked_us,
                    "unwinding_time_us": [
                        {"upper_limit": b.upper_limit, "max_bucket": b.max_bucket, "count": b.count}
                        for b in st_.unwinding_time_us.buckets
                    ],
                }
            dump_idx = len(s["heap_dumps"])
            s["heap_dumps"].append(dump)
            for x in d.samples:
                sample = {
                    "dump": dump_idx,
                    "pid": d.pid,
                    "heap_name": opt(d, "heap_name"),
                    "callstack_id": x.callstack_id,
                    "self_allocated": x.self_allocated,
                    "self_freed": x.self_freed,
                    "alloc_count": x.alloc_count,
                    "free_count": x.free_count,
                }
                for o in ("self_max", "self_max_count", "timestamp"):
                    if x.HasField(o):
                        sample[o] = getattr(x, o)
                where = "packet[%d] heap sample of callstack %d" % (i, x.callstack_id)
                self.defer_frames(sample, tables, where, x.callstack_id)
                if not self.brief:
                    s["heap_samples"].append(sample)

    def perf_sample(self, s, i, seq, tables, ts, ps):
        sample = {
            "packet": i,
            "seq": seq,
            "timestamp": ts,
            "cpu": ps.cpu,
            "pid": ps.pid,
            "tid": ps.tid,
            "callstack_iid": ps.callstack_iid,
            "cpu_mode": enum_name(pb.Profiling.CpuMode.DESCRIPTOR, ps.cpu_mode),
            "timebase_count": opt(ps, "timebase_count"),
            "unwind_error": (
                enum_name(pb.Profiling.StackUnwindError.DESCRIPTOR, ps.unwind_error)
                if ps.HasField("unwind_error")
                else None
            ),
            "sample_skipped_reason": (
                enum_name(pb.PerfSample.SampleSkipReason.DESCRIPTOR, ps.sample_skipped_reason)
                if ps.HasField("sample_skipped_reason")
                else None
            ),
            "kernel_records_lost": opt(ps, "kernel_records_lost"),
        }
        self.defer_frames(sample, tables, "packet[%d] perf sample" % i, ps.callstack_iid)
        if not self.brief:
            s["perf_samples"].append(sample)

    def defer_frames(self, sample, tables, where, callstack_id):
        # Interned data may follow the packet that references it (heapprofd
        # writes a dump's callstacks after its samples): resolve at the end.
        def fn():
            sample["frames"] = self.resolve_frames(tables, where, callstack_id)

        self.deferred.append(fn)


def check_trace(path, brief):
    with open(path, "rb") as f:
        data = f.read()
    result = {
        "ok": False,
        "trace": path,
        "bytes": len(data),
        "protobuf_version": google.protobuf.__version__,
        "unknown_field_api": UNKNOWN_API_NAME,
        "packet_count": None,
        "unknown_fields": [],
        "warnings": [],
        "error": None,
    }
    trace = pb.Trace()
    try:
        trace.ParseFromString(data)
    except DecodeError as e:
        result["error"] = "parse failure: %s" % e
        return result
    except UnicodeDecodeError as e:
        # Only the pure-Python protobuf validates UTF-8 in proto2 `string`
        # fields; Perfetto (and upb) accept raw bytes there, e.g. in
        # ModuleSymbols.build_id.
        result["error"] = "parse failure: %s (pure-Python protobuf; use the default upb implementation)" % e
        return result
    result["packet_count"] = len(trace.packet)
    walk_unknown(trace, "", result["unknown_fields"])
    try:
        ext_count, ext_size = extension_bytes(data)
    except IndexError:
        ext_count, ext_size = 0, 0
    result["extensions"] = {"heapprofd_rs": ext_count}
    # Backstop independent of the walker: dropping every unknown field must
    # change the size by the extensions' bytes only.
    stripped = pb.Trace()
    stripped.CopyFrom(trace)
    stripped.DiscardUnknownFields()
    if stripped.ByteSize() + ext_size != trace.ByteSize() and not result["unknown_fields"]:
        result["error"] = "unknown fields present (%d bytes) but not located" % (
            trace.ByteSize() - stripped.ByteSize() - ext_size
        )
    checker = Checker(brief)
    result["summary"] = checker.run(trace)
    result["warnings"] = checker.warnings
    result["ok"] = result["error"] is None and not result["unknown_fields"]
    return result


# ---------------------------------------------------------------------------
# Schema comparison
# ---------------------------------------------------------------------------

# (message, field) -> (our type, official type): differences we accept.
ALLOWED_DEVIATIONS = {
    # Raw build-id bytes in a `string` field upstream; `bytes` has the same
    # wire encoding and lets prost carry non-UTF-8 data.
    ("perfetto.protos.ModuleSymbols", "build_id"): ("TYPE_BYTES", "TYPE_STRING"),
}

FDP = descriptor_pb2.FieldDescriptorProto
TYPE_NAMES = dict((v, k) for k, v in FDP.Type.items())


def official_reserved(desc):
    proto = descriptor_pb2.DescriptorProto()
    desc.CopyToProto(proto)
    return set(n for r in proto.reserved_range for n in range(r.start, r.end)), set(proto.reserved_name)


def official_enum_reserved(desc):
    proto = descriptor_pb2.EnumDescriptorProto()
    desc.CopyToProto(proto)
    # Enum reserved ranges are inclusive.
    return set(n for r in proto.reserved_range for n in range(r.start, r.end + 1))


def compare_enum(ours, full, pool, res):
    res["enums_checked"] += 1
    try:
        off = pool.FindEnumTypeByName(full)
    except KeyError:
        res["mismatches"].append("enum %s: not in the official schema" % full)
        return
    for v in ours.value:
        ov = off.values_by_name.get(v.name)
        if ov is None:
            res["mismatches"].append("enum %s: value %s not in the official enum" % (full, v.name))
        elif ov.number != v.number:
            res["mismatches"].append("enum %s: %s = %d, official %d" % (full, v.name, v.number, ov.number))
    ours_reserved = set(n for r in ours.reserved_range for n in range(r.start, r.end + 1))
    missing = ours_reserved - official_enum_reserved(off)
    if missing:
        res["mismatches"].append("enum %s: reserved %s not reserved upstream" % (full, sorted(missing)))


def compare_message(ours, full, pool, syntax, res):
    res["messages_checked"] += 1
    try:
        off = pool.FindMessageTypeByName(full)
    except KeyError:
        res["mismatches"].append("message %s: not in the official schema" % full)
        return
    for f in ours.field:
        res["fields_checked"] += 1
        where = "%s.%s" % (full, f.name)
        of = off.fields_by_number.get(f.number)
        if of is None:
            res["mismatches"].append("%s = %d: no field with this number upstream" % (where, f.number))
            continue
        if of.name != f.name:
            res["mismatches"].append("%s = %d: named %s upstream" % (where, f.number, of.name))
        ours_type, off_type = TYPE_NAMES[f.type], TYPE_NAMES[of.type]
        if ours_type != off_type:
            allowed = ALLOWED_DEVIATIONS.get((full, f.name))
            if allowed == (ours_type, off_type):
                res["allowed_deviations"].append("%s: %s here, %s upstream" % (where, ours_type, off_type))
            else:
                res["mismatches"].append("%s: type %s, official %s" % (where, ours_type, off_type))
        ours_label = {FDP.LABEL_REPEATED: "repeated", FDP.LABEL_REQUIRED: "required"}.get(f.label, "optional")
        off_label = "repeated" if of.is_repeated else ("required" if of.is_required else "optional")
        if ours_label != off_label:
            res["mismatches"].append("%s: %s, official %s" % (where, ours_label, off_label))
        if f.type in (FDP.TYPE_MESSAGE, FDP.TYPE_ENUM):
            ours_tn = f.type_name.lstrip(".")
            off_t = of.message_type if of.message_type is not None else of.enum_type
            if off_t is None or off_t.full_name != ours_tn:
                res["mismatches"].append(
                    "%s: type %s, official %s" % (where, ours_tn, off_t.full_name if off_t else None)
                )
        ours_oneof = ours.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None
        off_oneof = of.containing_oneof.name if of.containing_oneof is not None else None
        if ours_oneof != off_oneof:
            res["mismatches"].append("%s: oneof %s, official %s" % (where, ours_oneof, off_oneof))
        if f.label == FDP.LABEL_REPEATED:
            ours_packed = f.options.packed if f.options.HasField("packed") else syntax == "proto3"
            if ours_packed != of.is_packed:
                res["mismatches"].append("%s: packed=%s, official %s" % (where, ours_packed, of.is_packed))
        if f.HasField("default_value") != of.has_default_value:
            res["mismatches"].append("%s: explicit default differs" % where)
    numbers, names = official_reserved(off)
    for r in ours.reserved_range:
        for n in range(r.start, r.end):
            if n not in numbers:
                res["mismatches"].append("%s: reserved %d not reserved upstream" % (full, n))
    for n in ours.reserved_name:
        if n not in names:
            res["mismatches"].append("%s: reserved name %s not reserved upstream" % (full, n))
    for e in ours.enum_type:
        compare_enum(e, "%s.%s" % (full, e.name), pool, res)
    for m in ours.nested_type:
        compare_message(m, "%s.%s" % (full, m.name), pool, syntax, res)


def check_schema(path):
    with open(path, "rb") as f:
        data = f.read()
    pool = pb.DESCRIPTOR.pool
    res = {
        "ok": False,
        "schema": path,
        "protobuf_version": google.protobuf.__version__,
        "files": [],
        "messages_checked": 0,
        "fields_checked": 0,
        "enums_checked": 0,
        "mismatches": [],
        "allowed_deviations": [],
        "error": None,
    }
    try:
        fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    except DecodeError as e:
        res["error"] = "parse failure: %s" % e
        return res
    for fd in fds.file:
        res["files"].append(fd.name)
        syntax = fd.syntax or "proto2"
        if syntax != "proto2":
            res["mismatches"].append("%s: syntax %s, official proto2" % (fd.name, syntax))
        if fd.package != "perfetto.protos":
            res["mismatches"].append("%s: package %s, official perfetto.protos" % (fd.name, fd.package))
        for e in fd.enum_type:
            compare_enum(e, "%s.%s" % (fd.package, e.name), pool, res)
        for m in fd.message_type:
            compare_message(m, "%s.%s" % (fd.package, m.name), pool, syntax, res)
    if res["fields_checked"] == 0:
        res["error"] = "no fields to compare"
    res["ok"] = not res["mismatches"] and res["error"] is None
    return res


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", help="trace file to check")
    ap.add_argument("--schema", metavar="FDS", help="compare an encoded FileDescriptorSet instead")
    ap.add_argument("--strict", action="store_true", help="fail on warnings too")
    ap.add_argument("--brief", action="store_true", help="leave per-sample details out of the summary")
    args = ap.parse_args(argv)
    if (args.trace is None) == (args.schema is None):
        ap.error("give exactly one of TRACE or --schema FDS")
    try:
        if args.schema is not None:
            res = check_schema(args.schema)
        else:
            res = check_trace(args.trace, args.brief)
            if args.strict and res["warnings"]:
                res["ok"] = False
    except (IOError, OSError) as e:
        sys.stderr.write("check_trace.py: %s\n" % e)
        return 2
    json.dump(res, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
