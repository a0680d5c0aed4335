//! The demo's PNG chart, at 100 ms resolution: responses by class per 100 ms, p99 latency per
//! 100 ms and the Redis stock (sampled every 100 ms; for a sale with stock buckets, the total and
//! one line per bucket), over the same time axis, so a crowd that lasts two seconds shows its
//! shape (the opening rush, the sell-out, the sold-out flood, buckets emptying one by one).
//! A fourth panel, when given [`Arrivals`], shows who got a unit by when they arrived: entrants
//! per 100 ms of arrival with the winners stacked under the rest, beside the winners per tenth
//! of the arrival order against what a uniform draw gives each tenth. A draw's winners spread
//! over its whole window; a first-come sale's are its earliest arrivals.
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

/// One entrant of a sale, for the arrivals panel.
#[derive(Clone, Debug, PartialEq)]
pub struct Entrant {
    /// Arrival order, from 1 (in a draw, the pool's rank).
    pub rank: i64,
    /// When the entrant's answer came back, in seconds since the sale opened (`None`: it
    /// never came back, yet the entry is there).
    pub at: Option<f64>,
    pub won: bool,
}

/// What the arrivals panel draws.
#[derive(Clone, Debug)]
pub struct Arrivals {
    /// What an entrant and a winner are in this sale, above the panel.
    pub caption: String,
    pub entrants: Vec<Entrant>,
    /// When a draw's window closed, in seconds since the sale opened.
    pub window_close: Option<f64>,
}

