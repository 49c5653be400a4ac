//! Charts as PNG or SVG (chosen by the file extension) with plotters: panels stacked, each
//! with one or more series (one colour and legend entry each) on its own x range. Text needs a TrueType font; the first of `$LSGD_FONT` and the
//! usual DejaVu/Liberation locations is used (`scripts/setup.sh` installs fonts-dejavu-core).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use crate::trace::Row;
use crate::train::metrics::Record;

/// One line (or set of markers) on a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text; empty for the lone series of a single-run panel.
    pub label: String,
    /// Points in x order; NaN and infinite ones are skipped when drawn.
    pub points: Vec<(f64, f64)>,
}

/// How a panel's x axis is scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scale {
    /// Evenly spaced values.
    #[default]
    Linear,
    /// Evenly spaced powers of ten (every x must be > 0, else the panel falls back to linear).
    Log,
}

/// One panel: several named series sharing axes.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Title, also the y-axis label.
    pub title: String,
    /// The series, drawn in order with the palette's colours.
    pub series: Vec<Series>,
    /// The x axis's scale.
    pub x_scale: Scale,
    /// Whether to draw a circle at every point (the line is drawn too).
    pub markers: bool,
}

impl Panel {
    /// A panel of one unlabelled series (what trace and single-run plots use).
    pub fn single(title: impl Into<String>, points: Vec<(f64, f64)>) -> Panel {
        Panel::new(
            title,
            vec![Series {
                label: String::new(),
                points,
            }],
        )
    }

    /// A panel of several series.
    pub fn new(title: impl Into<String>, series: Vec<Series>) -> Panel {
        Panel {
            title: title.into(),
            series,
            x_scale: Scale::Linear,
            markers: false,
        }
    }

    /// The same panel with a logarithmic x axis.
    pub fn log_x(self) -> Panel {
        Panel {
            x_scale: Scale::Log,
            ..self
        }
    }

    /// The same panel with a circle at every point.
    pub fn with_markers(self) -> Panel {
        Panel {
            markers: true,
            ..self
        }
    }

    /// Whether the panel draws a legend: the labels mean something only when they tell series
    /// apart or were asked for.
    fn has_legend(&self) -> bool {
        self.series.len() > 1 || self.series.iter().any(|s| !s.label.is_empty())
    }
}

/// The three panels of a trace (learning rate, global batch, label smoothing) against epochs.
pub fn trace_panels(rows: &[Row]) -> Vec<Panel> {
    let series = |title: &str, f: fn(&Row) -> f64| {
        Panel::single(title, rows.iter().map(|r| (r.epoch, f(r))).collect())
    };
    vec![
        series("learning rate", |r| r.lr),
        series("global batch", |r| f64::from(r.global_batch)),
        series("label smoothing", |r| f64::from(r.label_smoothing)),
    ]
}

/// The panels of a training run against epochs: training loss per step, test loss and
/// accuracy per evaluation, and the policies' LR, global batch and ε.
pub fn metrics_panels(records: &[Record]) -> Vec<Panel> {
    metrics_points(records)
        .into_iter()
        .map(|(title, points)| Panel::single(title, points))
        .collect()
}

/// The panels of several runs, one series per run, labelled. A panel on which every run has
/// the same constant value (ε = 0 in every run, say) says nothing and is left out.
pub fn compare_panels(runs: &[(String, Vec<Record>)]) -> Vec<Panel> {
    let per_run: Vec<_> = runs.iter().map(|(_, r)| metrics_points(r)).collect();
    METRICS_TITLES
        .iter()
        .enumerate()
        .map(|(i, title)| {
            Panel::new(
                *title,
                runs.iter()
                    .zip(&per_run)
                    .map(|((label, _), panels)| Series {
                        label: label.clone(),
                        points: panels[i].1.clone(),
                    })
                    .collect(),
            )
        })
        .filter(|p| !uninformative(p))
        .collect()
}

