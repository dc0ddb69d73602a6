//! `convert --timeline-svg`: unreleased memory over time, one line per
//! process and heap (its dumps; a `--continuous-dump` trace has one per
//! tick), with the process's resident set size (from the trace's memory
//! counters) as a dashed line of the same colour. Plain SVG, no script.

use std::fmt::Write as _;
use std::io::Write;

use heapprofd_model::trace::TraceData;

use crate::filter::Filter;
use crate::folded::program_name;
use crate::units::human_bytes;

const W: f64 = 960.0;
const H: f64 = 420.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
pub(crate) const COLORS: [&str; 8] = [
    "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One line of the plot: (seconds, bytes) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points, in time order.
    pub points: Vec<(f64, f64)>,
    /// Dashed (resident set size).
    pub dashed: bool,
    /// Colour index.
    pub color: usize,
}

/// The series of the heaps `filter` selects, times from the earliest
/// window start.
pub fn series(data: &TraceData, filter: &Filter) -> Vec<Series> {
    let heaps: Vec<_> = data.heaps.iter().filter(|h| filter.matches(h)).collect();
    let t0 = heaps
        .iter()
        .filter_map(|h| h.timeline.first())
        .map(|p| p.start.min(p.timestamp))
        .min()
        .unwrap_or(0);
    let secs = |t: u64| t.saturating_sub(t0) as f64 / 1e9;
    let mut out = Vec::new();
    let mut rss_done = Vec::new();
    for (i, h) in heaps.iter().enumerate() {
        let name = program_name(data, h.pid).unwrap_or_else(|| "?".into());
        let mut points = Vec::new();
        if let Some(first) = h.timeline.first() {
            points.push((secs(first.start), 0.0));
        }
        points.extend(
            h.timeline
                .iter()
                .map(|p| (secs(p.timestamp), p.totals.unreleased() as f64)),
        );
        out.push(Series {
            label: format!("{name} (pid {}) {}: unreleased", h.pid, h.heap_name),
            points,
            dashed: false,
            color: i,
        });
        if rss_done.contains(&h.pid) {
            continue;
        }
        rss_done.push(h.pid);
        if let Some(p) = data.processes.get(&h.pid)
            && !p.memory.is_empty()
        {
            out.push(Series {
                label: format!("{name} (pid {}): resident set size", h.pid),
                points: p
                    .memory
                    .iter()
                    .map(|m| (secs(m.timestamp), m.rss_kb as f64 * 1024.0))
                    .collect(),
                dashed: true,
                color: i,
            });
        }
    }
    out
}

/// A "nice" step for about `n` ticks over `max`.
pub(crate) fn nice_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The largest time (s, at least 1 ms) and value (at least 1) of `series`:
/// the plot's axes end there.
pub fn extent(series: &[Series]) -> (f64, f64) {
    let max_t = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(0.0, f64::max)
        .max(1e-3);
    let max_y = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        .max(1.0);
    (max_t, max_y)
}

/// The SVG text of `series`.
pub fn svg(title: &str, series: &[Series]) -> String {
    let (max_t, max_y) = extent(series);
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x = |t: f64| LEFT + t / max_t * pw;
    let y = |v: f64| TOP + ph - v / max_y * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
         viewBox=\"0 0 {W} {H}\" font-family=\"Verdana, sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">{}</text>",
        W / 2.0,
        esc(title)
    );
    let ystep = nice_step(max_y, 5.0);
    let mut v = 0.0;
    while v <= max_y * 1.0001 {
        let yy = y(v);
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            esc(&human_bytes(v as u64))
        );
        v += ystep;
    }
    let tstep = nice_step(max_t, 8.0);
    let mut t = 0.0;
    while t <= max_t * 1.0001 {
        let xx = x(t);
        let _ = writeln!(
            s,
            "<line x1=\"{xx:.1}\" y1=\"{TOP}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>\
             <text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            TOP + ph,
            TOP + ph + 16.0,
            format_seconds(t, tstep)
        );
        t += tstep;
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">seconds since profiling started</text>",
        LEFT + pw / 2.0,
        H - 26.0
    );
    for (i, ser) in series.iter().enumerate() {
        let color = COLORS[ser.color % COLORS.len()];
        let pts: Vec<String> = ser
            .points
            .iter()
            .map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v)))
            .collect();
        let dash = if ser.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "<polyline class=\"series\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} \
             points=\"{}\"><title>{}</title></polyline>",
            pts.join(" "),
            esc(&ser.label)
        );
        for &(t, v) in &ser.points {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{color}\"><title>{:.3} s: {}</title></circle>",
                x(t),
                y(v),
                t,
                esc(&human_bytes(v as u64))
            );
        }
        let ly = TOP + 14.0 + i as f64 * 16.0;
        let _ = writeln!(
            s,
            "<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" \
             stroke-width=\"2\"{dash}/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            LEFT + 10.0,
            LEFT + 34.0,
            LEFT + 40.0,
            ly + 4.0,
            esc(&ser.label)
        );
    }
    if series.iter().all(|s| s.points.len() <= 2) {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#777\">one dump per \
             process: record with --continuous-dump PERIOD to see the heap over time</text>",
            LEFT + pw / 2.0,
            TOP + ph / 2.0
        );
    }
    s.push_str("</svg>\n");
    s
}

fn format_seconds(t: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{t:.0}")
    } else if step >= 0.1 {
        format!("{t:.1}")
    } else {
        format!("{t:.2}")
    }
}

/// Writes the plot of the heaps `filter` selects.
pub fn write_timeline_svg(
    data: &TraceData,
    filter: &Filter,
    title: &str,
    mut out: impl Write,
) -> std::io::Result<()> {
    out.write_all(svg(title, &series(data, filter)).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_nice() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(3.0, 8.0), 0.5);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
    }

    #[test]
    fn svg_has_a_line_per_series() {
        let s = svg(
            "t <&>",
            &[Series {
                label: "a".into(),
                points: vec![(0.0, 0.0), (1.0, 100.0), (2.0, 10.0)],
                dashed: false,
                color: 0,
            }],
        );
        assert!(s.contains("t &lt;&amp;&gt;"));
        assert_eq!(s.matches("<polyline").count(), 1);
        assert_eq!(s.matches("<circle").count(), 3);
    }
}
