//! The text of `heapprofd-rs report` (heaptrack_print style) from a
//! [`Report`].
//!
//! Counts say what they are: at interval 1 the trace has every
//! allocation ("N allocations"); otherwise it has samples, and the line
//! gives the samples and the allocations they stand for, labelled as an
//! estimate ("N samples, ~M allocations est.").

use std::io::{self, Write};

use crate::sites::{Site, SizeRow, Totals};
use crate::summary::{HeapReport, Report};
use crate::units::{human_bytes, human_count, human_us};

/// How much of each stack the text shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextOptions {
    /// Callers shown per site (`--depth`).
    pub callers: usize,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions { callers: 6 }
    }
}

pub(crate) fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// `n` and `word`, plural unless `n` is 1.
pub(crate) fn counted(n: u64, word: &str) -> String {
    format!("{} {word}{}", human_count(n), if n == 1 { "" } else { "s" })
}

/// `N allocations`, or `N samples, ~M allocations est.` when sampled.
pub(crate) fn count_phrase(samples: u64, t: &Totals, exact: bool) -> String {
    match t.estimated_allocations {
        _ if exact => counted(samples, "allocation"),
        Some(est) => format!(
            "{}, ~{} est.",
            counted(samples, "sample"),
            counted(est.round() as u64, "allocation")
        ),
        None => counted(samples, "sample"),
    }
}

