//! [`RecordKind`]: the tag opening every ring-buffer record (shared by the
//! records of `record` and `context`).

use super::codec::DecodeError;

/// Kind tag at the start of every ring-buffer record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum RecordKind {
    /// `MallocHeader` + stack bytes.
    Malloc = 1,
    /// `FreeRecord`.
    Free = 2,
    /// `HeapNameRecord`.
    HeapName = 3,
    /// `ContextRecord` (Since [`version::V4`](super::version::V4)).
    Context = 4,
    /// `StackSampleHeader` + stack bytes (Since [`version::V5`](super::version::V5)).
    StackSample = 5,
    /// `EventNameRecord` (Since [`version::V5`](super::version::V5)).
    EventName = 6,
}

impl RecordKind {
    /// Decodes a kind tag.
    pub fn from_u32(v: u32) -> Result<RecordKind, DecodeError> {
        match v {
            1 => Ok(RecordKind::Malloc),
            2 => Ok(RecordKind::Free),
            3 => Ok(RecordKind::HeapName),
            4 => Ok(RecordKind::Context),
            5 => Ok(RecordKind::StackSample),
            6 => Ok(RecordKind::EventName),
            other => Err(DecodeError::UnknownKind(other)),
        }
    }
}
