//! Learning curves as PNG: plotters draws the lines, grid, labelled axes, legend and title into an
//! RGB buffer, with DejaVu Sans (embedded from the `dejavu` crate, so no system font is needed);
//! [`write_png`] encodes it.

use plotters::prelude::*;
use std::sync::OnceLock;

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

const INK: RGBColor = RGBColor(40, 40, 40);
const GRID: RGBColor = RGBColor(225, 225, 225);
const BAND: RGBColor = RGBColor(40, 90, 200);
const SHADE: RGBColor = RGBColor(215, 230, 250);
/// The font family the chart's text is drawn in (DejaVu Sans, registered once per process).
const FONT: &str = "sans-serif";

fn register_font() -> crate::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "DejaVu Sans is not a font ab_glyph can read".to_string())
    })
    .clone()
    .map_err(|e| crate::DataError::invalid("the plot font (DejaVu Sans)", e))
}

/// Draws `chart` into a PNG at `path` (written atomically).
pub fn curves_png(path: &std::path::Path, chart: &Chart) -> crate::Result<()> {
    let (w, h) = (760u32, 440u32);
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    draw(&mut rgb, (w, h), chart)
        .map_err(|e| crate::DataError::invalid(format!("plot `{}`", path.display()), e))?;
    write_png(path, w, h, &rgb)
}

fn draw(rgb: &mut [u8], size: (u32, u32), chart: &Chart) -> Result<(), String> {
    register_font().map_err(|e| e.to_string())?;
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    let root = BitMapBackend::with_buffer(rgb, size).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    // Episodes are 1-based; a single episode still gets an axis one episode wide.
    let n = chart
        .series
        .iter()
        .map(|s| s.values.len())
        .max()
        .unwrap_or(0)
        .max(2) as f64;
    let mut c = ChartBuilder::on(&root)
        .caption(chart.title, (FONT, 22).into_font().color(&INK))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(1f64..n, 0f64..1f64)
        .map_err(e)?;
    c.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .x_labels(10)
        .y_labels(6)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
        .label_style((FONT, 13).into_font().color(&INK))
        .axis_style(INK)
        .bold_line_style(GRID)
        .light_line_style(WHITE)
        .draw()
        .map_err(e)?;
    if let Some(b) = &chart.band {
        // The interval shaded behind the curves, the rate dashed across.
        let (lo, hi) = (b.low.clamp(0.0, 1.0), b.high.clamp(0.0, 1.0));
        c.draw_series(std::iter::once(Rectangle::new(
            [(1.0, lo), (n, hi)],
            SHADE.filled(),
        )))
        .map_err(e)?;
        c.draw_series(DashedLineSeries::new(
            [(1.0, b.rate), (n, b.rate)],
            8,
            4,
            BAND.stroke_width(2),
        ))
        .map_err(e)?
        .label(b.label.as_str())
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BAND.stroke_width(2)));
    }
    for s in chart.series {
        let colour = RGBColor(s.rgb[0], s.rgb[1], s.rgb[2]);
        let points = s
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| ((i + 1) as f64, v.clamp(0.0, 1.0)));
        c.draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(e)?
            .label(s.label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FONT, 13).into_font().color(&INK))
        .background_style(WHITE)
        .border_style(INK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
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

    fn pixels(p: &std::path::Path) -> (u32, u32, Vec<u8>) {
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(p).unwrap()));
        let mut r = dec.read_info().unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        (info.width, info.height, buf[..info.buffer_size()].to_vec())
    }

    #[test]
    fn the_curves_the_band_and_the_text_are_drawn() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("curve.png");
        let values: Vec<f64> = (0..40).map(|i| i as f64 / 40.0).collect();
        curves_png(
            &p,
            &Chart {
                title: "learning",
                x_label: "episode",
                y_label: "success rate",
                series: &[Series {
                    label: "robot",
                    values: &values,
                    rgb: [30, 160, 60],
                }],
                band: Some(Band {
                    rate: 0.9,
                    low: 0.8,
                    high: 0.95,
                    label: "held out".into(),
                }),
            },
        )
        .unwrap();
        let (w, h, rgb) = pixels(&p);
        assert_eq!((w, h), (760, 440));
        let count = |c: [u8; 3]| rgb.chunks(3).filter(|px| *px == c).count();
        assert!(count([30, 160, 60]) > 200, "the curve");
        assert!(count([40, 90, 200]) > 100, "the dashed rate");
        assert!(count([215, 230, 250]) > 1000, "the shaded interval");
        // The title is text: dark pixels in the band above the plot, which nothing else draws.
        let title_ink = (0..40u32)
            .flat_map(|y| (0..w).map(move |x| ((y * w + x) * 3) as usize))
            .filter(|&i| rgb[i] < 128 && rgb[i + 1] < 128 && rgb[i + 2] < 128)
            .count();
        assert!(
            title_ink > 30,
            "the title was drawn: {title_ink} dark pixels"
        );
    }
}
