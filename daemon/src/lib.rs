//! The heapprofd-rs daemon at run time, and the command line of the
//! `heapprofd-rs` binary, as a library so tests, benchmarks and fuzzers can
//! drive each part.
//!
//! The profile model (bookkeeping, traces) is `heapprofd-model`, the
//! offline reports `heapprofd-report`, the injection of `record --pid`
//! `heapprofd-inject`; this crate is what runs them:
//!
//! * [`runtime`]: the daemon: the listening socket and handshakes, the
//!   unwinding workers (their per-record step is [`runtime::session_unwinder`],
//!   callable without threads), the symbolizer, the bookkeeping thread (an
//!   adapter over the model's `Bookkeeping`), and `record` / `record --pid`.
//! * [`service`]: the profiling service (`heapprofd-rs daemon`): several
//!   profiles at once, the control socket, the startup-trigger store.
//! * [`config`]: Perfetto's `HeapprofdConfig` in text format (`--config`).
//! * [`install`]: `install` / `uninstall`, the client in every new process
//!   (`/etc/ld.so.preload`).
//! * [`offline_symbols`]: `symbolize`, symbols added to a trace afterwards
//!   (`ModuleSymbols`, binaries found by build id).
//! * [`adb`]: `android`, the adb host workflow (a device's processes
//!   profiled, results on the host).
//! * [`cli`]: the subcommands and their arguments (clap, units).
//! * [`env`](mod@env): the environment variables, read once.
//! * [`logger`]: the stderr logger behind the `log` facade.

pub mod adb;
pub mod cli;
pub mod config;
pub mod env;
pub mod install;
pub mod logger;
pub mod offline_symbols;
pub mod runtime;
pub mod service;
