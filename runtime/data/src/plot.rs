//! Learning curves as PNG with no plotting dependency: lines on a grid, axis labels with units, tick
//! values, a legend and a title, in the public-domain 8x8 bitmap font of the `font8x8` crate.

use font8x8::UnicodeFonts;

/// A held-out figure to mark across the plot: the rate and its interval, in [0, 1].
#[derive(Clone, Debug)]
pub struct Band {
    /// The rate.
    pub rate: f64,
    /// Lower end of the interval.
    pub low: f64,
    /// Upper end of the interval.
    pub high: f64,
    /// Its legend entry.
    pub label: String,
}

/// One curve: values in [0, 1], one per episode.
pub struct Series<'a> {
    /// Legend entry.
    pub label: &'a str,
    /// Values.
    pub values: &'a [f64],
    /// Colour.
    pub rgb: [u8; 3],
}

/// What the picture shows.
pub struct Chart<'a> {
    /// Title, top left.
    pub title: &'a str,
    /// Label of the horizontal axis (episodes, 1-based).
    pub x_label: &'a str,
    /// Label of the vertical axis (a rate, shown in %).
    pub y_label: &'a str,
    /// The curves.
    pub series: &'a [Series<'a>],
    /// A held-out figure drawn across the plot: the rate dashed over its interval, shaded.
    pub band: Option<Band>,
}

const INK: [u8; 3] = [40, 40, 40];
const GRID: [u8; 3] = [225, 225, 225];

struct Canvas {
    w: usize,
    h: usize,
    rgb: Vec<u8>,
}

impl Canvas {
    fn put(&mut self, x: usize, y: usize, c: [u8; 3]) {
        if x < self.w && y < self.h {
            let i = (y * self.w + x) * 3;
            self.rgb[i..i + 3].copy_from_slice(&c);
        }
    }

    fn is_white(&self, x: usize, y: usize) -> bool {
        x < self.w && y < self.h && self.rgb[(y * self.w + x) * 3] == 255
    }

    /// `s` with its top-left corner at (x, y), each font pixel `scale` pixels wide.
    fn text(&mut self, x: usize, y: usize, s: &str, c: [u8; 3], scale: usize) {
        for (k, ch) in s.chars().enumerate() {
            let glyph = font8x8::BASIC_FONTS.get(ch).unwrap_or([0; 8]);
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        for dy in 0..scale {
                            for dx in 0..scale {
                                let px = x + (k * 8 + col) * scale + dx;
                                self.put(px, y + row * scale + dy, c);
                            }
                        }
                    }
                }
            }
        }
    }

    fn hline(&mut self, x0: usize, x1: usize, y: usize, c: [u8; 3]) {
        for x in x0..=x1 {
            self.put(x, y, c);
        }
    }

    fn vline(&mut self, x: usize, y0: usize, y1: usize, c: [u8; 3]) {
        for y in y0..=y1 {
            self.put(x, y, c);
        }
    }
}

/// Pixel width of `s` in the 8x8 font at scale 1.
fn width(s: &str) -> usize {
    8 * s.chars().count()
}

/// Grid spacing in episodes for `n` episodes: about ten lines, on 1, 2 or 5 times a power of ten.
fn episode_step(n: usize) -> usize {
    let raw = (n as f64 / 10.0).max(1.0);
    let p = 10f64.powf(raw.log10().floor());
    let m = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .find(|m| m * p >= raw)
        .unwrap_or(10.0);
    (m * p) as usize
}

