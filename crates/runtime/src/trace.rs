//! `lsgd-host trace`: every policy output over a whole run, without training. One row per step;
//! values are printed in Rust's shortest round-trip form, so a CSV trace is an exact record
//! that golden tests can compare byte for byte.

use std::io::{self, Write};

use serde::Serialize;

use crate::plugin::PluginError;
use crate::policy::{Clock, PolicySet};

/// One step of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Row {
    /// Step, 0-based.
    pub step: u64,
    /// Fractional epoch at the start of the step.
    pub epoch: f64,
    /// Learning rate.
    pub lr: f64,
    /// Global batch.
    pub global_batch: u32,
    /// Label-smoothing epsilon.
    pub label_smoothing: f32,
}

/// The CSV header, fixed by the golden files.
pub const CSV_HEADER: &str = "step,epoch,lr,global_batch,label_smoothing";

/// Runs the policies over the whole run described by `clock`.
pub fn trace(policies: &mut PolicySet, mut clock: Clock) -> Result<Vec<Row>, PluginError> {
    let mut rows = Vec::new();
    while !clock.finished() {
        let d = policies.decide(&clock)?;
        rows.push(Row {
            step: d.state.step,
            epoch: d.state.epoch_fraction,
            lr: d.lr,
            global_batch: d.global_batch,
            label_smoothing: d.label_smoothing,
        });
        clock.advance(d.global_batch, None);
    }
    Ok(rows)
}

/// Writes rows as CSV with [`CSV_HEADER`].
pub fn write_csv(rows: &[Row], mut out: impl Write) -> io::Result<()> {
    writeln!(out, "{CSV_HEADER}")?;
    for r in rows {
        writeln!(
            out,
            "{},{},{},{},{}",
            r.step, r.epoch, r.lr, r.global_batch, r.label_smoothing
        )?;
    }
    out.flush()
}

/// Writes rows as one JSON array of objects.
pub fn write_json(rows: &[Row], mut out: impl Write) -> io::Result<()> {
    serde_json::to_writer(&mut out, rows)?;
    writeln!(out)?;
    out.flush()
}
