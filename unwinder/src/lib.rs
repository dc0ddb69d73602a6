//! Remote unwinding and symbolization for heapprofd-rs.
//!
//! The client library copies the registers and the raw stack (from the stack
//! pointer up to the thread's stack end) of each sampled allocation into
//! shared memory. This crate turns such a copy into a call stack with names,
//! without running anything inside the profiled process: DWARF CFI unwinding
//! with [framehop](https://docs.rs/framehop) over the copied bytes, and
//! symbolization with `addr2line` and the ELF symbol tables.
//!
//! # Use it as follows
//!
//! 1. Create one [`ModuleCache`] for the daemon and share it (`Arc`) between
//!    threads and processes. It holds the parsed unwind tables of the ELF
//!    files seen, keyed by build id (or device + inode + size + mtime), and
//!    builds symbol tables and DWARF contexts lazily. Modules no process
//!    maps any more are evicted beyond a [`CacheBudget`].
//! 2. For each client, create a [`ProcessContext`] from its pid, a
//!    [`MapsSource`] and a [`ProcessMemory`]. In production these are
//!    [`FdMaps`] and [`FdMemory`] over the client's `/proc/self/maps` and
//!    `/proc/self/mem` descriptors. The maps are parsed at creation, so
//!    samples of a process that has exited still unwind.
//! 3. For each sample, call [`ProcessContext::unwind`] with the registers,
//!    the stack copy and the client library's text range (frames there are
//!    dropped). The result lists [`Frame`]s leaf first; each carries its
//!    absolute pc, its lookup address, its `rel_pc` (ELF virtual address, as
//!    Perfetto's `Frame.rel_pc` and offline symbolizers expect) and an
//!    `Arc<`[`Mapping`]`>` with what a Perfetto `Mapping` needs (path, build
//!    id, start/end/offset, load bias).
//!    A profiler that sees the same stacks again and again uses the hot-path
//!    pair instead: [`ProcessContext::unwind_raw`] walks into a reused
//!    [`RawUnwind`] (absolute pcs, client frames dropped, the walk's error;
//!    no mapping lookup, no `Arc` clone, no allocation), and
//!    [`ProcessContext::resolve_pc`] gives a pc's mapping and `rel_pc` only
//!    for the pcs the caller has not cached. A pc in no known mapping is the
//!    caller's cue for [`ProcessContext::refresh_maps_for`] (rate-limited
//!    re-read of the maps; `true` means the mappings changed: forget cached
//!    pcs and unwind the sample again); a pc still unmapped cuts the stack
//!    with [`UnwindErrorKind::InvalidMap`]. `unwind` is exactly this, with a
//!    [`Frame`] built per pc. To skip even the walk for samples that repeat
//!    one, [`ProcessContext::unwind_raw_traced`] also fills a [`WalkTrace`]:
//!    the walk's inputs and the stack words whose values matter (the sample
//!    comes as a [`StackSample`]); a later
//!    sample for which [`walk_inputs`] and [`stack_matches`] agree with it
//!    walks identically (for the same mappings), see the `replay` module.
//! 4. To name a frame call [`ProcessContext::symbolize_frame`] (or
//!    [`Module::symbolize`] with a `rel_pc`). It returns the inline chain,
//!    innermost first, as a shared `Arc<[`[`SymbolFrame`]`]>`. Answers are cached per module
//!    and address, so a frame seen before costs one hash lookup. With
//!    [`SymbolizeOptions::enabled`] false nothing is symbolized, and the
//!    trace carries build id + rel_pc for offline symbolization.
//!
//! ```no_run
//! use std::sync::Arc;
//! use heapprofd_unwinder::{FdMaps, FdMemory, ModuleCache, ProcessContext};
//! use heapprofd_proto::wire::{Arch, RegisterFile};
//!
//! let cache = Arc::new(ModuleCache::default());
//! let pid = 1234;
//! let mut process = ProcessContext::new(
//!     pid,
//!     Box::new(FdMaps::open_pid(pid)?),
//!     Box::new(FdMemory::open_pid(pid)?),
//!     cache,
//! );
//! # let (regs, sp, stack, client_text) = (RegisterFile::default(), 0u64, Vec::<u8>::new(), 0..0);
//! let result = process.unwind(Arch::X86_64, &regs, sp, &stack, client_text);
//! for frame in &result.frames {
//!     for f in process.symbolize_frame(frame).iter() {
//!         println!("{:#x} {:?} {:?}:{:?}", frame.pc, f.function, f.file, f.line);
//!     }
//! }
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Unwinding rules
//!
//! * x86_64 and AArch64 (both compiled in; the sample's [`Arch`] chooses).
//!   Code with no CFI (JIT code, or a module whose file cannot be read) is
//!   unwound with the frame-pointer chain (framehop's fallback).
//! * The leaf is the user's call site: leading frames whose pc is in the
//!   client library's text range (the interposed `malloc` and the capture
//!   code) are dropped, so the first frame is the function that called
//!   `malloc`/`new`; libstdc++'s `operator new`, when it sits in between,
//!   stays. The first kept frame is then a return address, looked up at
//!   `pc - 1` like every caller frame.
//! * At most [`ProcessOptions::max_frames`] (512) frames are walked, client
//!   frames included.
//! * A stack that ends early keeps its frames and ends with a synthetic
//!   frame whose `error` ([`Frame`]) is set; [`ProcessContext::symbolize_frame`]
//!   names it `ERROR <KIND>` ([`UnwindErrorKind::as_str`]). Errors are
//!   counted per process in [`ProcessStats`].
//! * The vDSO is parsed from the process's memory.
//!
//! # Symbolization rules
//!
//! Names come from DWARF (inline chain included) when there is a debug file
//! (`/usr/lib/debug/.build-id/xx/rest.debug`, `.gnu_debuglink` with CRC check,
//! or DWARF in the module itself; dwz files through `.gnu_debugaltlink`), and
//! otherwise, or for the outermost function when DWARF has no name, from
//! `.symtab`, `.dynsym` and `.gnu_debugdata` (MiniDebugInfo). Rust and C++
//! names are demangled. Code outside any file is named from
//! `/tmp/perf-PID.map`.
//!
//! # Tests
//!
//! `tests/integration_tests/gdb_compare.rs` runs programs from
//! `tests/programs/` (C at -O2 without frame pointers and at -O0, PIE and
//! non-PIE, stripped with a debuglink, MiniDebugInfo only, dwz, C++ with
//! inlining/exceptions/threads, Rust release, recursion over 100 frames)
//! under gdb, captures a sample at a breakpoint, kills the process, unwinds
//! the capture offline and requires gdb's `bt` frame names.
//!
//! # Performance
//!
//! See `docs/PERFORMANCE.md` ("Unwinder") for measured numbers and the
//! commands that produced them.

