//! Placeholder for `report` (in progress).
