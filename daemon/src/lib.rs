//! The heapprofd-rs daemon and command-line tool, as a library so tests and
//! benchmarks can drive each part without sockets.
//!
//! * [`profile`]: bookkeeping. Interned mappings/frames/strings, the callsite
//!   tree, live sampled allocations per process and heap, cumulative
//!   per-callsite totals. Pure data structures, no I/O.
//! * [`trace`]: writing (and reading back) Perfetto traces.
//! * [`report`]: `heapprofd-rs report` and `heapprofd-rs convert`
//!   (text/JSON summaries, pprof, folded stacks, flame graph SVG).
//! * [`runtime`]: the tokio daemon: sessions, ring-buffer draining,
//!   unwinding workers, dumps, and `heapprofd-rs record`.
//! * [`cli`]: argument parsing shared by the subcommands (units, errors).

pub mod cli;
pub mod runtime;
