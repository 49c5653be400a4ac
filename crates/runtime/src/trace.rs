//! `lsgd-host trace`: every policy output over a whole run, without training. One row per step;
//! values are printed in Rust's shortest round-trip form, so a CSV trace is an exact record
//! that golden tests can compare byte for byte.
//!
//! What training would feed back into the policies comes from [`Inputs`]: a test metric per
//! epoch and a training loss per step (for policies that react to them, such as `plateau`),
//! and the norms of the parameter tensors per step (for a layer-rate policy, whose
//! multipliers become one column per tensor).

use std::io::{self, Write};
use std::path::Path;

use lsgd_policy::{Role, TensorNorms};
use serde::Serialize;

use crate::plugin::{PluginError, PolicyKind};
use crate::policy::{Clock, PolicySet};
use crate::{Error, Result};

/// One step of a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
    /// The schedule's momentum (contract 0.4), when it returned one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f64>,
    /// The layer-rate policy's multiplier of each tensor (empty without one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scales: Vec<f64>,
}

/// The CSV header, fixed by the golden files; a schedule that returns a momentum adds a
/// `momentum` column (empty at steps where it returned none), a layer-rate trace adds
/// `scale:<tensor>` columns.
pub const CSV_HEADER: &str = "step,epoch,lr,global_batch,label_smoothing";

/// What training would have fed back into the policies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inputs {
    /// The test metric after each epoch: entry `e` becomes `last-metric` once epoch `e + 1`
    /// is complete, as the trainer's evaluation does.
    pub metrics: Vec<f64>,
    /// The training loss of each step: entry `i` becomes `last-loss` after step `i`.
    pub losses: Vec<f64>,
    /// The tensors' norms by step, for a layer-rate policy.
    pub norms: Norms,
}

/// Tensor norms by step: a step not listed uses the latest listed step before it (the first
/// listed one before that).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Norms(Vec<(u64, Vec<TensorNorms>)>);

impl Norms {
    /// The records of `step`.
    pub fn at(&self, step: u64) -> &[TensorNorms] {
        let i = self.0.partition_point(|(s, _)| *s <= step);
        self.0.get(i.saturating_sub(1)).map_or(&[], |(_, t)| t)
    }

    /// The tensor names, from the first listed step.
    pub fn names(&self) -> Vec<&str> {
        self.0
            .first()
            .map(|(_, t)| t.iter().map(|t| t.name.as_str()).collect())
            .unwrap_or_default()
    }

    /// Parses `step,name,role,shape,weight_norm,grad_norm,update_norm,weight_decay` lines
    /// (a header line, blank lines and `#` comments skipped; shape as `32x1x3x3`); every
    /// listed step must list the same tensors in the same order.
    pub fn parse(text: &str, file: &str) -> Result<Norms> {
        let bad = |line: usize, what: String| Error::Input(format!("{file}:{line}: {what}"));
        let mut out: Vec<(u64, Vec<TensorNorms>)> = Vec::new();
        for (i, line) in data_lines(text) {
            if line.starts_with("step,") {
                continue;
            }
            let (step, record) = norms_record(line).map_err(|e| bad(i, e))?;
            match out.last_mut() {
                Some((s, records)) if *s == step => records.push(record),
                Some((s, _)) if *s > step => {
                    return Err(bad(i, format!("step {step} after step {s}: sort by step")));
                }
                _ => out.push((step, vec![record])),
            }
        }
        let names = |t: &[TensorNorms]| t.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        if let Some((_, first)) = out.first()
            && let Some((step, _)) = out.iter().find(|(_, t)| names(t) != names(first))
        {
            return Err(Error::Input(format!(
                "{file}: step {step} lists other tensors than step {}",
                out[0].0
            )));
        }
        Ok(Norms(out))
    }
}

fn norms_record(line: &str) -> std::result::Result<(u64, TensorNorms), String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    let [step, name, role, shape, w, g, u, wd] = f[..] else {
        return Err(format!("{} fields, expected 8", f.len()));
    };
    let num = |what: &str, v: &str| {
        v.parse::<f64>()
            .map_err(|_| format!("{what} `{v}` is not a number"))
    };
    let role = match role {
        "weight" => Role::Weight,
        "bias" => Role::Bias,
        "batchnorm" => Role::BatchNorm,
        other => return Err(format!("role `{other}`: weight, bias or batchnorm")),
    };
    let shape = shape
        .split('x')
        .map(|d| {
            d.parse::<u32>()
                .map_err(|_| format!("shape `{shape}`: like 32x1x3x3"))
        })
        .collect::<std::result::Result<Vec<u32>, String>>()?;
    let step = step
        .parse::<u64>()
        .map_err(|_| format!("step `{step}` is not a step"))?;
    Ok((
        step,
        TensorNorms {
            name: name.to_string(),
            shape,
            role,
            weight_norm: num("weight_norm", w)?,
            grad_norm: num("grad_norm", g)?,
            update_norm: num("update_norm", u)?,
            weight_decay: num("weight_decay", wd)?,
        },
    ))
}

/// The non-blank, non-comment lines of `text` with their 1-based numbers.
fn data_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}

/// One number per line (blank lines and `#` comments skipped), e.g. a metric per epoch.
pub fn parse_series(text: &str, file: &str) -> Result<Vec<f64>> {
    data_lines(text)
        .map(|(i, l)| {
            l.parse::<f64>()
                .map_err(|_| Error::Input(format!("{file}:{i}: `{l}` is not a number")))
        })
        .collect()
}

