//! Placeholder for `profile` (in progress).