/// Draws `chart` into a PNG at `path` (written atomically).
pub fn curves_png(path: &std::path::Path, chart: &Chart) -> crate::Result<()> {
    let (w, h) = (760usize, 440usize);
    let (left, right, top, bottom) = (64usize, w - 24, 56usize, h - 56);
    let mut cv = Canvas {
        w,
        h,
        rgb: vec![255u8; w * h * 3],
    };
    let n = chart
        .series
        .iter()
        .map(|s| s.values.len())
        .max()
        .unwrap_or(0)
        .max(2);
    let px = |i: f64| left as f64 + i / (n - 1) as f64 * (right - left) as f64;
    let py = |v: f64| bottom as f64 - v.clamp(0.0, 1.0) * (bottom - top) as f64;
    // Grid every 10% (labelled every 20%) and every few episodes (labelled), axes in ink.
    for k in 0..=10 {
        let y = py(k as f64 / 10.0) as usize;
        cv.hline(left, right, y, if k == 0 { INK } else { GRID });
        if k % 2 == 0 {
            let t = format!("{}%", k * 10);
            cv.text(left - 6 - width(&t), y.saturating_sub(4), &t, INK, 1);
        }
    }
    let step = episode_step(n);
    cv.vline(left, top, bottom, INK);
    for e in (step..=n).step_by(step) {
        let x = px((e - 1) as f64) as usize;
        cv.vline(x, top, bottom - 1, GRID);
        let t = e.to_string();
        cv.text(x.saturating_sub(width(&t) / 2), bottom + 6, &t, INK, 1);
    }
    cv.text(left, 10, chart.title, INK, 2);
    cv.text(left, top - 16, chart.y_label, INK, 1);
    cv.text(
        (left + right) / 2 - width(chart.x_label) / 2,
        bottom + 24,
        chart.x_label,
        INK,
        1,
    );
    if let Some(b) = &chart.band {
        // The interval shaded light blue behind the curves, the rate dashed in blue.
        let (t, u) = (py(b.high) as usize, py(b.low) as usize);
        for y in t..=u {
            for x in (left + 1..right).filter(|x| x % 2 == 0) {
                if cv.is_white(x, y) {
                    cv.put(x, y, [215, 230, 250]);
                }
            }
        }
        let y = py(b.rate) as usize;
        for x in (left..right).filter(|x| x % 12 < 8) {
            cv.put(x, y, [40, 90, 200]);
            cv.put(x, y + 1, [40, 90, 200]);
        }
    }
    for s in chart.series {
        let v = s.values;
        for i in 1..v.len() {
            let (x0, y0, x1, y1) = (px((i - 1) as f64), py(v[i - 1]), px(i as f64), py(v[i]));
            let steps = ((x1 - x0).abs().max((y1 - y0).abs()) as usize).max(1) * 2;
            for k in 0..=steps {
                let t = k as f64 / steps as f64;
                let (x, y) = ((x0 + t * (x1 - x0)) as usize, (y0 + t * (y1 - y0)) as usize);
                cv.put(x, y, s.rgb);
                cv.put(x, y + 1, s.rgb);
            }
        }
    }
    legend(&mut cv, chart, right, py(0.7) as usize);
    write_png(path, w as u32, h as u32, &cv.rgb)
}

/// The legend, a framed box whose top-right corner is at (right - 8, top).
fn legend(cv: &mut Canvas, chart: &Chart, right: usize, top: usize) {
    let mut rows: Vec<(&str, [u8; 3], bool)> = chart
        .series
        .iter()
        .map(|s| (s.label, s.rgb, false))
        .collect();
    if let Some(b) = &chart.band {
        rows.push((b.label.as_str(), [40, 90, 200], true));
    }
    let inner = rows.iter().map(|r| width(r.0)).max().unwrap_or(0) + 34;
    let (x0, x1) = (right - 8 - inner, right - 8);
    let y1 = top + 8 + 14 * rows.len();
    for y in top..=y1 {
        for x in x0..=x1 {
            cv.put(x, y, [255, 255, 255]);
        }
    }
    cv.hline(x0, x1, top, INK);
    cv.hline(x0, x1, y1, INK);
    cv.vline(x0, top, y1, INK);
    cv.vline(x1, top, y1, INK);
    for (k, (label, c, dashed)) in rows.iter().enumerate() {
        let y = top + 8 + 14 * k;
        for x in x0 + 6..x0 + 26 {
            if !dashed || (x - x0) % 12 < 8 {
                cv.put(x, y + 3, *c);
                cv.put(x, y + 4, *c);
            }
        }
        cv.text(x0 + 30, y, label, INK, 1);
    }
}

/// Writes an rgb8 image as PNG, atomically.
pub fn write_png(path: &std::path::Path, width: u32, height: u32, rgb: &[u8]) -> crate::Result<()> {
    let mut bytes = Vec::new();
    let encode = |bytes: &mut Vec<u8>| -> Result<(), png::EncodingError> {
        let mut enc = png::Encoder::new(bytes, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.write_header()?.write_image_data(rgb)
    };
    encode(&mut bytes).map_err(|e| {
        crate::DataError::invalid(format!("PNG `{}`", path.display()), e.to_string())
    })?;
    reflex_runtime::fsio::atomic_write(path, &bytes).map_err(|e| crate::DataError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_steps_are_round_numbers() {
        assert_eq!(episode_step(100), 10);
        assert_eq!(episode_step(6), 1);
        assert_eq!(episode_step(30), 5);
        assert_eq!(episode_step(250), 50);
        assert_eq!(episode_step(1000), 100);
    }

    #[test]
    fn text_is_drawn_where_asked() {
        let mut cv = Canvas {
            w: 40,
            h: 12,
            rgb: vec![255; 40 * 12 * 3],
        };
        cv.text(2, 2, "1", INK, 1);
        let inked = |x0: usize, x1: usize| (x0..x1).any(|x| (0..12).any(|y| !cv.is_white(x, y)));
        assert!(inked(2, 10), "the glyph is inside its cell");
        assert!(!inked(10, 40), "nothing outside it");
    }
}