/// Draws the panels into `path` (PNG): three (1200×900), four with `arrivals` (1200×1200).
pub fn draw(
    path: &Path,
    title: &str,
    timeline: &[Bucket],
    stock: &[StockSample],
    total_stock: i64,
    arrivals: Option<&Arrivals>,
) -> anyhow::Result<()> {
    register_fonts();
    let rows = if arrivals.is_some() { 4 } else { 3 };
    let root = BitMapBackend::new(path, (1200, 300 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(title, ("sans-serif", 24).into_font().style(FontStyle::Bold))
        .map_err(err)?;
    let panels = root.split_evenly((rows, 1));

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
    let queued = points(timeline, |b| b.queued as f64);
    let sold_out = points(timeline, |b| b.sold_out as f64);
    let refused = points(timeline, |b| b.refused as f64);
    let rejected = points(timeline, |b| b.rejected as f64);
    let failed = points(timeline, |b| b.failed as f64);
    let p99 = points(timeline, |b| b.p99_ms);

    let mut responses: Vec<Series<'_>> = vec![
        ("all responses", &all, BLUE),
        ("accepted (202)", &accepted, GREEN),
    ];
    // Only a draw sale's crowd is queued: a first-come chart keeps its legend.
    if timeline.iter().any(|b| b.queued > 0) {
        responses.push(("queued for the draw (202)", &queued, RGBColor(150, 60, 200)));
    }
    responses.extend_from_slice(&[
        ("sold_out", &sold_out[..], RGBColor(230, 140, 0)),
        ("other refusals (409/429)", &refused, CYAN),
        ("bad request / no token", &rejected, RGBColor(128, 128, 128)),
        ("5xx / timeout / transport", &failed, RED),
    ]);
    line_panel(
        &panels[0],
        "responses per 100 ms",
        "per 100 ms",
        (t_start, t_end),
        &responses,
    )?;
    line_panel(
        &panels[1],
        "p99 latency per 100 ms",
        "ms",
        (t_start, t_end),
        &[("p99", &p99[..], RED)],
    )?;
    stock_panel(&panels[2], (t_start, t_end), stock, total_stock)?;
    if let Some(arrivals) = arrivals {
        arrivals_panel(&panels[3], arrivals)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

const WINNER: RGBColor = RGBColor(40, 160, 60);
const NOT_WINNER: RGBColor = RGBColor(200, 200, 210);
const WINDOW_CLOSE: RGBColor = RGBColor(200, 30, 50);

/// Entrants and winners in one slice of the arrivals (a 100 ms bin, or a tenth of the ranks).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Slice {
    pub entrants: u64,
    pub winners: u64,
}

impl Slice {
    /// The winners a uniform draw gives this slice: its share of the entrants.
    pub fn uniform(self, entrants: u64, winners: u64) -> f64 {
        if entrants == 0 {
            0.0
        } else {
            self.entrants as f64 * winners as f64 / entrants as f64
        }
    }
}

/// The entrants whose answer came back, per [`BUCKET`] of arrival: the first bin's start in
/// seconds, and each bin.
pub fn by_arrival(entrants: &[Entrant]) -> (f64, Vec<Slice>) {
    let width = BUCKET.as_secs_f64();
    let index = |at: f64| (at / width).floor() as i64;
    let ats = entrants.iter().filter_map(|e| e.at);
    let first = ats.clone().map(index).min().unwrap_or(0).min(0);
    let last = ats.map(index).max().unwrap_or(0);
    let mut bins = vec![Slice::default(); (last - first + 1) as usize];
    for e in entrants {
        if let Some(at) = e.at {
            let bin = &mut bins[(index(at) - first) as usize];
            bin.entrants += 1;
            bin.winners += u64::from(e.won);
        }
    }
    (first as f64 * width, bins)
}

/// The entrants in ten slices of their arrival rank (1 to N): slice `i` holds the ranks
/// `r` with `(r - 1) * 10 / N = i`, so the first is the earliest tenth.
pub fn by_rank_tenth(entrants: &[Entrant]) -> [Slice; 10] {
    let n = entrants.len() as i64;
    let mut tenths = [Slice::default(); 10];
    for e in entrants {
        let i = ((e.rank - 1).clamp(0, n.max(1) - 1) * 10 / n.max(1)) as usize;
        tenths[i].entrants += 1;
        tenths[i].winners += u64::from(e.won);
    }
    tenths
}

/// Left: entrants per 100 ms of arrival, winners stacked under the rest, the winners a uniform
/// draw gives each bin, and where the draw window closed. Right: winners per tenth of the
/// arrival order against the uniform share.
fn arrivals_panel(area: &Area<'_>, arrivals: &Arrivals) -> anyhow::Result<()> {
    let (left, right) = area.split_horizontally(780);
    let entrants = arrivals.entrants.len() as u64;
    let winners = arrivals.entrants.iter().filter(|e| e.won).count() as u64;
    let width = BUCKET.as_secs_f64();
    let (t0, bins) = by_arrival(&arrivals.entrants);
    let t1 = (t0 + bins.len() as f64 * width).max(arrivals.window_close.unwrap_or(0.0) + width);
    // Headroom for the legend above the tallest bar.
    let y_max = bins.iter().map(|b| b.entrants).max().unwrap_or(0).max(1) as f64 * 1.6;
    let mut chart = ChartBuilder::on(&left)
        .caption(&arrivals.caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(t0..t1, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the sale opened (when the entry's answer came back)")
        .y_desc("entrants per 100 ms")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(err)?;
    let x = |i: usize| t0 + i as f64 * width;
    let bar = |i: usize, lo: u64, hi: u64, color: RGBColor| {
        Rectangle::new(
            [(x(i), lo as f64), (x(i + 1) - width * 0.08, hi as f64)],
            color.filled(),
        )
    };
    chart
        .draw_series(
            bins.iter()
                .enumerate()
                .map(|(i, b)| bar(i, b.winners, b.entrants, NOT_WINNER)),
        )
        .map_err(err)?
        .label("entrants who did not win")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], NOT_WINNER.filled()));
    chart
        .draw_series(
            bins.iter()
                .enumerate()
                .map(|(i, b)| bar(i, 0, b.winners, WINNER)),
        )
        .map_err(err)?
        .label(format!("winners ({winners} of {entrants})"))
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], WINNER.filled()));
    let uniform: Vec<(f64, f64)> = bins
        .iter()
        .enumerate()
        .map(|(i, b)| (x(i) + width / 2.0, b.uniform(entrants, winners)))
        .collect();
    chart
        .draw_series(LineSeries::new(uniform, BLACK.stroke_width(2)))
        .map_err(err)?
        .label("winners a uniform draw gives")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    if let Some(close) = arrivals.window_close {
        chart
            .draw_series(LineSeries::new(
                [(close, 0.0), (close, y_max)],
                WINDOW_CLOSE.stroke_width(2),
            ))
            .map_err(err)?
            .label("the draw window closes")
            .legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], WINDOW_CLOSE.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    tenths_panel(&right, &arrivals.entrants, entrants, winners)
}

/// Winners per tenth of the arrival order (bars) and the uniform share of each (ticks).
fn tenths_panel(
    area: &Area<'_>,
    all: &[Entrant],
    entrants: u64,
    winners: u64,
) -> anyhow::Result<()> {
    let tenths = by_rank_tenth(all);
    let y_max = tenths
        .iter()
        .map(|t| (t.winners as f64).max(t.uniform(entrants, winners)))
        .fold(1.0_f64, f64::max)
        * 1.2;
    let mut chart = ChartBuilder::on(area)
        .caption("winners per tenth of the arrival order", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.5..10.5, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(10)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .x_desc("tenth of the arrivals (1 = earliest)")
        .y_desc("winners (bars; uniform: ticks)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(tenths.iter().enumerate().map(|(i, t)| {
            let c = i as f64 + 1.0;
            Rectangle::new(
                [(c - 0.35, 0.0), (c + 0.35, t.winners as f64)],
                WINNER.filled(),
            )
        }))
        .map_err(err)?;
    chart
        .draw_series(tenths.iter().enumerate().map(|(i, t)| {
            let (c, u) = (i as f64 + 1.0, t.uniform(entrants, winners));
            PathElement::new(vec![(c - 0.45, u), (c + 0.45, u)], BLACK.stroke_width(2))
        }))
        .map_err(err)?;
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
