//! Client/daemon wire format: fixed, explicit little-endian layouts.
//!
//! Two kinds of messages cross the process boundary:
//!
//! * **Socket messages**, exchanged once per session over the UNIX socket:
//!   [`Handshake`] (client -> daemon, together with the client's
//!   `/proc/self/maps` and `/proc/self/mem` descriptors) and [`ClientConfig`]
//!   (daemon -> client, together with the ring-buffer memfd).
//! * **Ring-buffer records**, written by the client into the shared-memory
//!   ring buffer: [`MallocHeader`] followed by raw stack bytes, [`FreeRecord`]
//!   [`HeapNameRecord`] and [`ContextRecord`]. Every record starts with a `u32` [`RecordKind`]
//!   and a `u32` of flags.
//!
//! Every layout is pinned: each type has an `ENCODED_LEN` constant checked at
//! compile time against the field list, encoding writes every byte (padding
//! included) so nothing uninitialised ever reaches shared memory, and decoding
//! returns a typed [`DecodeError`] for every malformed input instead of
//! panicking. The daemon decodes bytes the client (or anything else that got
//! hold of the memfd) wrote, so decoding must treat its input as hostile.
//!
//! Layouts are little-endian on every architecture. All 64-bit fields sit at
//! 8-byte offsets so a 32-bit client would produce the same bytes.
//!
//! One concept per file: `codec` (the byte reader/writer, name fields and
//! [`DecodeError`]), `arch` ([`Arch`] and the [`RegisterFile`]),
//! `handshake` and `client_config` (the socket messages), `kind` (the
//! records' [`RecordKind`] tag), `record` (the ring-buffer records and
//! [`Record`]), `stack_sample` (stacks taken from signal handlers and the
//! names of their tags), `context` (the user context
//! definition record and its pair encoding), `context_filter` (the
//! configuration's context filters and their matching rule). This module holds the constants the
//! whole protocol shares and re-exports every item, so `wire::X` is the one
//! path to each.

mod arch;
mod client_config;
mod codec;
mod context;
mod context_filter;
mod handshake;
mod kind;
mod record;
mod stack_sample;

pub use arch::{Arch, MAX_REGS, RegisterFile, UNWIND_REGS, aarch64, x86_64};
pub use client_config::{ClientConfig, ForkPolicy, HeapConfig, PerfEvent};
pub use codec::{DecodeError, HEAP_NAME_LEN, heap_name_field, heap_name_str};
pub use context::{
    CONTEXT_HEADER_LEN, CONTEXT_NONE, ContextRecord, MAX_CONTEXT_BYTES, MAX_CONTEXT_PAIRS,
    MAX_CONTEXT_STR, PairIter, encode_context_pair,
};
pub use context_filter::{
    CONTEXT_FILTER_LEN, ContextFilter, FilterKind, MAX_CONTEXT_FILTERS, MAX_FILTER_KEY,
    context_matches,
};
pub use handshake::{Handshake, Unprofilable};
pub use kind::RecordKind;
pub use record::{
    CapturedRegs, FreeRecord, HeapNameRecord, MallocHeader, Record, STACK_REUSE_WINDOW, UnwindRegs,
};
pub use stack_sample::{EventNameRecord, StackSampleHeader, TAG_CPU_TIME};

/// `b"HPRS"` read as a little-endian `u32`; first field of the socket messages.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HPRS");

/// Protocol versions. Bump [`version::CURRENT`] on any layout change; the
/// daemon refuses clients whose version it does not speak.
pub mod version {
    /// The first protocol version.
    pub const V1: u32 = 1;
    /// `Handshake::unprofilable`: a client says its process runs
    /// unprofiled, and why.
    pub const V2: u32 = 2;
    /// [`ClientConfig`] holds 64 heaps (was 16) and
    /// `ClientConfig::FLAG_ALL_HEAPS`; custom heaps (ids from 1) declared
    /// with [`HeapNameRecord`]s.
    pub const V3: u32 = 3;
    /// User contexts: [`ContextRecord`](super::ContextRecord)s in the ring and
    /// `MallocHeader::context_id` on every sample.
    pub const V4: u32 = 4;
    /// Stack samples taken from signal handlers (CPU time, requested
    /// stacks): [`StackSampleHeader`](super::StackSampleHeader) and
    /// [`EventNameRecord`](super::EventNameRecord) in the ring,
    /// `ClientConfig::cpu_period_ns`, `perf_event` and `perf_period`.
    pub const V5: u32 = 5;
    /// Stack reuse: `MallocHeader::stack_reused` (was padding) and
    /// `MallocHeader::FLAG_STACK_BASE`, `ClientConfig::FLAG_STACK_REUSE`,
    /// and the ring's stack resync counter.
    pub const V6: u32 = 6;
    /// The daemon numbers the mallocs and frees of a session itself, in
    /// ring order (the order their room was reserved in, which follows
    /// the program's: a free is written before its block is freed, a
    /// malloc before its block is returned); the client writes
    /// `MallocHeader::sequence` and `FreeRecord::sequence` as 0. A shared
    /// counter in the client was a cache line every record of every
    /// thread moved between cores.
    pub const V7: u32 = 7;
    /// A malloc record carries only the registers an unwinder starts from
    /// (`Arch::unwind_slots`, [`UNWIND_REGS`](super::UNWIND_REGS) slots), not
    /// all 34 slots of a `RegisterFile`: its fixed part is 200 bytes, was
    /// 360 (all but 8 or 14 of the slots were zeros).
    pub const V8: u32 = 8;
    /// The version this build speaks.
    pub const CURRENT: u32 = V8;
}

/// Number of heap slots in [`ClientConfig`] (as Perfetto's client
/// configuration).
pub const MAX_HEAPS: usize = 64;
/// Custom heaps one process may register (ids `1..=MAX_CUSTOM_HEAPS`),
/// besides [`HEAP_LIBC_MALLOC`].
pub const MAX_CUSTOM_HEAPS: u32 = 256;
/// Longest custom heap name in bytes: the name field is
/// [`HEAP_NAME_LEN`] bytes and the C API's names are NUL-terminated
/// within it, as Perfetto's `HEAPPROFD_HEAP_NAME_SZ`.
pub const MAX_CUSTOM_HEAP_NAME: usize = HEAP_NAME_LEN - 1;
/// Heap id of the glibc malloc family.
pub const HEAP_LIBC_MALLOC: u32 = 0;
/// Name of heap [`HEAP_LIBC_MALLOC`], as heapprofd and the Perfetto UI call it.
pub const HEAP_LIBC_MALLOC_NAME: &str = "libc.malloc";
