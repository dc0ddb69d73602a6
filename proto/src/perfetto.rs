//! Perfetto trace messages (placeholder until the protos land).
