//! `lsgd-host compare`: two plugins of the same kind over the same sequence of states, without
//! training. The state sequence is the one the run shape alone defines (constant batch), so
//! both plugins see identical inputs whatever they return. This is the regression check users
//! keep in CI: a port of a schedule to another language, or a refactoring, must stay within
//! tolerance (bit-identical by default).

use serde::Serialize;

use crate::plugin::{Plugin, PluginError};
use crate::policy::{Bounds, Clock, check_output};

/// When two outputs count as equal.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Tolerance {
    /// Relative tolerance; with `atol`, |a - b| <= atol + rtol * |b|.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
}

impl Tolerance {
    /// Bit-identical when both tolerances are zero, else numpy's `isclose` rule.
    pub fn accepts(&self, a: f64, b: f64) -> bool {
        if self.rtol == 0.0 && self.atol == 0.0 {
            a.to_bits() == b.to_bits()
        } else {
            (a - b).abs() <= self.atol + self.rtol * b.abs()
        }
    }
}

/// The first step whose outputs differ beyond tolerance.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Difference {
    /// The step.
    pub step: u64,
    /// Plugin A's output.
    pub a: f64,
    /// Plugin B's output.
    pub b: f64,
}

/// The outcome of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The function compared, e.g. `learning-rate`.
    pub call: &'static str,
    /// Steps compared.
    pub steps: u64,
    /// Largest |a - b|.
    pub max_abs_diff: f64,
    /// Largest |a - b| / max(|a|, |b|) (0 where both are 0).
    pub max_rel_diff: f64,
    /// Steps whose outputs differ beyond tolerance.
    pub differing_steps: u64,
    /// The first of them.
    pub first_difference: Option<Difference>,
}

impl Report {
    /// True when no step differed beyond tolerance.
    pub fn within_tolerance(&self) -> bool {
        self.first_difference.is_none()
    }
}

/// Compares `a` and `b` at every step of the run `clock` describes.
pub fn compare(
    a: &mut Plugin,
    b: &mut Plugin,
    mut clock: Clock,
    tolerance: Tolerance,
    bounds: Bounds,
) -> Result<Report, CompareError> {
    if a.kind() != b.kind() {
        return Err(CompareError::Kinds(format!(
            "cannot compare a {} plugin ({}) with a {} plugin ({})",
            a.kind(),
            a.label(),
            b.kind(),
            b.label()
        )));
    }
    let mut report = Report {
        call: a.call_name(),
        steps: 0,
        max_abs_diff: 0.0,
        max_rel_diff: 0.0,
        differing_steps: 0,
        first_difference: None,
    };
    while !clock.finished() {
        let state = clock.state();
        let va = check_output(a, &state, bounds)?.as_f64();
        let vb = check_output(b, &state, bounds)?.as_f64();
        let abs = (va - vb).abs();
        let scale = va.abs().max(vb.abs());
        report.max_abs_diff = report.max_abs_diff.max(abs);
        if scale > 0.0 {
            report.max_rel_diff = report.max_rel_diff.max(abs / scale);
        }
        if !tolerance.accepts(va, vb) {
            report.differing_steps += 1;
            report.first_difference.get_or_insert(Difference {
                step: state.step,
                a: va,
                b: vb,
            });
        }
        report.steps += 1;
        clock.advance(state.global_batch, None);
    }
    Ok(report)
}

/// Why a comparison could not be made.
#[derive(Debug)]
pub enum CompareError {
    /// The plugins are of different kinds.
    Kinds(String),
    /// A plugin failed.
    Plugin(PluginError),
}

impl From<PluginError> for CompareError {
    fn from(e: PluginError) -> Self {
        CompareError::Plugin(e)
    }
}

impl std::fmt::Display for CompareError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompareError::Kinds(m) => f.write_str(m),
            CompareError::Plugin(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CompareError {}
