//! The byte codec every layout uses: a bounds-checked little-endian writer
//! ([`Put`]) and reader ([`Get`]), the NUL-padded heap-name field, and
//! [`DecodeError`], the one error type of every `decode`.

use core::fmt;

use super::{MAX_HEAPS, version};

/// Longest heap name in bytes (including no terminator; names are padded with NUL).
pub const HEAP_NAME_LEN: usize = 64;

/// Error returned when bytes do not form a valid message.
///
/// `Copy` and allocation-free so the client can use it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the fixed layout needs.
    Truncated {
        /// Bytes the layout needs.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The first word is not [`MAGIC`](super::MAGIC).
    BadMagic(u32),
    /// The peer speaks a protocol version we do not.
    UnsupportedVersion(u32),
    /// The record kind is not one of [`RecordKind`](super::RecordKind).
    UnknownKind(u32),
    /// The record kind is valid but not the one the caller asked for.
    WrongKind {
        /// Kind the caller expected.
        expected: u32,
        /// Kind found in the bytes.
        found: u32,
    },
    /// The architecture tag is not one of [`Arch`](super::Arch).
    UnknownArch(u32),
    /// The declared stack length disagrees with the bytes that follow.
    StackLength {
        /// Length declared in the header.
        declared: u64,
        /// Bytes actually present after the header.
        available: usize,
    },
    /// A heap name is not UTF-8 or has bytes after its NUL terminator.
    BadHeapName,
    /// More heaps declared than [`MAX_HEAPS`].
    TooManyHeaps(u32),
    /// A field has a value outside its documented range.
    InvalidField(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated { need, have } => {
                write!(f, "message truncated: need {need} bytes, have {have}")
            }
            Self::BadMagic(m) => write!(f, "bad magic {m:#010x} (not a heapprofd-rs peer)"),
            Self::UnsupportedVersion(v) => write!(
                f,
                "unsupported protocol version {v} (this build speaks {})",
                version::CURRENT
            ),
            Self::UnknownKind(k) => write!(f, "unknown record kind {k}"),
            Self::WrongKind { expected, found } => {
                write!(f, "expected record kind {expected}, found {found}")
            }
            Self::UnknownArch(a) => write!(f, "unknown architecture tag {a}"),
            Self::StackLength {
                declared,
                available,
            } => write!(
                f,
                "stack length {declared} does not match the {available} bytes present"
            ),
            Self::BadHeapName => write!(f, "heap name is not NUL-padded UTF-8"),
            Self::TooManyHeaps(n) => write!(f, "{n} heaps declared, at most {MAX_HEAPS} allowed"),
            Self::InvalidField(name) => write!(f, "field `{name}` out of range"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Bounds-checked little-endian writer over a byte slice.
///
/// Callers size the slice with the type's `ENCODED_LEN`, so the checks never
/// fail in practice; they exist so that a mistake is a short write, not UB.
pub(super) struct Put<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Put<'a> {
    /// A writer at the start of `buf`.
    #[inline(always)]
    pub(super) fn new(buf: &'a mut [u8]) -> Self {
        Put { buf, pos: 0 }
    }
    #[inline(always)]
    pub(super) fn bytes(&mut self, b: &[u8]) {
        if let Some(dst) = self.buf.get_mut(self.pos..self.pos + b.len()) {
            dst.copy_from_slice(b);
        }
        self.pos += b.len();
    }
    #[inline(always)]
    pub(super) fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    #[inline(always)]
    pub(super) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// Little-endian reader that has already checked the total length.
pub(super) struct Get<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Get<'a> {
    pub(super) fn new(buf: &'a [u8], need: usize) -> Result<Self, DecodeError> {
        if buf.len() < need {
            return Err(DecodeError::Truncated {
                need,
                have: buf.len(),
            });
        }
        Ok(Get { buf, pos: 0 })
    }
    pub(super) fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        // The constructor checked the length; a short read here would be a bug
        // in a layout constant, and yields zeros rather than a panic.
        if let Some(src) = self.buf.get(self.pos..self.pos + N) {
            out.copy_from_slice(src);
        }
        self.pos += N;
        out
    }
    pub(super) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }
    pub(super) fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }
}

pub(super) fn encode_name(p: &mut Put<'_>, name: &[u8; HEAP_NAME_LEN]) {
    p.bytes(name);
}

/// Turns a string into a NUL-padded name field; `None` if it is too long or has a NUL.
pub fn heap_name_field(name: &str) -> Option<[u8; HEAP_NAME_LEN]> {
    let b = name.as_bytes();
    if b.len() > HEAP_NAME_LEN || b.contains(&0) {
        return None;
    }
    let mut out = [0u8; HEAP_NAME_LEN];
    out[..b.len()].copy_from_slice(b);
    Some(out)
}

/// Validates a NUL-padded name field and returns it as a string.
pub fn heap_name_str(field: &[u8; HEAP_NAME_LEN]) -> Result<&str, DecodeError> {
    let len = field.iter().position(|&b| b == 0).unwrap_or(HEAP_NAME_LEN);
    if field[len..].iter().any(|&b| b != 0) {
        return Err(DecodeError::BadHeapName);
    }
    core::str::from_utf8(&field[..len]).map_err(|_| DecodeError::BadHeapName)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_names() {
        assert!(heap_name_field(&"x".repeat(65)).is_none());
        assert!(heap_name_field("a\0b").is_none());
        let mut f = heap_name_field("ok").unwrap();
        assert_eq!(heap_name_str(&f), Ok("ok"));
        f[10] = b'z';
        assert_eq!(heap_name_str(&f), Err(DecodeError::BadHeapName));
    }
}
