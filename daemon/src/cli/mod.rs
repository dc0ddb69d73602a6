//! Placeholder for `cli` (in progress).