/// Whether a panel has points and all of them share one y value.
fn uninformative(panel: &Panel) -> bool {
    let mut ys = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, y)| *y));
    match ys.next() {
        Some(first) => ys.all(|y| y == first),
        None => false,
    }
}

const METRICS_TITLES: [&str; 6] = [
    "training loss",
    "test loss",
    "test accuracy",
    "learning rate",
    "global batch",
    "label smoothing",
];

/// The (title, points) of each of `METRICS_TITLES`, in that order.
fn metrics_points(records: &[Record]) -> Vec<(&'static str, Vec<(f64, f64)>)> {
    let steps = || records.iter().filter_map(Record::as_step);
    let evals = || records.iter().filter_map(Record::as_eval);
    let points = [
        steps().map(|s| (s.epoch, s.loss)).collect(),
        evals().map(|e| (f64::from(e.epoch), e.test_loss)).collect(),
        evals().map(|e| (f64::from(e.epoch), e.test_acc)).collect(),
        steps().map(|s| (s.epoch, s.lr)).collect(),
        steps()
            .map(|s| (s.epoch, f64::from(s.global_batch)))
            .collect(),
        steps()
            .map(|s| (s.epoch, f64::from(s.label_smoothing)))
            .collect(),
    ];
    METRICS_TITLES.into_iter().zip(points).collect()
}

/// Draws `panels` stacked into `path` (.png or .svg) under `title`, x axis labelled `x_label`.
pub fn draw(panels: &[Panel], title: &str, x_label: &str, path: &Path) -> Result<()> {
    ensure_font()?;
    // Panels grow with their legends, so a long legend still leaves a corner of data free.
    let most_series = panels.iter().map(|p| p.series.len()).max().unwrap_or(0) as u32;
    let panel_height = 300.max(36 * most_series);
    let size = (1000, panel_height * panels.len().max(1) as u32 + 40);
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let result = match ext.as_str() {
        "png" => render(
            BitMapBackend::new(path, size).into_drawing_area(),
            panels,
            title,
            x_label,
        ),
        "svg" => render(
            SVGBackend::new(path, size).into_drawing_area(),
            panels,
            title,
            x_label,
        ),
        _ => bail!(
            "cannot plot to {}: the file name must end in .png or .svg",
            path.display()
        ),
    };
    result.with_context(|| format!("drawing {}", path.display()))
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    panels: &[Panel],
    title: &str,
    x_label: &str,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e:?}");
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(err)?;
    for (panel, area) in panels
        .iter()
        .zip(root.split_evenly((panels.len().max(1), 1)))
    {
        let series: Vec<Vec<(f64, f64)>> = panel
            .series
            .iter()
            .map(|s| {
                s.points
                    .iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && y.is_finite())
                    .collect()
            })
            .collect();
        let (lo, mut hi) = y_range(series.iter().flatten());
        let (scale, x_lo, x_hi) = x_range(&series, panel.x_scale, panel.markers);
        // A log panel that came out linear says so, rather than pass for what was asked.
        let caption = if scale == panel.x_scale {
            panel.title.clone()
        } else {
            format!("{} (linear x: some x ≤ 0)", panel.title)
        };
        let to_unit = |(x, y): (f64, f64)| {
            let x = match scale {
                Scale::Linear => (x - x_lo) / (x_hi - x_lo),
                Scale::Log => (x / x_lo).ln() / (x_hi / x_lo).ln(),
            };
            (x, (y - lo) / (hi - lo))
        };
        let (at, room) = legend_corner(panel, &series, to_unit, area.dim_in_pixel());
        if let Some(share) = room {
            // The data keeps the lower (1 - share) of the plot, less a gap.
            let share = (share + 0.03).min(0.6);
            hi += (hi - lo) * share / (1.0 - share);
        }
        match scale {
            Scale::Linear => draw_panel(
                &area,
                panel,
                &series,
                &caption,
                x_lo..x_hi,
                lo..hi,
                x_label,
                at,
            ),
            Scale::Log => draw_panel(
                &area,
                panel,
                &series,
                &caption,
                // Ticks at powers of two suit batch sizes and ratios; past a few decades
                // they would crowd, so powers of ten.
                (x_lo..x_hi)
                    .log_scale()
                    .base(if x_hi / x_lo <= 4096.0 { 2.0 } else { 10.0 }),
                lo..hi,
                x_label,
                at,
            ),
        }
        .with_context(|| format!("panel {:?}", panel.title))?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Distinct colours that stay readable on white (matplotlib's "tab10", then six darker tones), cycled.
const PALETTE: [RGBColor; 16] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    // Darker tones for figures with more series (the compression study has 14).
    RGBColor(0, 0, 0),
    RGBColor(0, 60, 130),
    RGBColor(120, 0, 0),
    RGBColor(0, 100, 0),
    RGBColor(90, 40, 140),
    RGBColor(170, 100, 0),
];

