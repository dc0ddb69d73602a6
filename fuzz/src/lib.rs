//! Helpers shared by the fuzz targets.

/// Splits fuzzer input into a fixed-size prefix (zero-padded) and the rest.
pub fn split_prefix<const N: usize>(data: &[u8]) -> ([u8; N], &[u8]) {
    let mut head = [0u8; N];
    let n = data.len().min(N);
    head[..n].copy_from_slice(&data[..n]);
    (head, &data[n..])
}

/// Reads numbers off the front of fuzzer input; exhausted input reads as
/// zeros (so every input is a valid script).
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// Reads `data` from the start.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte (0 when exhausted).
    pub fn u8(&mut self) -> u8 {
        let (head, rest): ([u8; 1], &[u8]) = split_prefix(self.data);
        self.data = rest;
        head[0]
    }

    /// The next little-endian u16.
    pub fn u16(&mut self) -> u16 {
        let (head, rest): ([u8; 2], &[u8]) = split_prefix(self.data);
        self.data = rest;
        u16::from_le_bytes(head)
    }

    /// The next `n` bytes (fewer when exhausted).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }
}
