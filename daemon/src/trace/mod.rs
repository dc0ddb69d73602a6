//! Placeholder for `trace` (in progress).
