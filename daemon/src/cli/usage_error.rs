//! The error of a bad argument found after parsing.

/// A bad argument found after parsing (an output path that cannot be
/// created...): `heapprofd-rs` exits with 2, like clap's usage errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);
