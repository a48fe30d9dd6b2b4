//! Learning curves as PNG without a font or plotting dependency: lines on a grid. The legend is
//! the file's own caption in the run summary and docs/training.md (green: success rate, red:
//! intervention rate, both over the last 20 episodes; grid: every 10% and every 10 episodes;
//! blue, when given: the held-out success rate as a dashed line over its 95% interval, shaded).

/// A held-out figure to mark across the plot: the rate and its interval, in [0, 1].
#[derive(Clone, Copy, Debug)]
pub struct Band {
    /// The rate.
    pub rate: f64,
    /// Lower end of the interval.
    pub low: f64,
    /// Upper end of the interval.
    pub high: f64,
}

/// Draws `series` (values in [0, 1], one per episode, each with an RGB colour) into a PNG, with
/// `held_out` marked across it when given.
pub fn curves_png(
    path: &std::path::Path,
    series: &[(&[f64], [u8; 3])],
    held_out: Option<Band>,
) -> crate::error::Result<()> {
    let (w, h, m) = (640usize, 360usize, 30usize);
    let mut img = vec![255u8; w * h * 3];
    let put = |img: &mut Vec<u8>, x: usize, y: usize, c: [u8; 3]| {
        if x < w && y < h {
            img[(y * w + x) * 3..(y * w + x) * 3 + 3].copy_from_slice(&c);
        }
    };
    let n = series.iter().map(|s| s.0.len()).max().unwrap_or(0).max(2);
    let px = |i: f64| m as f64 + i / (n - 1) as f64 * (w - 2 * m) as f64;
    let py = |v: f64| (h - m) as f64 - v.clamp(0.0, 1.0) * (h - 2 * m) as f64;
    // Grid: every 10% and every 10 episodes; axes darker.
    for k in 0..=10 {
        let y = py(k as f64 / 10.0) as usize;
        for x in m..w - m {
            put(
                &mut img,
                x,
                y,
                if k == 0 {
                    [60, 60, 60]
                } else {
                    [225, 225, 225]
                },
            );
        }
    }
    for e in (0..n).step_by(10) {
        let x = px(e as f64) as usize;
        for y in m..h - m {
            put(
                &mut img,
                x,
                y,
                if e == 0 {
                    [60, 60, 60]
                } else {
                    [225, 225, 225]
                },
            );
        }
    }
    if let Some(b) = held_out {
        // The interval shaded light blue behind the curves, the rate dashed in blue.
        let (top, bottom) = (py(b.high) as usize, py(b.low) as usize);
        for y in top..=bottom {
            for x in (m + 1..w - m).filter(|x| x % 2 == 0) {
                if img[(y * w + x) * 3] == 255 {
                    put(&mut img, x, y, [215, 230, 250]);
                }
            }
        }
        let y = py(b.rate) as usize;
        for x in (m..w - m).filter(|x| x % 12 < 8) {
            for dy in 0..2 {
                put(&mut img, x, y + dy, [40, 90, 200]);
            }
        }
    }
    for (vals, c) in series {
        for i in 1..vals.len() {
            let (x0, y0, x1, y1) = (
                px((i - 1) as f64),
                py(vals[i - 1]),
                px(i as f64),
                py(vals[i]),
            );
            let steps = ((x1 - x0).abs().max((y1 - y0).abs()) as usize).max(1) * 2;
            for s in 0..=steps {
                let t = s as f64 / steps as f64;
                let (x, y) = ((x0 + t * (x1 - x0)) as usize, (y0 + t * (y1 - y0)) as usize);
                for dy in 0..2 {
                    put(&mut img, x, y + dy, *c);
                }
            }
        }
    }
    write_png(path, w as u32, h as u32, &img)
}

/// Writes an rgb8 image as PNG, atomically.
pub fn write_png(
    path: &std::path::Path,
    width: u32,
    height: u32,
    rgb: &[u8],
) -> crate::error::Result<()> {
    let mut bytes = Vec::new();
    let encode = |bytes: &mut Vec<u8>| -> Result<(), png::EncodingError> {
        let mut enc = png::Encoder::new(bytes, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.write_header()?.write_image_data(rgb)
    };
    encode(&mut bytes).map_err(|e| {
        crate::AgentError::setup(format!("PNG `{}`", path.display()), e.to_string())
    })?;
    reflex_runtime::fsio::atomic_write(path, &bytes).map_err(|e| crate::AgentError::io(path, e))
}
