//! `heapprofd-rs report` and `heapprofd-rs convert`: offline tools on a
//! trace file (ours or heapprofd's), built on the model's
//! [`read_trace`](heapprofd_model::trace::read_trace). Depends on the
//! model only (no runtime, no unwinder).
//!
//! * [`run_report`]: totals and top sites per process and heap as text
//!   ([`text`], heaptrack_print style) or JSON ([`summary`]); `--diff`
//!   ([`diff`]), `--timeline` and `--peak` ([`timeline`]).
//! * [`convert`]: pprof (`.pb.gz`, [`pprof`]), folded stacks and flame
//!   graph SVG ([`folded`]), a self-contained HTML page ([`html`]), a plot
//!   of the heap over time ([`timeline_svg`]).
//! * Shared: which heaps ([`filter`]), which stacks and names
//!   ([`stackopts`], [`names`]), which frame a stack is charged to
//!   ([`plumbing`]), sites ([`sites`]), where outputs go ([`output`]),
//!   a status line while a long trace is read ([`progress`]).
//!
//! The `*Args` structs ([`args`]) derive [`clap::Args`] for the binary's
//! command line.

pub mod args;
pub mod by_context;
pub mod cpu;
pub mod diff;
pub mod filter;
pub mod folded;
pub mod html;
pub mod names;
pub mod output;
pub mod plumbing;
pub mod pprof;
pub mod pprof_cpu;
pub mod progress;
pub mod run;
pub mod sites;
pub mod stackopts;
pub mod summary;
pub mod text;
pub mod timeline;
pub mod timeline_png;
pub mod timeline_svg;
pub mod units;

pub use args::{ConvertArgs, Format, ReportArgs};
pub use filter::Filter;
pub use folded::{ValueKind, folded_lines, write_flamegraph};
pub use output::UsageError;
pub use pprof::{to_pprof, write_pprof_gz};
pub use run::{convert, load_trace, report_to, run_report};
pub use stackopts::StackOptions;
pub use summary::{Report, build_report};
pub use text::write_text;
pub use units::human_bytes;
