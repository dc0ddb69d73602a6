//! Round-trips traces written with our prost types through the OFFICIAL
//! Perfetto schema (the `perfetto` Python package, `pip install perfetto`).
//!
//! `tests/check_trace.py` parses a trace with the official `Trace` message,
//! reports every field the official schema does not know, at any depth, and
//! prints a JSON summary that these tests assert on. It also compares our
//! `FILE_DESCRIPTOR_SET` with the official descriptors field by field.
//!
//! Missing `python3` or `perfetto` fails the tests (no silent skip).
//!
//! * `script`: running check_trace.py, temp files, JSON helpers;
//! * `fixture`: a realistic trace (heap and perf sequences, interning,
//!   clock snapshot, process tree, module symbols);
//! * `schema`: our descriptors against the official ones;
//! * `trace`: traces (ours and hand-broken ones) through the official parser.

#![cfg(feature = "perfetto")]

mod fixture;
mod schema;
mod script;
mod trace;
