//! [`ContextRecord`]: the definition of a user context (an immutable map of
//! string keys to string values a program attaches to what its threads
//! allocate), sent into the ring once per context and session, before the
//! first sample that carries its id (Since [`version::V4`](super::version::V4)).
//!
//! ```text
//! offset  field
//!   0     kind: u32 (4), flags: u32 (FLAG_OVERFLOW)
//!   8     context_id: u64      the id samples carry (MallocHeader::context_id)
//!  16     overflowed: u64      contexts the client could not store so far
//!  24     pairs_len: u32, n_pairs: u32
//!  32     pairs: n_pairs x [klen: u8][key][vlen: u8][value]   (pairs_len bytes)
//! ```
//!
//! The map is complete (a context that extends a parent carries the
//! parent's pairs too), so the daemon needs no other record to name it.
//! Keys are 1 to [`MAX_CONTEXT_STR`] bytes, values 0 to
//! [`MAX_CONTEXT_STR`], at most [`MAX_CONTEXT_PAIRS`] pairs and
//! [`MAX_CONTEXT_BYTES`] bytes of pairs.

use super::codec::{DecodeError, Get, Put};
use super::kind::RecordKind;

/// Longest key or value in bytes (its length is one byte on the wire).
pub const MAX_CONTEXT_STR: usize = 255;
/// Most pairs in one context.
pub const MAX_CONTEXT_PAIRS: usize = 32;
/// Most bytes of encoded pairs in one context.
pub const MAX_CONTEXT_BYTES: usize = 1024;
/// `MallocHeader::context_id` of a sample made with no context installed.
pub const CONTEXT_NONE: u64 = 0;
/// Bytes of a [`ContextRecord`]'s fixed part.
pub const CONTEXT_HEADER_LEN: usize = 32;

/// A context definition, borrowing its encoded pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextRecord<'a> {
    /// The id samples carry.
    pub context_id: u64,
    /// [`ContextRecord::FLAG_OVERFLOW`].
    pub flags: u32,
    /// Contexts the client could not store (table or size bound) so far.
    pub overflowed: u64,
    /// Encoded pairs (see the module docs); validated by `decode`.
    pub pairs: &'a [u8],
}

impl<'a> ContextRecord<'a> {
    /// Bytes of the fixed part; the pairs follow.
    pub const ENCODED_LEN: usize = CONTEXT_HEADER_LEN;
    /// The client's overflow context: samples under it were made in
    /// contexts it had no room to store (no pairs).
    pub const FLAG_OVERFLOW: u32 = 1;

    /// Encodes the fixed part for `pairs_len` bytes of `n_pairs` pairs.
    pub fn encode_header(
        context_id: u64,
        flags: u32,
        overflowed: u64,
        pairs_len: usize,
        n_pairs: usize,
    ) -> [u8; CONTEXT_HEADER_LEN] {
        let mut out = [0u8; CONTEXT_HEADER_LEN];
        let mut p = Put::new(&mut out);
        p.u32(RecordKind::Context as u32);
        p.u32(flags);
        p.u64(context_id);
        p.u64(overflowed);
        p.u32(pairs_len as u32);
        p.u32(n_pairs as u32);
        out
    }

    /// Decodes a context record and validates every pair (trailing padding
    /// up to 7 bytes allowed).
    pub fn decode(buf: &'a [u8]) -> Result<ContextRecord<'a>, DecodeError> {
        let mut g = Get::new(buf, Self::ENCODED_LEN)?;
        let kind = g.u32();
        if kind != RecordKind::Context as u32 {
            return Err(DecodeError::WrongKind {
                expected: RecordKind::Context as u32,
                found: kind,
            });
        }
        let flags = g.u32();
        let context_id = g.u64();
        let overflowed = g.u64();
        let pairs_len = g.u32() as usize;
        let n_pairs = g.u32() as usize;
        let rest = &buf[Self::ENCODED_LEN..];
        if pairs_len > MAX_CONTEXT_BYTES || pairs_len > rest.len() || rest.len() - pairs_len >= 8 {
            return Err(DecodeError::InvalidField("context pairs_len"));
        }
        if n_pairs > MAX_CONTEXT_PAIRS {
            return Err(DecodeError::InvalidField("context n_pairs"));
        }
        let r = ContextRecord {
            context_id,
            flags,
            overflowed,
            pairs: &rest[..pairs_len],
        };
        let mut seen = 0;
        let mut it = r.raw_pairs();
        for p in &mut it {
            let (k, _) = p?;
            if k.is_empty() {
                return Err(DecodeError::InvalidField("context key"));
            }
            seen += 1;
        }
        if seen != n_pairs {
            return Err(DecodeError::InvalidField("context n_pairs"));
        }
        Ok(r)
    }

    /// The pairs as bytes, in order.
    pub fn raw_pairs(&self) -> PairIter<'a> {
        PairIter { rest: self.pairs }
    }

