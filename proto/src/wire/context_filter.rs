//! [`ContextFilter`]: which user contexts a session samples in (`record
//! --context`), carried in [`ClientConfig`](super::ClientConfig) (Since
//! [`version::V4`](super::version::V4)), and the matching rule both sides
//! share ([`context_matches`]): a context matches when any filter does.
//!
//! ```text
//! offset  field (one filter, CONTEXT_FILTER_LEN bytes)
//!   0     kind: u32 (ANY, KEY, KEY_VALUE), 4 bytes padding
//!   8     key:   64 bytes, NUL-padded (1 to 63 bytes)
//!  72     value: 256 bytes, NUL-padded (0 to 255 bytes; KEY_VALUE only)
//! ```

use super::codec::{DecodeError, Get, Put};
use super::context::MAX_CONTEXT_STR;

/// Filters one configuration holds.
pub const MAX_CONTEXT_FILTERS: usize = 8;
/// Longest filter key in bytes.
pub const MAX_FILTER_KEY: usize = KEY_FIELD - 1;
const KEY_FIELD: usize = 64;
const VALUE_FIELD: usize = MAX_CONTEXT_STR + 1;
/// Bytes of one encoded filter.
pub const CONTEXT_FILTER_LEN: usize = 8 + KEY_FIELD + VALUE_FIELD;

/// What a filter asks of a context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum FilterKind {
    /// Unused slot.
    None = 0,
    /// Any context (`--context any`).
    Any = 1,
    /// A context with this key (`--context KEY`).
    Key = 2,
    /// A context mapping this key to this value (`--context KEY=VALUE`).
    KeyValue = 3,
}

/// One `--context` filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextFilter {
    /// What it asks.
    pub kind: FilterKind,
    /// NUL-padded key.
    pub key: [u8; KEY_FIELD],
    /// NUL-padded value.
    pub value: [u8; VALUE_FIELD],
}

impl ContextFilter {
    /// An unused slot.
    pub const EMPTY: ContextFilter = ContextFilter {
        kind: FilterKind::None,
        key: [0; KEY_FIELD],
        value: [0; VALUE_FIELD],
    };

    /// A filter from its command-line form: `any`, `KEY` or `KEY=VALUE`;
    /// `None` if the key is empty, longer than [`MAX_FILTER_KEY`] bytes or
    /// holds a NUL, or the value is longer than 255 bytes or holds a NUL.
    pub fn parse(s: &str) -> Option<ContextFilter> {
        if s == "any" {
            return Some(ContextFilter {
                kind: FilterKind::Any,
                ..Self::EMPTY
            });
        }
        let (key, value, kind) = match s.split_once('=') {
            Some((k, v)) => (k, v, FilterKind::KeyValue),
            None => (s, "", FilterKind::Key),
        };
        if key.is_empty()
            || key.len() > MAX_FILTER_KEY
            || value.len() > MAX_CONTEXT_STR
            || key.contains('\0')
            || value.contains('\0')
        {
            return None;
        }
        let mut f = ContextFilter {
            kind,
            ..Self::EMPTY
        };
        f.key[..key.len()].copy_from_slice(key.as_bytes());
        f.value[..value.len()].copy_from_slice(value.as_bytes());
        Some(f)
    }

    fn key_bytes(&self) -> &[u8] {
        until_nul(&self.key)
    }

    fn value_bytes(&self) -> &[u8] {
        until_nul(&self.value)
    }

    /// Whether a context with these pairs passes this filter.
    pub fn matches<'a>(&self, mut pairs: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> bool {
        match self.kind {
            FilterKind::None => false,
            FilterKind::Any => true,
            FilterKind::Key => pairs.any(|(k, _)| k == self.key_bytes()),
            FilterKind::KeyValue => {
                pairs.any(|(k, v)| k == self.key_bytes() && v == self.value_bytes())
            }
        }
    }

    pub(super) fn encode(&self, p: &mut Put<'_>) {
        p.u32(self.kind as u32);
        p.u32(0);
        p.bytes(&self.key);
        p.bytes(&self.value);
    }

    pub(super) fn decode(g: &mut Get<'_>) -> Result<ContextFilter, DecodeError> {
        let kind = match g.u32() {
            0 => FilterKind::None,
            1 => FilterKind::Any,
            2 => FilterKind::Key,
            3 => FilterKind::KeyValue,
            _ => return Err(DecodeError::InvalidField("context filter kind")),
        };
        let _pad = g.u32();
        let key: [u8; KEY_FIELD] = g.array();
        let value: [u8; VALUE_FIELD] = g.array();
        let padded = |f: &[u8]| {
            let n = until_nul(f).len();
            n < f.len() && f[n..].iter().all(|&b| b == 0)
        };
        if !padded(&key) || !padded(&value) {
            return Err(DecodeError::InvalidField("context filter"));
        }
        Ok(ContextFilter { kind, key, value })
    }
}

fn until_nul(f: &[u8]) -> &[u8] {
    let n = f.iter().position(|&b| b == 0).unwrap_or(f.len());
    &f[..n]
}

/// Whether a context with `pairs` passes `filters` (any of them); with no
/// filter every context, and no context, passes. `pairs` is called once
/// per filter (it re-reads the context's stored pairs).
pub fn context_matches<'a, I>(filters: &[ContextFilter], pairs: impl Fn() -> I) -> bool
where
    I: Iterator<Item = (&'a [u8], &'a [u8])>,
{
    filters.iter().any(|f| f.matches(pairs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_match() {
        let ctx: [(&[u8], &[u8]); 2] = [(b"endpoint", b"/a"), (b"user", b"x=y")];
        let m = |s: &str| {
            ContextFilter::parse(s)
                .unwrap()
                .matches(ctx.iter().copied())
        };
        assert!(m("any") && m("endpoint") && m("endpoint=/a") && m("user=x=y"));
        assert!(!m("endpoint=/b") && !m("other") && !m("endpoint="));
        assert!(ContextFilter::parse("").is_none());
        assert!(ContextFilter::parse("=v").is_none());
        assert!(ContextFilter::parse(&"k".repeat(64)).is_none());
        assert!(ContextFilter::parse(&"k".repeat(63)).is_some());
        let fs = [
            ContextFilter::parse("endpoint=/b").unwrap(),
            ContextFilter::parse("user").unwrap(),
        ];
        assert!(context_matches(&fs, || ctx.iter().copied()));
        assert!(!context_matches(&fs[..1], || ctx.iter().copied()));
        assert!(!context_matches(&[], || ctx.iter().copied()));
    }
}
