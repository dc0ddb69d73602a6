//! `report --by KEY`: per process and heap, the totals of every value the
//! user context key `KEY` took (samples made outside any context with that
//! key are one `(none)` row).

use std::collections::BTreeMap;
use std::io::{self, Write};

use heapprofd_model::trace::{Counters, TraceData};
use serde::Serialize;

use crate::filter::Filter;
use crate::units::{human_bytes, human_count};

/// The totals of one value of the key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ValueTotals {
    /// The value (`None`: no context with the key).
    pub value: Option<String>,
    /// Sampled bytes allocated.
    pub allocated: u64,
    /// Sampled bytes freed.
    pub freed: u64,
    /// Samples (allocations at -i 1).
    pub alloc_count: u64,
    /// Bytes allocated and not freed.
    pub unreleased: u64,
}

/// One heap's totals by the key's value, largest allocation first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HeapByContext {
    /// Process id.
    pub pid: u32,
    /// Heap name.
    pub heap: String,
    /// The context key.
    pub key: String,
    /// Per value.
    pub values: Vec<ValueTotals>,
}

/// The totals by `key` of every heap `filter` selects.
pub fn by_context(data: &TraceData, filter: &Filter, key: &str) -> Vec<HeapByContext> {
    data.heaps
        .iter()
        .filter(|h| filter.matches(h))
        .map(|h| {
            let mut sums: BTreeMap<Option<String>, Counters> = BTreeMap::new();
            for c in &h.callstacks {
                let t = sums
                    .entry(c.context_value(key).map(str::to_owned))
                    .or_default();
                let v = c.counters();
                t.allocated += v.allocated;
                t.freed += v.freed;
                t.alloc_count += v.alloc_count;
                t.free_count += v.free_count;
            }
            let mut values: Vec<ValueTotals> = sums
                .into_iter()
                .map(|(value, t)| ValueTotals {
                    value,
                    allocated: t.allocated,
                    freed: t.freed,
                    alloc_count: t.alloc_count,
                    unreleased: t.unreleased(),
                })
                .collect();
            values.sort_by(|a, b| b.allocated.cmp(&a.allocated).then(a.value.cmp(&b.value)));
            HeapByContext {
                pid: h.pid,
                heap: h.heap_name.clone(),
                key: key.to_owned(),
                values,
            }
        })
        .collect()
}

/// Writes the totals as text.
pub fn write_by_context(
    out: &mut impl Write,
    trace: &str,
    heaps: &[HeapByContext],
) -> io::Result<()> {
    writeln!(out, "heap profile: {trace}")?;
    for h in heaps {
        writeln!(
            out,
            "\nprocess {} heap {}: by context key {:?}",
            h.pid, h.heap, h.key
        )?;
        writeln!(
            out,
            "  {:>14} {:>12} {:>14} {:>12}  value",
            "allocated B", "allocated", "allocations", "unreleased"
        )?;
        for v in &h.values {
            writeln!(
                out,
                "  {:>14} {:>12} {:>14} {:>12}  {}",
                v.allocated,
                human_bytes(v.allocated),
                human_count(v.alloc_count),
                human_bytes(v.unreleased),
                v.value.as_deref().unwrap_or("(none)")
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapprofd_model::trace::{CallstackValues, HeapProfile};

    #[test]
    fn sums_per_value() {
        let cs = |ctx: Option<&str>, bytes: u64| CallstackValues {
            context: ctx.map(|v| vec![("endpoint".to_owned(), v.to_owned())]),
            self_allocated: bytes,
            alloc_count: 1,
            ..Default::default()
        };
        let data = TraceData {
            heaps: vec![HeapProfile {
                pid: 7,
                heap_name: "libc.malloc".into(),
                callstacks: vec![
                    cs(Some("/a"), 30),
                    cs(None, 5),
                    cs(Some("/b"), 10),
                    cs(Some("/a"), 3),
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = by_context(&data, &Filter::default(), "endpoint");
        let got: Vec<_> = r[0]
            .values
            .iter()
            .map(|v| (v.value.as_deref(), v.allocated, v.alloc_count))
            .collect();
        assert_eq!(
            got,
            [(Some("/a"), 33, 2), (Some("/b"), 10, 1), (None, 5, 1)]
        );
    }
}
