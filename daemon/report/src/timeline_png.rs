//! `convert --timeline-png`: the plot of `convert --timeline-svg` as a PNG
//! for places that show no SVG (chat, issue trackers). The same series and
//! scales drawn into an RGB buffer: grid lines at the SVG's ticks, axes
//! with tick marks, one 2-pixel polyline per series (resident set size
//! dashed) and a colour swatch per series at the top left. It has no text:
//! the SVG carries the labels.

use std::io::{self, Write};

use heapprofd_model::trace::TraceData;

use crate::filter::Filter;
use crate::timeline_svg::{COLORS, Series, extent, nice_step, series};

/// Width of the image, pixels.
pub const WIDTH: u32 = 960;
/// Height of the image, pixels.
pub const HEIGHT: u32 = 420;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 40.0;
const BACKGROUND: [u8; 3] = [255, 255, 255];
const GRID: [u8; 3] = [225, 225, 225];
const AXIS: [u8; 3] = [90, 90, 90];
/// Dash pattern of dashed series: pixels on, pixels off.
const DASH: (f64, f64) = (6.0, 4.0);

/// An RGB image being drawn.
struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn new() -> Canvas {
        Canvas {
            px: BACKGROUND.repeat((WIDTH * HEIGHT) as usize),
        }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if (0..i64::from(WIDTH)).contains(&x) && (0..i64::from(HEIGHT)).contains(&y) {
            let i = (y as usize * WIDTH as usize + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    /// A line from (x0, y0) to (x1, y1), `width` pixels thick; dashed lines
    /// continue the pattern from `dashed` (the length drawn so far), and
    /// the new length is returned.
    fn line(
        &mut self,
        from: (f64, f64),
        to: (f64, f64),
        c: [u8; 3],
        width: i64,
        dashed: Option<f64>,
    ) -> f64 {
        let (dx, dy) = (to.0 - from.0, to.1 - from.1);
        let len = dx.hypot(dy);
        let steps = dx.abs().max(dy.abs()).ceil().max(1.0) as usize;
        let start = dashed.unwrap_or(0.0);
        for i in 0..=steps {
            let f = i as f64 / steps as f64;
            if dashed.is_some() && (start + f * len) % (DASH.0 + DASH.1) >= DASH.0 {
                continue;
            }
            let (x, y) = (
                (from.0 + f * dx).round() as i64,
                (from.1 + f * dy).round() as i64,
            );
            for w in 0..width {
                // Thicken across the line's main direction.
                if dx.abs() >= dy.abs() {
                    self.set(x, y + w, c);
                } else {
                    self.set(x + w, y, c);
                }
            }
        }
        start + len
    }
}

/// "#rrggbb" as RGB.
fn rgb(hex: &str) -> [u8; 3] {
    let c = |i: usize| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("00"), 16).unwrap_or(0);
    [c(1), c(3), c(5)]
}

/// The RGB pixels (row by row, `WIDTH` × `HEIGHT`) of `series`.
pub fn pixels(series: &[Series]) -> Vec<u8> {
    let (max_t, max_y) = extent(series);
    let (w, h) = (f64::from(WIDTH), f64::from(HEIGHT));
    let (pw, ph) = (w - LEFT - RIGHT, h - TOP - BOTTOM);
    let (x, y) = (
        |t: f64| LEFT + t / max_t * pw,
        |v: f64| TOP + ph - v / max_y * ph,
    );
    let mut c = Canvas::new();
    let ystep = nice_step(max_y, 5.0);
    let mut v = 0.0;
    while v <= max_y * 1.0001 {
        c.line((LEFT, y(v)), (w - RIGHT, y(v)), GRID, 1, None);
        c.line((LEFT - 6.0, y(v)), (LEFT, y(v)), AXIS, 1, None);
        v += ystep;
    }
    let tstep = nice_step(max_t, 8.0);
    let mut t = 0.0;
    while t <= max_t * 1.0001 {
        c.line((x(t), TOP), (x(t), TOP + ph), GRID, 1, None);
        c.line((x(t), TOP + ph), (x(t), TOP + ph + 6.0), AXIS, 1, None);
        t += tstep;
    }
    c.line((LEFT, TOP), (LEFT, TOP + ph), AXIS, 1, None);
    c.line((LEFT, TOP + ph), (w - RIGHT, TOP + ph), AXIS, 1, None);
    for (i, s) in series.iter().enumerate() {
        let color = rgb(COLORS[s.color % COLORS.len()]);
        let mut dashed = s.dashed.then_some(0.0);
        for p in s.points.windows(2) {
            let done = c.line(
                (x(p[0].0), y(p[0].1)),
                (x(p[1].0), y(p[1].1)),
                color,
                2,
                dashed,
            );
            dashed = dashed.map(|_| done);
        }
        let ly = 12.0 + i as f64 * 6.0;
        let dash = s.dashed.then_some(0.0);
        c.line((LEFT + 10.0, ly), (LEFT + 34.0, ly), color, 2, dash);
    }
    c.px
}

/// Writes the PNG of `series`.
pub fn png(series: &[Series], out: impl Write) -> io::Result<()> {
    let mut enc = png::Encoder::new(out, WIDTH, HEIGHT);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(io::Error::other)?;
    w.write_image_data(&pixels(series))
        .map_err(io::Error::other)?;
    w.finish().map_err(io::Error::other)
}

/// Writes the plot of the heaps `filter` selects.
pub fn write_timeline_png(data: &TraceData, filter: &Filter, out: impl Write) -> io::Result<()> {
    png(&series(data, filter), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rise_and_fall() -> Vec<Series> {
        vec![Series {
            label: "a".into(),
            points: vec![(0.0, 0.0), (1.0, 100.0), (2.0, 10.0)],
            dashed: false,
            color: 0,
        }]
    }

    #[test]
    fn the_png_decodes_and_shows_the_rise_and_the_fall() {
        let mut bytes = Vec::new();
        png(&rise_and_fall(), &mut bytes).unwrap();
        let mut dec = png::Decoder::new(io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        let mut img = vec![0; dec.output_buffer_size().unwrap()];
        let info = dec.next_frame(&mut img).unwrap();
        assert_eq!((info.width, info.height), (WIDTH, HEIGHT));
        assert_eq!(info.color_type, png::ColorType::Rgb);
        let red = rgb(COLORS[0]);
        let at = |x: f64, y: f64| {
            let i = (y.round() as usize * WIDTH as usize + x.round() as usize) * 3;
            [img[i], img[i + 1], img[i + 2]]
        };
        // Rows of the series' colour in the column at seconds `t`.
        let rows_at = |t: f64| -> Vec<f64> {
            let x = LEFT + t / 2.0 * (f64::from(WIDTH) - LEFT - RIGHT);
            (0..HEIGHT)
                .map(f64::from)
                .filter(|&y| at(x, y) == red)
                .collect()
        };
        let ph = f64::from(HEIGHT) - TOP - BOTTOM;
        let y = |v: f64| TOP + ph - v / 100.0 * ph;
        // Halfway up the rise (50), halfway down the fall (55), the peak.
        for (t, v) in [(0.5, 50.0), (1.5, 55.0), (1.0, 100.0)] {
            let rows = rows_at(t);
            assert!(!rows.is_empty(), "no line at {t} s");
            assert!(
                rows.iter().all(|r| (r - y(v)).abs() <= 3.0),
                "{t} s: {rows:?} want {}",
                y(v)
            );
        }
        // Above the line (0.6 s, 85; off the grid lines): background.
        assert_eq!(
            at(LEFT + 0.3 * (f64::from(WIDTH) - LEFT - RIGHT), y(85.0)),
            BACKGROUND
        );
    }

    #[test]
    fn dashed_lines_have_gaps() {
        let mut s = rise_and_fall();
        s[0].dashed = true;
        let solid: usize = pixels(&rise_and_fall())
            .chunks(3)
            .filter(|p| *p == rgb(COLORS[0]))
            .count();
        let dashed = pixels(&s)
            .chunks(3)
            .filter(|p| *p == rgb(COLORS[0]))
            .count();
        assert!(
            dashed * 10 < solid * 8 && dashed * 10 > solid * 4,
            "{dashed} of {solid}"
        );
    }
}