/// Draws one panel's axes, its (already filtered) `series` and its legend into `area`.
#[allow(clippy::too_many_arguments)]
fn draw_panel<DB, X>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    series: &[Vec<(f64, f64)>],
    caption: &str,
    x_spec: X,
    y_spec: Range<f64>,
    x_label: &str,
    legend_at: SeriesLabelPosition,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e:?}");
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(80)
        .caption(caption, ("sans-serif", 16))
        .build_cartesian_2d(x_spec, y_spec)
        .map_err(err)?;
    let format = |v: &f64| tick(*v);
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_label).y_label_formatter(&format);
    if panel.x_scale == Scale::Log {
        mesh.x_label_formatter(&format);
    }
    mesh.draw().map_err(err)?;
    let labels = legend_labels(panel);
    for (i, points) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        // A lone point has no line to show it, so it always gets its marker.
        let marker = if panel.markers || points.len() == 1 {
            4
        } else {
            0
        };
        let anno = chart
            .draw_series(
                LineSeries::new(points.iter().copied(), colour.filled().stroke_width(2))
                    .point_size(marker),
            )
            .map_err(err)?;
        if let Some(label) = labels.get(i) {
            anno.label(label).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        }
    }
    if !labels.is_empty() {
        chart
            .configure_series_labels()
            .position(legend_at)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// The legend's entries, one per series, or none when the panel has no legend.
fn legend_labels(panel: &Panel) -> Vec<String> {
    if !panel.has_legend() {
        return Vec::new();
    }
    let name = |(i, s): (usize, &Series)| {
        if s.label.is_empty() {
            format!("series {}", i + 1)
        } else {
            s.label.clone()
        }
    };
    panel.series.iter().enumerate().map(name).collect()
}

/// The corner of the plot where the legend covers none of the lines: the first whose box
/// (estimated from the labels and the panel's `size` in pixels) holds no points and no points
/// along the segments between them. `to_unit` maps data to 0..1 on both axes. With every
/// corner taken, the upper right and the share of the plot's height the box needs, to be
/// made free by raising the y range.
fn legend_corner(
    panel: &Panel,
    series: &[Vec<(f64, f64)>],
    to_unit: impl Fn((f64, f64)) -> (f64, f64),
    size: (u32, u32),
) -> (SeriesLabelPosition, Option<f64>) {
    let labels = legend_labels(panel);
    // (upper, right) in order of preference.
    let corners = [(true, true), (true, false), (false, true), (false, false)];
    let position = |(upper, right)| match (upper, right) {
        (true, true) => SeriesLabelPosition::UpperRight,
        (true, false) => SeriesLabelPosition::UpperLeft,
        (false, true) => SeriesLabelPosition::LowerRight,
        (false, false) => SeriesLabelPosition::LowerLeft,
    };
    if labels.is_empty() {
        return (position(corners[0]), None);
    }
    // The plot's share of the panel after the margins, label areas and caption of draw_panel,
    // and the legend box's: 13 px text, a 20 px sample, padding.
    let plot_w = f64::from(size.0).max(200.0) - 2.0 * 12.0 - 80.0;
    let plot_h = f64::from(size.1).max(100.0) - 2.0 * 12.0 - 36.0 - 24.0;
    let chars = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let box_w = ((40.0 + 7.5 * chars as f64) / plot_w).min(1.0);
    let box_h = ((12.0 + 18.0 * labels.len() as f64) / plot_h).min(1.0);
    let inside = |(upper, right): (bool, bool), (x, y): (f64, f64)| {
        let in_x = if right { x >= 1.0 - box_w } else { x <= box_w };
        let in_y = if upper { y >= 1.0 - box_h } else { y <= box_h };
        in_x && in_y
    };
    let samples: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|points| {
            let unit: Vec<_> = points.iter().map(|p| to_unit(*p)).collect();
            let between: Vec<_> = unit
                .windows(2)
                .flat_map(|w| {
                    let ((x0, y0), (x1, y1)) = (w[0], w[1]);
                    (1..8).map(move |k| {
                        let t = f64::from(k) / 8.0;
                        (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t)
                    })
                })
                .collect();
            unit.into_iter().chain(between)
        })
        .collect();
    match corners
        .into_iter()
        .find(|&c| !samples.iter().any(|&p| inside(c, p)))
    {
        Some(free) => (position(free), None),
        None => (position(corners[0]), Some(box_h)),
    }
}