mod byte_cursor;
mod cache;
mod checkout;
mod debuginfo;
mod dwarf_units;
mod early;
mod elf;
mod eviction;
mod file_key;
mod frame;
mod kept_maps;
mod mapping;
mod maps;
mod memory;
mod pending;
mod perfmap;
mod process;
mod replay;
mod sparse;
mod stored_answers;
mod symbol_frame;
mod symbol_store;
mod symbols;
mod unwind;

pub use cache::{CacheStats, Module, ModuleCache};
pub use debuginfo::{build_id_path, hex as build_id_hex};
pub use elf::{ElfInfo, LoadSegment, compute_bias};
pub use eviction::CacheBudget;
pub use file_key::FileKey;
pub use frame::{Frame, RawUnwind, UnwindErrorKind, UnwindResult};
pub use kept_maps::{KeptMaps, LiveOrKept};
pub use mapping::Mapping;
pub use maps::{MapEntry, ParsedMaps, parse_maps};
pub use memory::{
    FdMaps, FdMemory, MapsSource, NoMemory, ProcessMemory, SnapshotMemory, StaticMaps,
};
pub use pending::PendingProcess;
pub use perfmap::PerfMap;
pub use process::{ProcessContext, ProcessOptions, ProcessStats};
pub use replay::{WalkTrace, stack_matches, walk_inputs};
pub use symbol_frame::SymbolFrame;
pub use symbol_store::SymbolStore;
#[doc(hidden)]
pub use symbol_store::fuzz_decode as fuzz_symbol_store_decode;
pub use symbols::{SymbolSources, SymbolizeOptions};
pub use unwind::StackSample;

pub use heapprofd_proto::wire::{Arch, RegisterFile};
