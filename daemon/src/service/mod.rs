//! The profiling service: `heapprofd-rs daemon`, the profiles it runs at
//! once, the control socket the command line talks to, the startup-trigger
//! store, and finding the running processes a profile wants; who may ask
//! for what ([`access`]); `heaps` is which heaps a profile samples and
//! `contexts` in which user contexts (both shared with `record -- CMD`).

pub mod access;
pub mod contexts;
pub mod control;
pub mod heaps;
pub mod running;
pub mod spec;
