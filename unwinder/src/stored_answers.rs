//! A module's answers read from its symbol store file, decoded one at a
//! time as they are asked for.
//!
//! A store file holds every answer any earlier run found for its module:
//! thousands for a large binary (400 KB for a generated program of 3,000
//! functions that `record -i 1` once sampled everywhere), of which a short
//! run asks for a few dozen. Decoding them all into a map (a `String` per
//! name and file, a map insert each) cost every short `record` 3-6 ms of
//! CPU, on the two cores the profiled program shares. Loading now makes an
//! index, each answer's address and where it starts, in one pass that
//! checks every answer's structure as strictly as the full decode did
//! (bounds, limits, the answers ending where the file's checksum starts)
//! and allocates nothing; an answer is decoded when it is asked for, and
//! only then are its strings checked to be UTF-8 (3,000 answers' names and
//! paths were the largest part of that pass): one that is not (a file
//! whose checksum was made to fit) is no answer, and the address is
//! symbolized afresh.
//!
//! ```text
//! answers: n x (u64 rel_pc, u16 frames,
//!          frames x (u8 has fn|file|line, [u32 len, fn], [u32 len, file], [u32 line]))
//! ```
//!
//! An address stored twice (no save writes that; a damaged file may) has
//! its last answer, as a map filled in file order would.

use std::sync::Arc;

use crate::byte_cursor::{Cursor, MAX_STRING};
use crate::symbol_frame::SymbolFrame;

/// Most frames one answer holds (as the lookup keeps).
const MAX_FRAMES: usize = 256;
/// A frame's flag bits: which of its fields follow.
const HAS_FUNCTION: u8 = 1;
const HAS_FILE: u8 = 2;
const HAS_LINE: u8 = 4;

/// One answer a save writes.
pub(crate) trait AnswerBytes {
    /// Appends the answer, encoded.
    fn append_to(&self, out: &mut Vec<u8>);
}

impl<F: AsRef<[SymbolFrame]>> AnswerBytes for (u64, F) {
    fn append_to(&self, out: &mut Vec<u8>) {
        encode_answer(out, self.0, self.1.as_ref());
    }
}

/// An answer a save writes: one found in this run, encoded as it is
/// written, or one kept from the file read, whose bytes are copied as
/// they are (decoding an old file's thousands of answers to encode them
/// again was 1.4 ms of every short `record` whose module file was large).
pub(crate) enum ToWrite<'a> {
    /// Found in this run.
    New(u64, Arc<[SymbolFrame]>),
    /// Kept: its address, and its bytes from [`StoredAnswers::kept`].
    Kept(u64, &'a [u8]),
}

impl ToWrite<'_> {
    /// The answer's address.
    pub(crate) fn pc(&self) -> u64 {
        match *self {
            ToWrite::New(pc, _) | ToWrite::Kept(pc, _) => pc,
        }
    }
}

impl AnswerBytes for ToWrite<'_> {
    fn append_to(&self, out: &mut Vec<u8>) {
        match self {
            ToWrite::New(pc, frames) => encode_answer(out, *pc, frames),
            ToWrite::Kept(_, bytes) => out.extend_from_slice(bytes),
        }
    }
}

