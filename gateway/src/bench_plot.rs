//! The throughput–latency curve of a `bench serve --sweep`, drawn as a PNG with plotters.
//!
//! Text needs a TrueType font; plotters is built without system font discovery (which would need
//! fontconfig), so the font file is read at run time from `RINGSERVE_FONT` or a few usual paths.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::bench::BenchReport;

/// Font files tried when `RINGSERVE_FONT` is not set.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// The plot could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error(
        "no TrueType font found (tried {0}); set RINGSERVE_FONT to a .ttf file to draw the plot"
    )]
    NoFont(String),
    #[error("{0}")]
    Draw(String),
}

/// One curve of the plot: its label, colour, and the latency it reads from a report.
type Series = (&'static str, RGBColor, fn(&BenchReport) -> f64);
fn load_font() -> Result<(), PlotError> {
    let candidates: Vec<PathBuf> = match std::env::var_os("RINGSERVE_FONT") {
        Some(p) => vec![PathBuf::from(p)],
        None => FONT_PATHS.iter().map(PathBuf::from).collect(),
    };
    for path in &candidates {
        if let Ok(bytes) = std::fs::read(path) {
            // plotters keeps registered fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Ok(());
            }
        }
    }
    let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(PlotError::NoFont(tried.join(", ")))
}

fn draw_err(e: impl std::fmt::Display) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// Draws end-to-end latency (p50, p99) and TTFT p99 against output throughput, one point per run.
pub fn plot(reports: &[BenchReport], title: &str, out: &Path) -> Result<(), PlotError> {
    load_font()?;
    let root = BitMapBackend::new(out, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let max_x = reports
        .iter()
        .map(|r| r.output_tokens_per_s)
        .fold(1.0, f64::max)
        * 1.1;
    let max_y = reports
        .iter()
        .flat_map(|r| [r.e2e_ms.p99, r.ttft_ms.p99])
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("output tokens/s")
        .y_desc("latency (ms)")
        .draw()
        .map_err(draw_err)?;
    let series: [Series; 3] = [
        ("E2E p50", BLUE, |r| r.e2e_ms.p50),
        ("E2E p99", RED, |r| r.e2e_ms.p99),
        ("TTFT p99", GREEN, |r| r.ttft_ms.p99),
    ];
    for (name, color, y) in series {
        let points: Vec<(f64, f64)> = reports
            .iter()
            .map(|r| (r.output_tokens_per_s, y(r)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(draw_err)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(draw_err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(draw_err)?;
    root.present().map_err(draw_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Percentiles;

    #[test]
    fn draws_a_png_when_a_font_is_available() {
        let reports: Vec<BenchReport> = (1..=3)
            .map(|i| BenchReport {
                output_tokens_per_s: 100.0 * f64::from(i),
                e2e_ms: Percentiles {
                    mean: 10.0,
                    p50: 10.0 * f64::from(i),
                    p90: 20.0,
                    p99: 30.0 * f64::from(i),
                },
                ..BenchReport::default()
            })
            .collect();
        let dir = std::env::temp_dir().join(format!("rs-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("sweep.png");
        match plot(&reports, "test", &out) {
            Ok(()) => {
                let bytes = std::fs::read(&out).unwrap();
                assert_eq!(&bytes[1..4], b"PNG");
            }
            // Machines without any font get the typed error, never a panic.
            Err(e) => assert!(matches!(e, PlotError::NoFont(_)), "{e}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