/// Reads a file for [`parse_series`] or [`Norms::parse`].
pub fn read_input<T>(path: &Path, parse: impl Fn(&str, &str) -> Result<T>) -> Result<T> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Input(format!("cannot read {name}: {e}")))?;
    parse(&text, &name)
}

/// Runs the policies over the whole run described by `clock`, fed `inputs`.
pub fn trace(
    policies: &mut PolicySet,
    mut clock: Clock,
    inputs: &Inputs,
) -> std::result::Result<Vec<Row>, PluginError> {
    let mut rows = Vec::new();
    let mut epochs_done = 0;
    while !clock.finished() {
        let d = policies.decide(&clock)?;
        let step = d.state.step;
        let scales = policies
            .layer_rates(&d.state, inputs.norms.at(step))?
            .unwrap_or_default();
        rows.push(Row {
            step,
            epoch: d.state.epoch_fraction,
            lr: d.lr,
            global_batch: d.global_batch,
            label_smoothing: d.label_smoothing,
            momentum: d.momentum,
            scales,
        });
        inputs.advance(&mut clock, d.global_batch, &mut epochs_done);
    }
    Ok(rows)
}

impl Inputs {
    /// Ends the clock's current step at `global_batch` as training would: its loss becomes
    /// `last-loss`, and at a completed epoch (`epochs_done` counts them) that epoch's metric
    /// becomes `last-metric`.
    pub fn advance(&self, clock: &mut Clock, global_batch: u32, epochs_done: &mut u32) {
        let step = clock.step();
        clock.advance(global_batch, self.losses.get(step as usize).copied());
        let completed = clock.state().epoch.min(clock.shape().epochs);
        if completed > *epochs_done {
            *epochs_done = completed;
            if let Some(m) = self.metrics.get(completed as usize - 1) {
                clock.set_metric(*m);
            }
        }
    }
}

/// Whether `policies` need [`Inputs::norms`] to be traced.
pub fn needs_norms(policies: &PolicySet) -> bool {
    policies.get(PolicyKind::LayerRate).is_some()
}

/// Writes rows as CSV with [`CSV_HEADER`], plus a `scale:<tensor>` column per tensor of
/// `tensors` when the rows have multipliers.
pub fn write_csv(rows: &[Row], tensors: &[&str], mut out: impl Write) -> io::Result<()> {
    write!(out, "{CSV_HEADER}")?;
    let momentum = rows.iter().any(|r| r.momentum.is_some());
    if momentum {
        write!(out, ",momentum")?;
    }
    let scaled = rows.iter().any(|r| !r.scales.is_empty());
    if scaled {
        for t in tensors {
            write!(out, ",scale:{t}")?;
        }
    }
    writeln!(out)?;
    for r in rows {
        write!(
            out,
            "{},{},{},{},{}",
            r.step, r.epoch, r.lr, r.global_batch, r.label_smoothing
        )?;
        if momentum {
            write!(out, ",")?;
            if let Some(m) = r.momentum {
                write!(out, "{m}")?;
            }
        }
        for s in &r.scales {
            write!(out, ",{s}")?;
        }
        writeln!(out)?;
    }
    out.flush()
}

/// Writes rows as one JSON array of objects.
pub fn write_json(rows: &[Row], mut out: impl Write) -> io::Result<()> {
    serde_json::to_writer(&mut out, rows)?;
    writeln!(out)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NORMS: &str = "\
step,name,role,shape,weight_norm,grad_norm,update_norm,weight_decay
# two tensors
0,fc.bias,bias,10,0.5,0.1,0.2,0
0,fc.weight,weight,10x784,4,0.25,1,0.0001
3,fc.bias,bias,10,0.75,0.1,0.2,0
3,fc.weight,weight,10x784,5,0.5,1,0.0001
";

    #[test]
    fn norms_hold_until_the_next_listed_step() {
        let n = Norms::parse(NORMS, "n.csv").unwrap();
        assert_eq!(n.names(), ["fc.bias", "fc.weight"]);
        assert_eq!(n.at(0)[1].weight_norm, 4.0);
        assert_eq!(n.at(2)[1].weight_norm, 4.0);
        assert_eq!(n.at(3)[1].weight_norm, 5.0);
        assert_eq!(n.at(99)[0].weight_norm, 0.75);
        assert_eq!(n.at(0)[1].shape, [10, 784]);
        assert_eq!(n.at(0)[0].role, Role::Bias);
    }

    #[test]
    fn bad_norms_files_name_the_line() {
        let e = Norms::parse("0,a,weight,3,1,1,1", "n.csv").unwrap_err();
        assert!(e.to_string().contains("n.csv:1: 7 fields"), "{e}");
        let e = Norms::parse("0,a,gamma,3,1,1,1,0", "n.csv").unwrap_err();
        assert!(e.to_string().contains("role `gamma`"), "{e}");
        let e = Norms::parse("1,a,weight,3,1,1,1,0\n0,a,weight,3,1,1,1,0", "n.csv").unwrap_err();
        assert!(
            e.to_string().contains("n.csv:2: step 0 after step 1"),
            "{e}"
        );
        let e = Norms::parse("0,a,weight,3,1,1,1,0\n1,b,weight,3,1,1,1,0", "n.csv").unwrap_err();
        assert!(e.to_string().contains("step 1 lists other tensors"), "{e}");
    }

    #[test]
    fn series_skip_comments_and_name_bad_lines() {
        assert_eq!(
            parse_series("# acc\n0.5\n\n0.75\n", "m").unwrap(),
            [0.5, 0.75]
        );
        let e = parse_series("0.5\nhigh\n", "m.txt").unwrap_err();
        assert!(e.to_string().contains("m.txt:2: `high`"), "{e}");
    }
}
