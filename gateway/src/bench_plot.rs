//! The throughput–latency plot of `bench serve --sweep` and `bench plot` (ringserve beside `vllm
//! bench serve` results), drawn as a PNG with plotters.
//!
//! Text needs a TrueType font; plotters is built without system font discovery (which would need
//! fontconfig), so the font file is read at run time from `RINGSERVE_FONT` or a few usual paths.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::bench::{BenchReport, Percentiles};

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

/// A run of `vllm bench serve --save-result` (its result JSON) as a [`BenchReport`]: the request
/// rate, output throughput, and the TTFT and ITL median and p99 (`median_*_ms`, `p99_*_ms`; the
/// means too). Fields it lacks stay 0; an error names the first required one missing.
pub fn report_from_vllm(v: &serde_json::Value) -> Result<BenchReport, String> {
    let num = |key: &str| -> Result<f64, String> {
        v.get(key)
            .and_then(serde_json::Value::as_f64)
            .ok_or_else(|| {
                format!("no number `{key}` (is this a `vllm bench serve --save-result` file?)")
            })
    };
    let opt = |key: &str| {
        v.get(key)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0)
    };
    let pct = |metric: &str| -> Result<Percentiles, String> {
        Ok(Percentiles {
            mean: opt(&format!("mean_{metric}_ms")),
            p50: num(&format!("median_{metric}_ms"))?,
            p90: opt(&format!("p90_{metric}_ms")),
            p99: num(&format!("p99_{metric}_ms"))?,
        })
    };
    Ok(BenchReport {
        mode: "open".into(),
        request_rate: v.get("request_rate").and_then(serde_json::Value::as_f64),
        num_requests: opt("num_prompts") as usize,
        completed: opt("completed") as usize,
        duration_s: opt("duration"),
        output_tokens: opt("total_output_tokens") as u64,
        input_tokens: opt("total_input_tokens") as u64,
        requests_per_s: opt("request_throughput"),
        output_tokens_per_s: num("output_throughput")?,
        ttft_ms: pct("ttft")?,
        itl_ms: pct("itl")?,
        ..BenchReport::default()
    })
}

/// One system's runs in a comparison plot.
pub struct System<'a> {
    pub name: &'a str,
    pub runs: &'a [BenchReport],
}

/// A panel of the comparison plot: its y-axis label and the latency it reads from a report.
type Panel = (&'static str, fn(&BenchReport) -> &Percentiles);

/// The systems' colours, in order.
const PALETTE: [RGBColor; 4] = [BLUE, RED, GREEN, MAGENTA];

/// The plot people compare serving systems by: for each system, TTFT (left) and inter-token
/// latency (right), p50 (circles) and p99 (triangles), against output throughput, one point per run
/// (request rate), each system in its colour (blue, red, green, magenta, in order).
pub fn plot_compare(systems: &[System<'_>], title: &str, out: &Path) -> Result<(), PlotError> {
    load_font()?;
    let root = BitMapBackend::new(out, (1400, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let root = root.titled(title, ("sans-serif", 24)).map_err(draw_err)?;
    let panels = root.split_evenly((1, 2));
    let max_x = systems
        .iter()
        .flat_map(|s| s.runs.iter().map(|r| r.output_tokens_per_s))
        .fold(1.0, f64::max)
        * 1.1;
    let panel_specs: [Panel; 2] = [
        ("TTFT (ms)", |r| &r.ttft_ms),
        ("inter-token latency (ms)", |r| &r.itl_ms),
    ];
    for (area, (y_desc, metric)) in panels.iter().zip(panel_specs) {
        let max_y = systems
            .iter()
            .flat_map(|s| s.runs.iter().map(|r| metric(r).p99))
            .fold(1.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..max_x, 0.0..max_y)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("output tokens/s")
            .y_desc(y_desc)
            .draw()
            .map_err(draw_err)?;
        for (sys, &color) in systems.iter().zip(PALETTE.iter().cycle()) {
            for (q, pick) in [("p50", 0), ("p99", 1)] {
                let mut points: Vec<(f64, f64)> = sys
                    .runs
                    .iter()
                    .map(|r| {
                        let p = metric(r);
                        (r.output_tokens_per_s, if pick == 0 { p.p50 } else { p.p99 })
                    })
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                let width = if pick == 0 { 3 } else { 1 };
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(width)))
                    .map_err(draw_err)?
                    .label(format!("{} {q}", sys.name))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width))
                    });
                if pick == 0 {
                    chart
                        .draw_series(points.iter().map(|&p| Circle::new(p, 5, color.filled())))
                        .map_err(draw_err)?;
                } else {
                    chart
                        .draw_series(
                            points
                                .iter()
                                .map(|&p| TriangleMarker::new(p, 6, color.filled())),
                        )
                        .map_err(draw_err)?;
                }
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(draw_err)?;
    }
    root.present().map_err(draw_err)?;
    Ok(())
}