/// A tick label: plain digits in the usual range, scientific notation outside it.
fn tick(v: f64) -> String {
    let a = v.abs();
    // Mesh lines placed at 0 by float arithmetic land a few ulps off it.
    if a < 1e-12 {
        "0".into()
    } else if (1e-3..1e6).contains(&a) {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.2e}")
    }
}

/// The x scale actually used and its range over finite `series`. Log needs every x > 0 and
/// falls back to linear otherwise; linear starts at 0 when no x
/// is negative. The range is never empty, and is padded when markers would sit on its edges.
fn x_range(series: &[Vec<(f64, f64)>], scale: Scale, markers: bool) -> (Scale, f64, f64) {
    let (lo, hi) = series
        .iter()
        .flatten()
        .map(|(x, _)| *x)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    if !lo.is_finite() {
        return match scale {
            Scale::Linear => (Scale::Linear, 0.0, 1.0),
            Scale::Log => (Scale::Log, 1.0, 10.0),
        };
    }
    if scale == Scale::Log && lo > 0.0 {
        // Padding in decades: a constant share of the axis at either end.
        let pad = if hi > lo {
            (hi / lo).powf(if markers { 0.04 } else { 0.0 })
        } else {
            2.0
        };
        return (Scale::Log, lo / pad, hi * pad);
    }
    let lo = if lo >= 0.0 { 0.0 } else { lo };
    let span = hi - lo;
    if span <= 0.0 {
        let pad = lo.abs().max(1.0) * 0.05;
        return (Scale::Linear, lo - pad, hi + pad);
    }
    let pad = if markers { span * 0.03 } else { 0.0 };
    (Scale::Linear, lo - pad, hi + pad)
}