    /// The pairs as strings (invalid UTF-8 replaced), in order.
    pub fn pairs_lossy(&self) -> Vec<(String, String)> {
        self.raw_pairs()
            .filter_map(Result::ok)
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect()
    }

    /// Encodes a whole record (tests, fuzzers and tools; the client writes
    /// the header and its stored pairs in place).
    pub fn encode_to_vec(&self) -> Vec<u8> {
        let n = self.raw_pairs().count();
        let mut v = Self::encode_header(
            self.context_id,
            self.flags,
            self.overflowed,
            self.pairs.len(),
            n,
        )
        .to_vec();
        v.extend_from_slice(self.pairs);
        v
    }
}

/// Appends one encoded pair to `out` at `*pos`; false (nothing written) if
/// it does not fit, or a key or value is too long or the key empty.
pub fn encode_context_pair(out: &mut [u8], pos: &mut usize, key: &[u8], value: &[u8]) -> bool {
    if key.is_empty() || key.len() > MAX_CONTEXT_STR || value.len() > MAX_CONTEXT_STR {
        return false;
    }
    let need = 2 + key.len() + value.len();
    let Some(dst) = out.get_mut(*pos..*pos + need) else {
        return false;
    };
    dst[0] = key.len() as u8;
    dst[1..1 + key.len()].copy_from_slice(key);
    dst[1 + key.len()] = value.len() as u8;
    dst[2 + key.len()..].copy_from_slice(value);
    *pos += need;
    true
}

/// Iterates over encoded pairs; a pair running past the end is an error
/// (and ends the iteration).
#[derive(Debug, Clone)]
pub struct PairIter<'a> {
    rest: &'a [u8],
}

impl<'a> PairIter<'a> {
    /// The pairs encoded in `bytes`.
    pub fn new(bytes: &'a [u8]) -> PairIter<'a> {
        PairIter { rest: bytes }
    }
}

impl<'a> Iterator for PairIter<'a> {
    type Item = Result<(&'a [u8], &'a [u8]), DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (&klen, rest) = self.rest.split_first()?;
        let bad = Err(DecodeError::InvalidField("context pair"));
        let Some((key, rest)) = rest.split_at_checked(klen as usize) else {
            self.rest = &[];
            return Some(bad);
        };
        let Some((&vlen, rest)) = rest.split_first() else {
            self.rest = &[];
            return Some(bad);
        };
        let Some((value, rest)) = rest.split_at_checked(vlen as usize) else {
            self.rest = &[];
            return Some(bad);
        };
        self.rest = rest;
        Some(Ok((key, value)))
    }
}

const _: () = assert!(ContextRecord::ENCODED_LEN % 8 == 0);
const _: () = assert!(MAX_CONTEXT_BYTES % 8 == 0);

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<u8> {
        let mut out = [0u8; MAX_CONTEXT_BYTES];
        let mut pos = 0;
        for (k, v) in list {
            assert!(encode_context_pair(
                &mut out,
                &mut pos,
                k.as_bytes(),
                v.as_bytes()
            ));
        }
        out[..pos].to_vec()
    }

    #[test]
    fn round_trip_and_every_prefix_fails() {
        let p = pairs(&[("endpoint", "/a"), ("empty", "")]);
        let r = ContextRecord {
            context_id: 77,
            flags: 0,
            overflowed: 3,
            pairs: &p,
        };
        let mut bytes = r.encode_to_vec();
        assert_eq!(ContextRecord::decode(&bytes), Ok(r));
        assert_eq!(
            r.pairs_lossy(),
            vec![
                ("endpoint".to_owned(), "/a".to_owned()),
                ("empty".to_owned(), String::new())
            ]
        );
        for n in 0..bytes.len() {
            assert!(ContextRecord::decode(&bytes[..n]).is_err(), "prefix {n}");
        }
        bytes.extend_from_slice(&[0; 5]);
        assert!(ContextRecord::decode(&bytes).is_ok(), "padding");
        bytes.extend_from_slice(&[0; 3]);
        assert!(
            ContextRecord::decode(&bytes).is_err(),
            "8 bytes are not padding"
        );
    }

    #[test]
    fn refuses_bad_pairs_and_counts() {
        let mut out = [0u8; 8];
        let mut pos = 0;
        assert!(!encode_context_pair(&mut out, &mut pos, b"", b"x"));
        assert!(!encode_context_pair(
            &mut out,
            &mut pos,
            b"key",
            b"too long"
        ));
        assert_eq!(pos, 0);
        let p = pairs(&[("k", "v")]);
        let mut bytes = ContextRecord {
            context_id: 1,
            flags: 0,
            overflowed: 0,
            pairs: &p,
        }
        .encode_to_vec();
        bytes[28] = 2; // n_pairs disagrees
        assert!(ContextRecord::decode(&bytes).is_err());
        bytes[28] = 1;
        bytes[32] = 0; // empty key
        assert!(ContextRecord::decode(&bytes).is_err());
        bytes[32] = 9; // key past the end
        assert!(ContextRecord::decode(&bytes).is_err());
    }
}
