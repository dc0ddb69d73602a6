//! User contexts in the profile: a sample made while a context was
//! installed is charged to a callsite whose outermost frame is the
//! context's synthetic root frame, `key=value` pairs in the
//! [`CONTEXT_MAPPING`] mapping.
//!
//! Why a root frame: the Perfetto UI draws one flame graph per process
//! and heap and has no label dimension; a root frame per context shows
//! each context's totals as the first level of that flame graph (and
//! trace processor's `experimental_flamegraph` sums them), while the
//! stacks below stay those of the program. Readers of the trace
//! ([`read_trace`](crate::trace::read_trace)) take the frame off again and
//! give the pairs as the callstack's context (pprof labels, `report
//! --by`).
//!
//! The frame's function name is the pairs in order, `key=value` joined by
//! `; `, with `\`, `;` and `=` in keys and values escaped by `\`
//! ([`context_frame_name`], [`parse_context_frame`]).

use super::interner::{FrameId, Interner, Mapping};

/// The mapping of every context root frame (trace readers see it as
/// `/[heapprofd-rs context]`).
pub const CONTEXT_MAPPING: &str = "[heapprofd-rs context]";
/// The key of the pair that names the client's overflow context and
/// contexts the trace never defined.
pub const CONTEXT_META_KEY: &str = "heapprofd.context";

/// What a process's contexts came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContextStats {
    /// Context definitions received (once per context and session).
    pub defined: u64,
    /// Contexts the client had no room for (the overflow context's
    /// samples stand for them).
    pub overflowed: u64,
    /// Samples whose context id no definition named.
    pub unknown_samples: u64,
}

/// A context's pairs, in order.
pub type ContextLabels = Vec<(String, String)>;

/// The overflow context's labels (the client had no room to store the
/// context the program created).
pub fn overflow_labels() -> ContextLabels {
    vec![(CONTEXT_META_KEY.to_owned(), "overflow".to_owned())]
}

/// The labels of a context id no definition named (released before its
/// first sample was recorded, or a corrupt id).
pub fn unknown_labels() -> ContextLabels {
    vec![(CONTEXT_META_KEY.to_owned(), "unknown".to_owned())]
}

fn escape(out: &mut String, s: &str) {
    for c in s.chars() {
        if matches!(c, '\\' | ';' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// The root frame's function name for `labels`.
pub fn context_frame_name(labels: &[(String, String)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        escape(&mut out, k);
        out.push('=');
        escape(&mut out, v);
    }
    out
}

/// The pairs of a root frame's function name (inverse of
/// [`context_frame_name`]); a part without `=` is a key with an empty value.
pub fn parse_context_frame(name: &str) -> ContextLabels {
    let mut pairs = Vec::new();
    let (mut key, mut cur) = (None::<String>, String::new());
    let mut chars = name.chars();
    let mut finish = |key: &mut Option<String>, cur: &mut String| {
        let (k, v) = match key.take() {
            Some(k) => (k, std::mem::take(cur)),
            None => (std::mem::take(cur), String::new()),
        };
        if !k.is_empty() {
            pairs.push((k, v));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            '=' if key.is_none() => key = Some(std::mem::take(&mut cur)),
            ';' => {
                finish(&mut key, &mut cur);
                if chars.clone().next() == Some(' ') {
                    chars.next();
                }
            }
            c => cur.push(c),
        }
    }
    finish(&mut key, &mut cur);
    pairs
}

/// Interns the root frame of a context with `labels` (contexts with the
/// same pairs share it).
pub fn intern_context_frame(interner: &Interner, labels: &[(String, String)]) -> FrameId {
    let mapping = interner.intern_mapping(&Mapping {
        path: CONTEXT_MAPPING.as_bytes(),
        build_id: None,
        start: 0,
        end: 0,
        exact_offset: 0,
        start_offset: 0,
        load_bias: 0,
    });
    interner.intern_frame(
        Some(mapping),
        0,
        Some(&context_frame_name(labels)),
        None,
        None,
    )
}

/// Whether a trace reader's mapping name is [`CONTEXT_MAPPING`]'s.
pub fn is_context_mapping(name: &str) -> bool {
    name.trim_start_matches('/') == CONTEXT_MAPPING
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let labels: ContextLabels = [("endpoint", "/a"), ("q", "x=1; y\\"), ("empty", "")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let name = context_frame_name(&labels);
        assert_eq!(name, "endpoint=/a; q=x\\=1\\; y\\\\; empty=");
        assert_eq!(parse_context_frame(&name), labels);
        assert_eq!(context_frame_name(&labels[..1]), "endpoint=/a");
        assert!(is_context_mapping("/[heapprofd-rs context]"));
    }

    #[test]
    fn frames_are_shared_by_equal_labels() {
        let i = Interner::new();
        let a = intern_context_frame(&i, &overflow_labels());
        assert_eq!(a, intern_context_frame(&i, &overflow_labels()));
        assert_ne!(a, intern_context_frame(&i, &unknown_labels()));
        assert_eq!(
            i.read().function_name(a).as_deref(),
            Some("heapprofd.context=overflow")
        );
    }
}