/// Appends the answer `frames` for `pc` (at most [`MAX_FRAMES`] frames,
/// strings cut to [`MAX_STRING`] bytes at a char boundary).
pub(crate) fn encode_answer(out: &mut Vec<u8>, pc: u64, frames: &[SymbolFrame]) {
    out.extend_from_slice(&pc.to_le_bytes());
    let frames = &frames[..frames.len().min(MAX_FRAMES)];
    out.extend_from_slice(&(frames.len() as u16).to_le_bytes());
    for f in frames {
        let flags = if f.function.is_some() {
            HAS_FUNCTION
        } else {
            0
        } | if f.file.is_some() { HAS_FILE } else { 0 }
            | if f.line.is_some() { HAS_LINE } else { 0 };
        out.push(flags);
        for s in [&f.function, &f.file].into_iter().flatten() {
            put_str(out, s);
        }
        if let Some(l) = f.line {
            out.extend_from_slice(&l.to_le_bytes());
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let s = &s.as_bytes()[..floor_char(s, MAX_STRING)];
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
}

/// The largest char boundary of `s` at most `max`.
fn floor_char(s: &str, max: usize) -> usize {
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The answers of one store file: its bytes, and an index into them.
pub(crate) struct StoredAnswers {
    bytes: Vec<u8>,
    /// (rel_pc, offset of the answer's frame count in `bytes`), sorted by
    /// rel_pc, one entry per address; and where the answer ends.
    index: Vec<(u64, u32, u32)>,
}

impl std::fmt::Debug for StoredAnswers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredAnswers")
            .field("answers", &self.index.len())
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl PartialEq for StoredAnswers {
    /// The same addresses with the same answers (wherever their bytes
    /// are; an answer that does not decode is no answer).
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl StoredAnswers {
    /// The `n` answers that are `bytes[start..end]`, exactly; `None` if any
    /// answer does not parse, breaks a limit, or the answers end anywhere
    /// but at `end`.
    pub(crate) fn parse(bytes: Vec<u8>, start: usize, end: usize, n: usize) -> Option<Self> {
        if end > bytes.len() || start > end || end > u32::MAX as usize {
            return None;
        }
        let mut index = Vec::with_capacity(n);
        let mut c = Cursor::new(&bytes[..end], start);
        for _ in 0..n {
            let pc = c.u64()?;
            let at = c.pos as u32;
            let frames = c.u16()? as usize;
            if frames > MAX_FRAMES {
                return None;
            }
            for _ in 0..frames {
                let flags = c.u8()?;
                if flags & HAS_FUNCTION != 0 {
                    c.raw_str()?;
                }
                if flags & HAS_FILE != 0 {
                    c.raw_str()?;
                }
                if flags & HAS_LINE != 0 {
                    c.u32()?;
                }
            }
            index.push((pc, at, c.pos as u32));
        }
        if c.pos != end {
            return None;
        }
        // By address, then offset: an address stored twice keeps its
        // entries in file order, and the last one stays. (Saves write in
        // address order, so this is one pass over a sorted index.)
        index.sort_unstable();
        index.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                *kept = *later;
            }
            same
        });
        Some(StoredAnswers { bytes, index })
    }

    /// Number of addresses the file answers (one whose answer does not
    /// decode included; tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// The answer for `pc`, decoded.
    pub(crate) fn get(&self, pc: u64) -> Option<Arc<[SymbolFrame]>> {
        let i = self.index.binary_search_by_key(&pc, |&(p, _, _)| p).ok()?;
        self.decode_at(self.index[i].1)
    }

    /// Every address and its answer, decoded, by address.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, Arc<[SymbolFrame]>)> + '_ {
        self.index
            .iter()
            .filter_map(|&(pc, at, _)| Some((pc, self.decode_at(at)?)))
    }

    /// Every address and its answer's bytes as stored (address first), by
    /// address; an answer that does not decode is left out. For a save
    /// to copy ([`ToWrite::Kept`]).
    pub(crate) fn kept(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        self.index.iter().filter_map(|&(pc, at, end)| {
            // The answer's address is the 8 bytes before its frame count.
            let start = (at as usize).checked_sub(8)?;
            let bytes = self.bytes.get(start..end as usize)?;
            self.decodes_at(at).then_some((pc, bytes))
        })
    }

    /// Whether the answer at `at` decodes: [`Self::decode_at`] with
    /// nothing kept.
    fn decodes_at(&self, at: u32) -> bool {
        let mut c = Cursor::new(&self.bytes, at as usize);
        let Some(frames) = c.u16() else { return false };
        (0..frames).all(|_| {
            let Some(flags) = c.u8() else { return false };
            (flags & HAS_FUNCTION == 0 || c.str().is_some())
                && (flags & HAS_FILE == 0 || c.str().is_some())
                && (flags & HAS_LINE == 0 || c.u32().is_some())
        })
    }

    /// The answer whose frame count is at `at` (checked by `parse`; a
    /// checked read all the same).
    fn decode_at(&self, at: u32) -> Option<Arc<[SymbolFrame]>> {
        let mut c = Cursor::new(&self.bytes, at as usize);
        let frames = c.u16()? as usize;
        let mut v = Vec::with_capacity(frames.min(MAX_FRAMES));
        for _ in 0..frames {
            let flags = c.u8()?;
            let function = if flags & HAS_FUNCTION != 0 {
                Some(c.str()?.to_owned())
            } else {
                None
            };
            let file = if flags & HAS_FILE != 0 {
                Some(c.str()?.to_owned())
            } else {
                None
            };
            let line = if flags & HAS_LINE != 0 {
                Some(c.u32()?)
            } else {
                None
            };
            v.push(SymbolFrame {
                function,
                file,
                line,
            });
        }
        Some(v.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame's function, file and line, as bytes.
    type Frame<'a> = (Option<&'a [u8]>, Option<&'a [u8]>, Option<u32>);

    /// One answer's bytes: `pc`, then its frames.
    fn answer(out: &mut Vec<u8>, pc: u64, frames: &[Frame<'_>]) {
        out.extend_from_slice(&pc.to_le_bytes());
        out.extend_from_slice(&(frames.len() as u16).to_le_bytes());
        for (function, file, line) in frames {
            let flags = u8::from(function.is_some())
                | u8::from(file.is_some()) << 1
                | u8::from(line.is_some()) << 2;
            out.push(flags);
            for s in [function, file].into_iter().flatten() {
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s);
            }
            if let Some(l) = line {
                out.extend_from_slice(&l.to_le_bytes());
            }
        }
    }

    fn names(a: &StoredAnswers, pc: u64) -> Option<Vec<Option<String>>> {
        Some(a.get(pc)?.iter().map(|f| f.function.clone()).collect())
    }

    #[test]
    fn answers_are_found_by_address_after_a_header() {
        let mut b = b"header".to_vec();
        answer(
            &mut b,
            0x30,
            &[
                (Some(b"inl"), Some(b"a.c"), Some(3)),
                (Some(b"f"), None, None),
            ],
        );
        answer(&mut b, 0x10, &[(None, None, None)]);
        answer(&mut b, u64::MAX, &[]);
        let end = b.len();
        b.extend_from_slice(b"crc!");
        let a = StoredAnswers::parse(b, 6, end, 3).expect("parses");
        assert_eq!(a.len(), 3);
        assert_eq!(
            names(&a, 0x30),
            Some(vec![Some("inl".into()), Some("f".into())])
        );
        let frames = a.get(0x30).expect("answered");
        assert_eq!(
            (frames[0].file.as_deref(), frames[0].line),
            (Some("a.c"), Some(3))
        );
        assert_eq!(names(&a, 0x10), Some(vec![None]));
        assert_eq!(names(&a, u64::MAX), Some(vec![]));
        assert_eq!(names(&a, 0x20), None);
        let order: Vec<u64> = a.iter().map(|(pc, _)| pc).collect();
        assert_eq!(order, [0x10, 0x30, u64::MAX]);
    }

    #[test]
    fn an_address_stored_twice_has_its_last_answer() {
        let mut b = Vec::new();
        answer(&mut b, 7, &[(Some(b"first"), None, None)]);
        answer(&mut b, 9, &[(Some(b"other"), None, None)]);
        answer(&mut b, 7, &[(Some(b"last"), None, None)]);
        let end = b.len();
        let a = StoredAnswers::parse(b, 0, end, 3).expect("parses");
        assert_eq!(a.len(), 2);
        assert_eq!(names(&a, 7), Some(vec![Some("last".into())]));
        assert_eq!(names(&a, 9), Some(vec![Some("other".into())]));
    }

    #[test]
    fn answers_that_do_not_parse_exactly_are_refused() {
        let mut good = Vec::new();
        answer(&mut good, 1, &[(Some(b"f"), Some(b"x.c"), Some(1))]);
        let n = good.len();
        assert!(StoredAnswers::parse(good.clone(), 0, n, 1).is_some());
        // Too few answers for the bytes, too many, bytes left over or short.
        assert!(StoredAnswers::parse(good.clone(), 0, n, 0).is_none());
        assert!(StoredAnswers::parse(good.clone(), 0, n, 2).is_none());
        assert!(StoredAnswers::parse(good.clone(), 0, n - 1, 1).is_none());
        assert!(StoredAnswers::parse(good.clone(), 0, n + 1, 1).is_none());
        assert!(StoredAnswers::parse(good.clone(), n + 1, n, 0).is_none());
        // More frames than an answer may hold.
        let mut many = Vec::new();
        answer(&mut many, 1, &vec![(None, None, None); MAX_FRAMES + 1]);
        let n = many.len();
        assert!(StoredAnswers::parse(many, 0, n, 1).is_none());
        // A string longer than allowed, and one whose length runs past the end.
        let long = vec![b'a'; MAX_STRING + 1];
        let mut b = Vec::new();
        answer(&mut b, 1, &[(Some(&long), None, None)]);
        let n = b.len();
        assert!(StoredAnswers::parse(b, 0, n, 1).is_none());
        let mut b = Vec::new();
        answer(&mut b, 1, &[(Some(b"abc"), None, None)]);
        b.truncate(b.len() - 1);
        let n = b.len();
        assert!(StoredAnswers::parse(b, 0, n, 1).is_none());
    }

    #[test]
    fn an_answer_whose_strings_are_not_utf8_is_no_answer() {
        let mut b = Vec::new();
        answer(&mut b, 1, &[(Some(b"\xff\xfe"), None, None)]);
        answer(&mut b, 2, &[(Some(b"ok"), None, None)]);
        answer(&mut b, 3, &[(None, Some(b"\xc3"), Some(1))]);
        let n = b.len();
        let a = StoredAnswers::parse(b, 0, n, 3).expect("parses");
        assert_eq!(names(&a, 1), None);
        assert_eq!(names(&a, 2), Some(vec![Some("ok".into())]));
        assert_eq!(names(&a, 3), None);
        assert_eq!(a.iter().map(|(pc, _)| pc).collect::<Vec<_>>(), [2]);
    }
}
