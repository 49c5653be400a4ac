//! Charts as PNG or SVG (chosen by the file extension) with plotters: one panel per series,
//! stacked, sharing the x axis. Text needs a TrueType font; the first of `$LSGD_FONT` and the
//! usual DejaVu/Liberation locations is used (`scripts/setup.sh` installs fonts-dejavu-core).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::trace::Row;
use crate::train::metrics::Record;

/// One panel: a named series of (x, y) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Title, also the y-axis label.
    pub title: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
}

/// The three panels of a trace (learning rate, global batch, label smoothing) against epochs.
pub fn trace_panels(rows: &[Row]) -> Vec<Panel> {
    let series = |title: &str, f: fn(&Row) -> f64| Panel {
        title: title.to_string(),
        points: rows.iter().map(|r| (r.epoch, f(r))).collect(),
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
    let steps = || {
        records.iter().filter_map(|r| match r {
            Record::Step(s) => Some(s),
            _ => None,
        })
    };
    let evals = || {
        records.iter().filter_map(|r| match r {
            Record::Eval(e) => Some(e),
            _ => None,
        })
    };
    let panel = |title: &str, points: Vec<(f64, f64)>| Panel {
        title: title.to_string(),
        points,
    };
    vec![
        panel(
            "training loss",
            steps().map(|s| (s.epoch, s.loss)).collect(),
        ),
        panel(
            "test loss",
            evals().map(|e| (f64::from(e.epoch), e.test_loss)).collect(),
        ),
        panel(
            "test accuracy",
            evals().map(|e| (f64::from(e.epoch), e.test_acc)).collect(),
        ),
        panel("learning rate", steps().map(|s| (s.epoch, s.lr)).collect()),
        panel(
            "global batch",
            steps()
                .map(|s| (s.epoch, f64::from(s.global_batch)))
                .collect(),
        ),
        panel(
            "label smoothing",
            steps()
                .map(|s| (s.epoch, f64::from(s.label_smoothing)))
                .collect(),
        ),
    ]
}

/// Draws `panels` stacked into `path` (.png or .svg) under `title`, x axis labelled `x_label`.
pub fn draw(panels: &[Panel], title: &str, x_label: &str, path: &Path) -> Result<()> {
    ensure_font()?;
    let size = (1000, 300 * panels.len().max(1) as u32 + 40);
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
    let x_max = panels
        .iter()
        .flat_map(|p| p.points.iter().map(|(x, _)| *x))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    for (panel, area) in panels
        .iter()
        .zip(root.split_evenly((panels.len().max(1), 1)))
    {
        let (lo, hi) = y_range(&panel.points);
        let mut chart = ChartBuilder::on(&area)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(80)
            .caption(&panel.title, ("sans-serif", 16))
            .build_cartesian_2d(0.0..x_max, lo..hi)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_label_formatter(&|v| tick(*v))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(LineSeries::new(
                panel.points.iter().copied(),
                BLUE.stroke_width(2),
            ))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// A tick label: plain digits in the usual range, scientific notation outside it.
fn tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if (1e-3..1e6).contains(&a) {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.2e}")
    }
}

/// A y range with a margin, never empty even for a constant series.
fn y_range(points: &[(f64, f64)]) -> (f64, f64) {
    let (lo, hi) = points
        .iter()
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
