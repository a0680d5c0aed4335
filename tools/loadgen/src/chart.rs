//! The demo's PNG chart: requests/s, p99 latency and Redis stock over the same time axis.
//!
//! Text uses DejaVu Sans compiled in (the `dejavu` crate) through plotters' `ab_glyph`
//! backend, so the chart renders the same on a machine with no system fonts.

use crate::load::Second;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

/// One Redis stock sample: seconds since the crowd started (negative before), units left.
#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StockSample {
    pub t: f64,
    pub stock: i64,
}

fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
        let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold());
    });
}

/// Draws the three panels into `path` (PNG, 1200×900).
pub fn draw(
    path: &Path,
    title: &str,
    timeline: &[Second],
    stock: &[StockSample],
    total_stock: i64,
) -> anyhow::Result<()> {
    register_fonts();
    let root = BitMapBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(title, ("sans-serif", 24).into_font().style(FontStyle::Bold))
        .map_err(err)?;
    let panels = root.split_evenly((3, 1));

    // The crowd's seconds are centred on their middle (second 0 covers 0.0-1.0 s).
    let t_end = stock
        .iter()
        .map(|s| s.t)
        .chain(timeline.last().map(|s| s.second as f64 + 1.0))
        .fold(1.0_f64, f64::max);
    let t_start = stock.iter().map(|s| s.t).fold(0.0_f64, f64::min);

    let rps: Vec<(f64, f64)> = timeline
        .iter()
        .map(|s| (s.second as f64 + 0.5, s.requests as f64))
        .collect();
    let accepted: Vec<(f64, f64)> = timeline
        .iter()
        .map(|s| (s.second as f64 + 0.5, s.accepted as f64))
        .collect();
    let p99: Vec<(f64, f64)> = timeline
        .iter()
        .map(|s| (s.second as f64 + 0.5, s.p99_ms))
        .collect();
    let stock_pts: Vec<(f64, f64)> = stock.iter().map(|s| (s.t, s.stock as f64)).collect();

    line_panel(
        &panels[0],
        "requests per second",
        "req/s",
        (t_start, t_end),
        &[
            ("all responses", &rps, BLUE),
            ("accepted (202)", &accepted, GREEN),
        ],
    )?;
    line_panel(
        &panels[1],
        "p99 latency per second",
        "ms",
        (t_start, t_end),
        &[("p99", &p99[..], RED)],
    )?;
    let max_stock = total_stock.max(1) as f64;
    let mut chart = ChartBuilder::on(&panels[2])
        .caption(
            "stock remaining in Redis (sampled every 100 ms)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(t_start..t_end, 0.0..max_stock * 1.05)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the crowd started")
        .y_desc("units")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(stock_pts, MAGENTA.stroke_width(2)))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// A named line: legend text, points, colour.
type Series<'a> = (&'a str, &'a [(f64, f64)], RGBColor);

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn line_panel(
    area: &Area<'_>,
    caption: &str,
    unit: &str,
    (t0, t1): (f64, f64),
    series: &[Series<'_>],
) -> anyhow::Result<()> {
    let y_max = series
        .iter()
        .flat_map(|(_, pts, _)| pts.iter().map(|p| p.1))
        .fold(1.0_f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(t0..t1, 0.0..y_max)
        .map_err(err)?;
    chart.configure_mesh().y_desc(unit).draw().map_err(err)?;
    for (name, pts, color) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    Ok(())
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("chart: {e:?}")
}
