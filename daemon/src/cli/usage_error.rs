//! The error of a bad argument found after parsing: the report crate's
//! [`UsageError`](heapprofd_report::UsageError), shared so that `record`
//! and `convert` give the same exit code (2) for the same mistake (an
//! output path that cannot be created...).

pub use heapprofd_report::UsageError;
