//! A reader over untrusted bytes (the symbol store's files): every read is
//! checked against the end, and a string against the longest one kept.

/// Longest name or path kept (a longer one is cut when written, refused
/// when read).
pub(crate) const MAX_STRING: usize = 1 << 16;

/// A reader over untrusted bytes from `pos` on: every read is checked.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    /// Where the next read starts.
    pub(crate) pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8], pos: usize) -> Self {
        Cursor { bytes, pos }
    }
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    /// A string's bytes, not checked to be UTF-8.
    pub(crate) fn raw_str(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > MAX_STRING {
            return None;
        }
        self.take(n)
    }
    pub(crate) fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.raw_str()?).ok()
    }
}
