//! Placeholder for `runtime` (in progress).
