//! Helpers shared by the fuzz targets.

/// Splits fuzzer input into a fixed-size prefix (zero-padded) and the rest.
pub fn split_prefix<const N: usize>(data: &[u8]) -> ([u8; N], &[u8]) {
    let mut head = [0u8; N];
    let n = data.len().min(N);
    head[..n].copy_from_slice(&data[..n]);
    (head, &data[n..])
}
