//! The demo's PNG chart, at 100 ms resolution: responses by class per 100 ms, p99 latency per
//! 100 ms and the Redis stock (sampled every 100 ms; for a sale with stock buckets, the total and
//! one line per bucket), over the same time axis, so a crowd that lasts two seconds shows its
//! shape (the opening rush, the sell-out, the sold-out flood, buckets emptying one by one).
//!
//! Text uses DejaVu Sans compiled in (the `dejavu` crate) through plotters' `ab_glyph`
//! backend, so the chart renders the same on a machine with no system fonts.

use crate::load::{Bucket, BUCKET};
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

/// One Redis stock sample: seconds since the crowd started (negative before), units left over
/// all stock buckets, and each bucket's units (bucket 0 first; one entry for a sale with one
/// bucket).
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StockSample {
    pub t: f64,
    pub stock: i64,
    pub buckets: Vec<i64>,
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

/// The points of one chart line: each bucket's value at the bucket's middle, in seconds.
pub fn points(timeline: &[Bucket], value: impl Fn(&Bucket) -> f64) -> Vec<(f64, f64)> {
    let half = BUCKET.as_secs_f64() / 2.0;
    timeline
        .iter()
        .map(|b| (b.start_ms as f64 / 1000.0 + half, value(b)))
        .collect()
}

/// Draws the three panels into `path` (PNG, 1200×900).
pub fn draw(
    path: &Path,
    title: &str,
    timeline: &[Bucket],
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

    let t_end = stock
        .iter()
        .map(|s| s.t)
        .chain(
            timeline
                .last()
                .map(|b| (b.start_ms as f64 / 1000.0) + BUCKET.as_secs_f64()),
        )
        .fold(BUCKET.as_secs_f64(), f64::max);
    let t_start = stock.iter().map(|s| s.t).fold(0.0_f64, f64::min);

    let all = points(timeline, |b| b.requests as f64);
    let accepted = points(timeline, |b| b.accepted as f64);
    let sold_out = points(timeline, |b| b.sold_out as f64);
    let refused = points(timeline, |b| b.refused as f64);
    let rejected = points(timeline, |b| b.rejected as f64);
    let failed = points(timeline, |b| b.failed as f64);
    let p99 = points(timeline, |b| b.p99_ms);

    line_panel(
        &panels[0],
        "responses per 100 ms",
        "per 100 ms",
        (t_start, t_end),
        &[
            ("all responses", &all, BLUE),
            ("accepted (202)", &accepted, GREEN),
            ("sold_out", &sold_out, RGBColor(230, 140, 0)),
            ("other refusals (409/429)", &refused, CYAN),
            ("bad request / no token", &rejected, RGBColor(128, 128, 128)),
            ("5xx / timeout / transport", &failed, RED),
        ],
    )?;
    line_panel(
        &panels[1],
        "p99 latency per 100 ms",
        "ms",
        (t_start, t_end),
        &[("p99", &p99[..], RED)],
    )?;
    stock_panel(&panels[2], (t_start, t_end), stock, total_stock)?;
    root.present().map_err(err)?;
    Ok(())
}

/// One colour per stock bucket (cycled past eight), each dark enough to read on white and
/// none the total's magenta.
const BUCKET_COLORS: [RGBColor; 8] = [
    RGBColor(0, 110, 200),
    RGBColor(40, 160, 60),
    RGBColor(235, 120, 20),
    RGBColor(140, 30, 170),
    RGBColor(0, 128, 128),
    RGBColor(200, 30, 50),
    RGBColor(140, 90, 30),
    RGBColor(20, 20, 110),
];

/// The stock over time: the total, and for a sale with more than one bucket one line per
/// bucket under it, on the same axis (so a bucket's line lies at its share of the total).
fn stock_panel(
    area: &Area<'_>,
    (t0, t1): (f64, f64),
    stock: &[StockSample],
    total_stock: i64,
) -> anyhow::Result<()> {
    let count = stock.iter().map(|s| s.buckets.len()).max().unwrap_or(0);
    let per_bucket = count > 1;
    let caption = if per_bucket {
        format!(
            "stock remaining in Redis, total and each of {count} buckets (sampled every 100 ms)"
        )
    } else {
        "stock remaining in Redis (sampled every 100 ms)".to_string()
    };
    let max_stock = total_stock.max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(t0..t1, 0.0..max_stock * 1.05)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the crowd started")
        .y_desc("units")
        .draw()
        .map_err(err)?;
    let total: Vec<(f64, f64)> = stock.iter().map(|s| (s.t, s.stock as f64)).collect();
    chart
        .draw_series(LineSeries::new(total, MAGENTA.stroke_width(3)))
        .map_err(err)?
        .label("total")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], MAGENTA.stroke_width(3)));
    if !per_bucket {
        return Ok(());
    }
    for index in 0..count {
        let color = BUCKET_COLORS[index % BUCKET_COLORS.len()];
        let pts: Vec<(f64, f64)> = stock
            .iter()
            .filter_map(|s| s.buckets.get(index).map(|&n| (s.t, n as f64)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(err)?
            .label(format!("bucket {index}"))
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