/// A y range with a margin over the finite `points`, never empty even for a constant series.
fn y_range<'a>(points: impl IntoIterator<Item = &'a (f64, f64)>) -> (f64, f64) {
    let (lo, hi) = points
        .into_iter()
        .map(|(_, y)| *y)
        .filter(|y| y.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), y| {
            (lo.min(y), hi.max(y))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = if hi > lo {
        (hi - lo) * 0.05
    } else {
        lo.abs().max(1.0) * 0.05
    };
    (lo - pad, hi + pad)
}

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

fn ensure_font() -> Result<()> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates: Vec<PathBuf> = std::env::var_os("LSGD_FONT")
            .map(PathBuf::from)
            .into_iter()
            .chain(FONT_CANDIDATES.iter().map(PathBuf::from))
            .collect();
        let path = candidates.iter().find(|p| p.is_file()).ok_or_else(|| {
            format!(
                "plotting needs a TrueType font: install fonts-dejavu-core or set LSGD_FONT \
                 (looked in {})",
                FONT_CANDIDATES.join(", ")
            )
        })?;
        let bytes =
            std::fs::read(path).map_err(|e| format!("reading font {}: {e}", path.display()))?;
        // plotters keeps fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a usable TrueType font", path.display()))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_plain_and_float_dust_at_zero_reads_0() {
        assert_eq!(tick(-1.73e-18), "0");
        assert_eq!(tick(0.05), "0.05");
        assert_eq!(tick(2.5e-5), "2.50e-5");
        assert_eq!(tick(2048.0), "2048");
    }

    fn series(points: &[(f64, f64)]) -> Vec<Vec<(f64, f64)>> {
        vec![points.to_vec()]
    }

    #[test]
    fn log_x_needs_every_x_positive_and_falls_back_to_linear() {
        let (scale, lo, hi) = x_range(&series(&[(32.0, 1.0), (4096.0, 2.0)]), Scale::Log, false);
        assert_eq!((scale, lo, hi), (Scale::Log, 32.0, 4096.0));
        // Markers get a margin of the same share of the axis at either end.
        let (_, lo, hi) = x_range(&series(&[(32.0, 1.0), (4096.0, 2.0)]), Scale::Log, true);
        assert!(lo < 32.0 && hi > 4096.0, "{lo}..{hi}");
        assert!(((32.0 / lo) - (hi / 4096.0)).abs() < 1e-9, "{lo}..{hi}");
        let (scale, lo, hi) = x_range(&series(&[(0.0, 1.0), (4096.0, 2.0)]), Scale::Log, false);
        assert_eq!((scale, lo, hi), (Scale::Linear, 0.0, 4096.0));
        let (scale, lo, hi) = x_range(&series(&[(-2.0, 1.0), (5.0, 2.0)]), Scale::Log, false);
        assert_eq!((scale, lo, hi), (Scale::Linear, -2.0, 5.0));
        // One x: a decade-wide range around it, not an empty one.
        let (scale, lo, hi) = x_range(&series(&[(100.0, 1.0)]), Scale::Log, true);
        assert_eq!((scale, lo, hi), (Scale::Log, 50.0, 200.0));
        assert_eq!(x_range(&[], Scale::Log, false), (Scale::Log, 1.0, 10.0));
    }

    #[test]
    fn linear_x_starts_at_zero_unless_negative_and_is_never_empty() {
        assert_eq!(
            x_range(&series(&[(1.0, 0.0), (3.0, 0.0)]), Scale::Linear, false),
            (Scale::Linear, 0.0, 3.0)
        );
        let (_, lo, hi) = x_range(&series(&[(0.0, 0.0)]), Scale::Linear, false);
        assert!(lo < 0.0 && hi > 0.0, "{lo}..{hi}");
        assert_eq!(
            x_range(&[], Scale::Linear, false),
            (Scale::Linear, 0.0, 1.0)
        );
    }

    #[test]
    fn y_range_spans_every_series_and_skips_non_finite_values() {
        let points = [
            (0.0, 2.0),
            (1.0, f64::NAN),
            (2.0, 12.0),
            (3.0, f64::INFINITY),
        ];
        assert_eq!(y_range(&points), (1.5, 12.5));
        let (lo, hi) = y_range(&[(0.0, 3.0), (1.0, 3.0)]);
        assert!(lo < 3.0 && hi > 3.0, "{lo}..{hi}");
        assert_eq!(y_range(&[(0.0, f64::NAN)]), (0.0, 1.0));
    }

    #[test]
    fn the_legend_goes_to_the_corner_the_lines_leave_free() {
        let panel = |points: Vec<(f64, f64)>| {
            let s = |label: &str| Series {
                label: label.into(),
                points: points.clone(),
            };
            Panel::new("p", vec![s("a"), s("b")])
        };
        let corner = |points: Vec<(f64, f64)>| {
            let p = panel(points);
            let series: Vec<_> = p.series.iter().map(|s| s.points.clone()).collect();
            legend_corner(&p, &series, |xy| xy, (1000, 300)).0
        };
        // Rising: upper right taken, upper left free.
        assert!(matches!(
            corner(vec![(0.0, 0.0), (1.0, 1.0)]),
            SeriesLabelPosition::UpperLeft
        ));
        // Along the top: the lower corners are free, the right one preferred.
        assert!(matches!(
            corner(vec![(0.0, 1.0), (1.0, 1.0)]),
            SeriesLabelPosition::LowerRight
        ));
        // Falling: upper right free, the first choice.
        assert!(matches!(
            corner(vec![(0.0, 1.0), (1.0, 0.0)]),
            SeriesLabelPosition::UpperRight
        ));
        // Along the top and the bottom: room is made above the lines, for the legend's height.
        let p = Panel::new(
            "p",
            vec![
                Series {
                    label: "top".into(),
                    points: vec![(0.0, 1.0), (1.0, 1.0)],
                },
                Series {
                    label: "bottom".into(),
                    points: vec![(0.0, 0.0), (1.0, 0.0)],
                },
            ],
        );
        let series: Vec<_> = p.series.iter().map(|s| s.points.clone()).collect();
        let (at, room) = legend_corner(&p, &series, |xy| xy, (1000, 300));
        assert!(matches!(at, SeriesLabelPosition::UpperRight));
        let room = room.unwrap();
        assert!((0.1..0.5).contains(&room), "{room}");
    }

    #[test]
    fn compare_leaves_out_panels_where_every_run_has_one_constant_value() {
        let run = |batch: u32| {
            let step =
                |i: u64| {
                    Record::Step(serde_json::from_value(serde_json::json!({
                    "step": i, "epoch": i as f64 / 2.0, "lr": 0.1, "global_batch": batch,
                    "micro_batches": 1, "label_smoothing": 0.0, "loss": 2.0 - i as f64 * 0.1,
                    "samples_per_s": 1.0, "compute_s": 0.0, "communication_s": 0.0,
                    "policy_s": 0.0,
                }))
                .unwrap())
                };
            (0..4).map(step).collect::<Vec<_>>()
        };
        let panels = compare_panels(&[("a".into(), run(64)), ("b".into(), run(128))]);
        let titles: Vec<&str> = panels.iter().map(|p| p.title.as_str()).collect();
        // LR and ε are the same constant in both; the runs have no evaluations, which shows.
        assert_eq!(
            titles,
            [
                "training loss",
                "test loss",
                "test accuracy",
                "global batch"
            ]
        );
        let labels: Vec<&str> = panels[0].series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["a", "b"]);
        assert_eq!(panels[3].series[1].points[0], (0.0, 128.0));
    }

    #[test]
    fn draws_a_log_panel_with_markers_an_empty_panel_and_a_fallback_to_svg() {
        let dir = std::env::temp_dir().join(format!("lsgd-plot-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log.svg");
        let panels = [
            Panel::new(
                "test error",
                vec![
                    Series {
                        label: "no warmup".into(),
                        points: vec![(256.0, 0.1), (1024.0, 0.12), (8192.0, f64::NAN)],
                    },
                    Series {
                        label: "gradual warmup".into(),
                        points: vec![(256.0, 0.1), (1024.0, 0.105), (8192.0, 0.2)],
                    },
                ],
            )
            .log_x()
            .with_markers(),
            Panel::single("nothing yet", vec![]).log_x(),
            Panel::single("zero batch", vec![(0.0, 1.0), (10.0, 2.0)]).log_x(),
        ];
        draw(&panels, "warmups", "global batch", &path).unwrap();
        draw(&panels, "warmups", "global batch", &dir.join("log.png")).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for text in [
            "no warmup",
            "gradual warmup",
            "nothing yet",
            "zero batch (linear x: some x ≤ 0)",
        ] {
            assert!(svg.contains(text), "{text} missing from {}", path.display());
        }
        // Every point of both series gets a circle: 2 + 3, the NaN skipped.
        assert_eq!(svg.matches("<circle").count(), 5, "{}", path.display());
        if std::env::var_os("LSGD_KEEP_PLOTS").is_none() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
