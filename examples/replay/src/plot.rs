//! PNG charts (plotters, no external tools): token hit ratio and TTFT p95 over time, one line
//! per policy, fleet events (scale-up, restarts) as vertical grey lines. When no system font
//! can be loaded, the charts are drawn without text rather than not at all.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;

use crate::outcome::SeriesPoint;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

type Series = BTreeMap<String, Vec<SeriesPoint>>;

/// Which figure of a point a chart draws.
type Figure = fn(&SeriesPoint) -> f64;

/// Writes `token_hit_ratio.png` and `ttft_p95.png` into `dir`.
pub fn write_charts(dir: &Path, series: &Series, events: &[f64]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("--plot: {}: {e}", dir.display()))?;
    let charts: [(&str, &str, Figure); 2] = [
        ("token_hit_ratio.png", "token hit ratio", |p| {
            p.token_hit_ratio
        }),
        ("ttft_p95.png", "TTFT p95 (ms)", |p| p.ttft_p95_ms),
    ];
    for (file, title, value) in charts {
        let path = dir.join(file);
        if draw(&path, title, series, events, value, true).is_err() {
            draw(&path, title, series, events, value, false)
                .map_err(|e| format!("--plot: {}: {e}", path.display()))?;
        }
    }
    Ok(())
}

fn draw(
    path: &Path,
    title: &str,
    series: &Series,
    events: &[f64],
    value: Figure,
    text: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let points = series.values().flatten();
    let x_max = points.clone().map(|p| p.t_s).fold(1.0, f64::max) * 1.02;
    let y_max = points.map(value).fold(0.0, f64::max).max(1e-9) * 1.1;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if text {
        builder
            .caption(format!("{title} over time"), ("sans-serif", 22))
            .x_label_area_size(40)
            .y_label_area_size(70);
    }
    let mut chart = builder.build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("trace time (s)").y_desc(title);
    } else {
        mesh.disable_x_mesh()
            .disable_y_mesh()
            .x_labels(0)
            .y_labels(0);
    }
    mesh.draw()?;
    for &at in events {
        chart.draw_series(LineSeries::new(
            [(at, 0.0), (at, y_max)],
            ShapeStyle::from(&RGBColor(150, 150, 150)).stroke_width(2),
        ))?;
    }
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let drawn = chart.draw_series(LineSeries::new(
            pts.iter().map(|p| (p.t_s, value(p))),
            ShapeStyle::from(&color).stroke_width(2),
        ))?;
        if text {
            drawn
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
        }
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