/// The ring stress test over time (`bench ring --stress --plot`): records/s of all pairs (top) and
/// the round trip's p50, p99 and max per interval on a log scale (bottom).
pub fn plot_ring_stress(
    report: &ringbuf::bench::stress::StressReport,
    title: &str,
    out: &Path,
) -> Result<(), PlotError> {
    load_font()?;
    let root = BitMapBackend::new(out, (1200, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let root = root.titled(title, ("sans-serif", 24)).map_err(draw_err)?;
    let panels = root.split_evenly((2, 1));
    let series = &report.series;
    let max_t = series.last().map_or(1.0, |p| p.t).max(1.0);
    let max_rate = series
        .iter()
        .map(|p| p.records_per_s / 1e6)
        .fold(0.1, f64::max)
        * 1.1;
    let mut top = ChartBuilder::on(&panels[0])
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_t, 0.0..max_rate)
        .map_err(draw_err)?;
    top.configure_mesh()
        .x_desc("seconds")
        .y_desc("M records/s (all pairs)")
        .draw()
        .map_err(draw_err)?;
    top.draw_series(LineSeries::new(
        series.iter().map(|p| (p.t, p.records_per_s / 1e6)),
        BLUE.stroke_width(2),
    ))
    .map_err(draw_err)?;
    let lat: Vec<_> = series.iter().filter(|p| p.latency.count > 0).collect();
    let us = |ns: u64| (ns as f64 / 1e3).max(0.01);
    let max_us = lat.iter().map(|p| us(p.latency.max)).fold(1.0, f64::max) * 2.0;
    let min_us = lat.iter().map(|p| us(p.latency.p50)).fold(max_us, f64::min) / 2.0;
    let mut bottom = ChartBuilder::on(&panels[1])
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_t, (min_us..max_us).log_scale())
        .map_err(draw_err)?;
    bottom
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("round trip under load (µs)")
        .draw()
        .map_err(draw_err)?;
    type Pick = fn(&ringbuf::bench::stress::Percentiles) -> u64;
    let lines: [(&str, Pick, RGBColor); 3] = [
        ("p50", |q| q.p50, BLUE),
        ("p99", |q| q.p99, RED),
        ("max", |q| q.max, BLACK),
    ];
    for (name, pick, color) in lines {
        bottom
            .draw_series(LineSeries::new(
                lat.iter().map(|p| (p.t, us(pick(&p.latency)))),
                color.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    bottom
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(draw_err)?;
    root.present().map_err(draw_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_one_system_when_a_font_is_available() {
        let reports: Vec<BenchReport> = (1..=3)
            .map(|i| BenchReport {
                output_tokens_per_s: 100.0 * f64::from(i),
                ttft_ms: Percentiles {
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
        let systems = [System {
            name: "ringserve",
            runs: &reports,
        }];
        match plot_compare(&systems, "test", &out) {
            Ok(()) => {
                let bytes = std::fs::read(&out).unwrap();
                assert_eq!(&bytes[1..4], b"PNG");
            }
            // Machines without any font get the typed error, never a panic.
            Err(e) => assert!(matches!(e, PlotError::NoFont(_)), "{e}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_vllm_results_and_draws_both_systems() {
        let v = serde_json::json!({
            "request_rate": 16.0, "num_prompts": 400, "completed": 400, "duration": 25.3,
            "total_input_tokens": 204800, "total_output_tokens": 51200,
            "request_throughput": 15.8, "output_throughput": 2023.5,
            "mean_ttft_ms": 50.0, "median_ttft_ms": 43.0, "p99_ttft_ms": 120.0,
            "mean_itl_ms": 11.0, "median_itl_ms": 10.3, "p99_itl_ms": 29.0,
        });
        let r = report_from_vllm(&v).unwrap();
        assert_eq!(r.request_rate, Some(16.0));
        assert_eq!(
            (r.ttft_ms.p50, r.ttft_ms.p99, r.itl_ms.p50),
            (43.0, 120.0, 10.3)
        );
        assert_eq!(r.output_tokens_per_s, 2023.5);
        let missing = serde_json::json!({"output_throughput": 1.0});
        assert!(
            report_from_vllm(&missing)
                .unwrap_err()
                .contains("median_ttft_ms")
        );
        let ours = vec![BenchReport {
            output_tokens_per_s: 2100.0,
            ttft_ms: Percentiles {
                p50: 40.0,
                p99: 90.0,
                ..Percentiles::default()
            },
            itl_ms: Percentiles {
                p50: 11.0,
                p99: 40.0,
                ..Percentiles::default()
            },
            ..BenchReport::default()
        }];
        let peer = vec![r];
        let dir = std::env::temp_dir().join(format!("rs-cmp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("cmp.png");
        let systems = [
            System {
                name: "ringserve",
                runs: &ours,
            },
            System {
                name: "vLLM",
                runs: &peer,
            },
        ];
        match plot_compare(&systems, "test", &out) {
            Ok(()) => assert_eq!(&std::fs::read(&out).unwrap()[1..4], b"PNG"),
            Err(e) => assert!(matches!(e, PlotError::NoFont(_)), "{e}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
