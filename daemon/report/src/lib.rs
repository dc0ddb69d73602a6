//! `heapprofd-rs report` and `heapprofd-rs convert`: offline tools on a
//! trace file (ours or heapprofd's), built on the model's
//! [`read_trace`](heapprofd_model::trace::read_trace). Depends on the
//! model only (no runtime, no unwinder).
//!
//! * [`run_report`]: totals and top allocation sites per process and heap,
//!   as text (heaptrack_print style) or JSON ([`summary`]).
//! * [`convert`]: pprof (`.pb.gz`, [`pprof`]), folded stacks and flame
//!   graph SVG ([`folded`]).
//!
//! The `*Args` structs ([`args`]) derive [`clap::Args`] for the binary's
//! command line.

pub mod args;
pub mod filter;
pub mod folded;
pub mod pprof;
pub mod run;
pub mod summary;
pub mod units;

pub use args::{ConvertArgs, Format, ReportArgs};
pub use filter::Filter;
pub use folded::{ValueKind, folded_lines, write_flamegraph};
pub use pprof::{to_pprof, write_pprof_gz};
pub use run::{convert, load_trace, report_to, run_report};
pub use summary::{Report, build_report, write_text};
pub use units::human_bytes;