fn sizes_phrase(rows: &[SizeRow]) -> String {
    let total: f64 = rows.iter().map(|r| r.allocations).sum();
    let mut top: Vec<&SizeRow> = rows.iter().collect();
    top.sort_by(|a, b| b.allocations.total_cmp(&a.allocations));
    top.iter()
        .take(3)
        .map(|r| {
            format!(
                "{} x{} ({:.0}%)",
                size_range(r),
                human_count(r.allocations.round() as u64),
                if total > 0.0 {
                    r.allocations * 100.0 / total
                } else {
                    0.0
                }
            )
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// `16-31 B`, `4.00-7.99 KiB`... of a size bucket.
pub(crate) fn size_range(r: &SizeRow) -> String {
    if r.low == r.high {
        return human_bytes(r.low);
    }
    if r.high < 1024 {
        return format!("{}-{} B", r.low, r.high);
    }
    // A corrupt trace's size can be the largest there is.
    format!(
        "{}-{}",
        human_bytes(r.low),
        human_bytes(r.high.saturating_add(1))
    )
}

struct Table<'a> {
    title: &'a str,
    whole: u64,
    exact: bool,
    value: &'a dyn Fn(&Totals) -> (u64, u64),
    sizes: bool,
}

fn write_site_table(
    out: &mut impl Write,
    t: &Table<'_>,
    sites: &[Site],
    o: &TextOptions,
) -> io::Result<()> {
    writeln!(out, "\n  {}", t.title)?;
    if sites.is_empty() {
        writeln!(out, "    (none)")?;
    }
    for s in sites {
        let (bytes, count) = (t.value)(&s.totals);
        write!(
            out,
            "    {:>11} {:5.1}% in {}  {}",
            human_bytes(bytes),
            percent(bytes, t.whole),
            count_phrase(count, &s.totals, t.exact),
            s.function
        )?;
        if let Some(l) = &s.location {
            write!(out, " ({l})")?;
        }
        if let Some(v) = &s.via {
            write!(out, " via {v}")?;
        }
        writeln!(out)?;
        write_site_details(out, s, o, t.sizes)?;
    }
    Ok(())
}

fn write_site_details(
    out: &mut impl Write,
    s: &Site,
    o: &TextOptions,
    sizes: bool,
) -> io::Result<()> {
    if let Some(m) = &s.module {
        writeln!(out, "          in {m}")?;
    }
    let callers: Vec<&str> = s
        .heaviest_stack
        .iter()
        .rev()
        .skip(1)
        .take(o.callers)
        .map(String::as_str)
        .collect();
    if !callers.is_empty() {
        let more = if s.heaviest_stack.len() > o.callers + 1 {
            " <- …"
        } else {
            ""
        };
        writeln!(out, "          from {}{more}", callers.join(" <- "))?;
    }
    if sizes && !s.sizes.is_empty() {
        writeln!(out, "          sizes: {}", sizes_phrase(&s.sizes))?;
    }
    Ok(())
}

fn write_sizes(out: &mut impl Write, h: &HeapReport) -> io::Result<()> {
    if h.sizes.is_empty() {
        return Ok(());
    }
    let est = if h.exact { "" } else { ", estimated" };
    writeln!(
        out,
        "\n  ALLOCATION SIZES (requested bytes; allocations{est})"
    )?;
    let max = h.sizes.iter().map(|r| r.allocations).fold(0.0, f64::max);
    let total: f64 = h.sizes.iter().map(|r| r.allocations).sum();
    for r in &h.sizes {
        let bar = if max > 0.0 {
            (r.allocations / max * 40.0).round() as usize
        } else {
            0
        };
        writeln!(
            out,
            "    {:>19} {:>12} {:5.1}% {}",
            size_range(r),
            human_count(r.allocations.round() as u64),
            if total > 0.0 {
                r.allocations * 100.0 / total
            } else {
                0.0
            },
            "#".repeat(bar.max(usize::from(r.allocations > 0.0)))
        )?;
    }
    Ok(())
}

fn write_header(out: &mut impl Write, h: &HeapReport) -> io::Result<()> {
    let cmd = if h.cmdline.is_empty() {
        String::new()
    } else {
        format!(" `{}`", h.cmdline.join(" "))
    };
    let parent = h.ppid.map(|p| format!(" (parent {p})")).unwrap_or_default();
    writeln!(out, "\nPROCESS {}{cmd}{parent}, HEAP {}", h.pid, h.heap)?;
    let interval = match (h.sampling_interval_bytes, h.raised_from_bytes) {
        (0, _) => "unknown".to_owned(),
        (1, _) => "every allocation".to_owned(),
        (n, Some(from)) => format!(
            "1 sample per {} on average, raised up to {} while the profiler fell behind",
            human_bytes(from),
            human_bytes(n)
        ),
        (n, None) => format!("1 sample per {} on average", human_bytes(n)),
    };
    write!(out, "  sampling: {interval}; {} dump(s)", h.dumps)?;
    // As of an earlier dump (--peak) the span would end there: the next
    // line says when that dump was.
    if let (Some(d), None) = (h.duration_ns, &h.as_of) {
        write!(out, " over {:.3} s", d as f64 / 1e9)?;
    }
    writeln!(out)?;
    if h.dump_at_max {
        writeln!(out, "  values are the live heap at its peak (dump-at-max)")?;
    }
    if let Some(a) = &h.as_of {
        writeln!(
            out,
            "  values are those of dump {} of {} at {:.3} s: the {}",
            a.dump, a.of, a.seconds, a.why
        )?;
    }
    if let (Some(n @ 1..), Some(e)) = (h.samples, h.unwinding_errors) {
        write!(
            out,
            "  unwinding: {n} samples, {e} errors ({:.1}%)",
            percent(e, n)
        )?;
        if let Some(us) = h.mean_unwind_us {
            write!(out, ", mean {} us", human_us(us))?;
        }
        writeln!(out)?;
    }
    for f in &h.flags {
        writeln!(out, "  WARNING: {f}")?;
    }
    Ok(())
}

fn write_totals(out: &mut impl Write, h: &HeapReport) -> io::Result<()> {
    let t = &h.totals;
    writeln!(
        out,
        "  allocated: {} in {} ({})",
        human_bytes(t.allocated),
        count_phrase(t.alloc_count, t, h.exact),
        counted(h.stacks as u64, "stack")
    )?;
    let frees = if h.exact { "frees" } else { "sampled frees" };
    writeln!(
        out,
        "  freed:     {} in {} {frees}",
        human_bytes(t.freed),
        human_count(t.free_count)
    )?;
    let unit = if h.exact { "allocation" } else { "sample" };
    writeln!(
        out,
        "  unreleased: {} in {}",
        human_bytes(t.unreleased),
        counted(t.unreleased_count, unit)
    )?;
    if let Some(tmp) = t.temporary {
        writeln!(
            out,
            "  temporary: {} allocations ({:.1}%) freed before their thread allocated again",
            human_count(tmp),
            percent(tmp, t.alloc_count)
        )?;
    }
    if let (Some(n), Some(within)) = (t.short_lived, h.short_lived_within) {
        writeln!(
            out,
            "  short-lived: {} allocations ({:.1}%) freed within {} allocations",
            human_count(n),
            percent(n, t.alloc_count),
            human_count(within)
        )?;
    }
    Ok(())
}

/// Writes one heap's part of the report.
pub fn write_heap(out: &mut impl Write, h: &HeapReport, o: &TextOptions) -> io::Result<()> {
    write_header(out, h)?;
    write_totals(out, h)?;
    let t = &h.totals;
    let exact = h.exact;
    write_site_table(
        out,
        &Table {
            title: "TOP ALLOCATION SITES (self, allocated bytes)",
            whole: t.allocated,
            exact,
            value: &|s| (s.allocated, s.alloc_count),
            sizes: true,
        },
        &h.top_self,
        o,
    )?;
    write_site_table(
        out,
        &Table {
            title: "TOP FUNCTIONS (inclusive, allocated bytes)",
            whole: t.allocated,
            exact,
            value: &|s| (s.allocated, s.alloc_count),
            sizes: false,
        },
        &h.top_inclusive,
        o,
    )?;
    if !h.inclusive_omitted.is_empty() {
        writeln!(
            out,
            "    (left out: program entry frames and functions on every stack: {})",
            h.inclusive_omitted.join(", ")
        )?;
    }
    write_site_table(
        out,
        &Table {
            title: "TOP UNRELEASED (self, bytes not freed)",
            whole: t.unreleased,
            exact,
            value: &|s| (s.unreleased, s.unreleased_count),
            sizes: false,
        },
        &h.top_unreleased,
        o,
    )?;
    if h.exact {
        writeln!(
            out,
            "\n  TOP TEMPORARY ALLOCATIONS (self; freed before their thread allocated again)"
        )?;
        if h.top_temporary.is_empty() {
            writeln!(out, "    (none)")?;
        }
        for s in &h.top_temporary {
            let tmp = s.totals.temporary.unwrap_or(0);
            write!(
                out,
                "    {:>11} of {} allocations ({:.1}%)  {}",
                human_count(tmp),
                human_count(s.totals.alloc_count),
                percent(tmp, s.totals.alloc_count),
                s.function
            )?;
            if let Some(l) = &s.location {
                write!(out, " ({l})")?;
            }
            writeln!(out)?;
            write_site_details(out, s, o, false)?;
        }
    }
    write_sizes(out, h)
}

/// Writes the report as text.
pub fn write_text(r: &Report, out: &mut impl Write, o: &TextOptions) -> io::Result<()> {
    writeln!(out, "heap profile: {}", r.trace)?;
    if r.heaps.is_empty() {
        if r.truncated.is_some() {
            writeln!(out, "\nno heap dump could be read before the trace ends")?;
        } else {
            writeln!(
                out,
                "\nno heap dumps (nothing was sampled, or the filter matched nothing)"
            )?;
        }
    }
    for h in &r.heaps {
        write_heap(out, h, o)?;
    }
    for w in &r.warnings {
        writeln!(out, "\nwarning: {w}")?;
    }
    if let Some(t) = &r.truncated {
        writeln!(
            out,
            "\nTRUNCATED: {} at byte {} of {}; the report covers what was read before it",
            t.what, t.offset, t.file_len
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A corrupt trace can hold a size bucket that ends at the largest
    /// size there is (the robustness property test found it).
    #[test]
    fn a_bucket_ending_at_the_largest_size_is_named() {
        let r = SizeRow {
            low: 1 << 63,
            high: u64::MAX,
            samples: 1,
            allocations: 1.0,
        };
        assert!(size_range(&r).contains('-'), "{}", size_range(&r));
        assert_eq!(
            size_range(&SizeRow {
                low: 16,
                high: 31,
                ..r
            }),
            "16-31 B"
        );
    }
}
