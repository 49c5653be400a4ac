//! `lsgd-host trace`: every policy output over a whole run, without training. One row per step;
//! values are printed in Rust's shortest round-trip form, so a CSV trace is an exact record
//! that golden tests can compare byte for byte.
//!
//! What training would feed back into the policies comes from [`Inputs`]: a test metric per
//! epoch and a training loss per step (for policies that react to them, such as `plateau`),
//! and the norms of the parameter tensors per step (for a layer-rate policy, whose
//! multipliers become one column per tensor). A sync policy's outer steps see the
//! pseudo-gradient's norms of [`Drift`] (a file, or one tensor of unit norms), and its plans
//! move the clock's window as in training ([`Inputs::end_step`]).

use std::io::{self, Write};
use std::path::Path;

use lsgd_policy::{OuterStep, Role, StepKind, TensorDrift, TensorNorms, Window};
use serde::{Serialize, Serializer};

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
    /// The sync policy's plan (contract 0.5), the final-step rule applied; `None` without one.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_plan"
    )]
    pub plan: Option<StepKind>,
    /// The window the plan saw; `None` without a sync policy.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_window"
    )]
    pub window: Option<Window>,
    /// The outer step at an `average` step.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_outer"
    )]
    pub outer_step: Option<OuterStep>,
}

/// The CSV header, fixed by the golden files; a schedule that returns a momentum adds a
/// `momentum` column (empty at steps where it returned none), a layer-rate trace adds
/// `scale:<tensor>` columns, a sync trace [`SYNC_COLUMNS`] (and `outer_scale:<tensor>`
/// columns when an outer step scales its tensors).
pub const CSV_HEADER: &str = "step,epoch,lr,global_batch,label_smoothing";

/// The columns a sync policy adds: its plan, the window the plan saw, and at `average` steps
/// the outer step (empty at other steps).
pub const SYNC_COLUMNS: &str = "plan,local_steps,windows,outer_lr,outer_momentum,nesterov";

fn serialize_plan<S: Serializer>(plan: &Option<StepKind>, s: S) -> Result<S::Ok, S::Error> {
    plan.map(StepKind::name).serialize(s)
}

fn serialize_window<S: Serializer>(w: &Option<Window>, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct W {
        local_steps: u32,
        windows: u64,
    }
    w.map(|w| W {
        local_steps: w.local_steps,
        windows: w.windows,
    })
    .serialize(s)
}

fn serialize_outer<S: Serializer>(o: &Option<OuterStep>, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct O<'a> {
        lr: f64,
        momentum: f64,
        nesterov: bool,
        #[serde(skip_serializing_if = "<[f64]>::is_empty")]
        lr_scale: &'a [f64],
    }
    o.as_ref()
        .map(|o| O {
            lr: o.lr,
            momentum: o.momentum,
            nesterov: o.nesterov,
            lr_scale: &o.lr_scale,
        })
        .serialize(s)
}

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

/// Records of tensors by step, as `--norms-file` and `--drift-file` give them: a step not
/// listed uses the latest listed step before it (the first listed one before that).
#[derive(Debug, Clone, PartialEq)]
pub struct ByStep<T>(Vec<(u64, Vec<T>)>);

impl<T> Default for ByStep<T> {
    fn default() -> Self {
        ByStep(Vec::new())
    }
}

/// A record of one tensor, by its name.
pub trait Named {
    /// The tensor's name.
    fn name(&self) -> &str;
}

impl Named for TensorNorms {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for TensorDrift {
    fn name(&self) -> &str {
        &self.name
    }
}

impl<T: Named> ByStep<T> {
    /// The records of `step`.
    pub fn at(&self, step: u64) -> &[T] {
        let i = self.0.partition_point(|(s, _)| *s <= step);
        self.0.get(i.saturating_sub(1)).map_or(&[], |(_, t)| t)
    }

    /// The tensor names, from the first listed step.
    pub fn names(&self) -> Vec<&str> {
        self.0
            .first()
            .map(|(_, t)| t.iter().map(Named::name).collect())
            .unwrap_or_default()
    }

    /// Parses CSV lines of `file` with `record` (a header line starting `step,`, blank lines
    /// and `#` comments skipped); the steps must be sorted and every listed step must list the
    /// same tensors in the same order.
    fn parse_with(
        text: &str,
        file: &str,
        record: fn(&str) -> std::result::Result<(u64, T), String>,
    ) -> Result<Self> {
        let bad = |line: usize, what: String| Error::Input(format!("{file}:{line}: {what}"));
        let mut out: Vec<(u64, Vec<T>)> = Vec::new();
        for (i, line) in data_lines(text) {
            if line.starts_with("step,") {
                continue;
            }
            let (step, record) = record(line).map_err(|e| bad(i, e))?;
            match out.last_mut() {
                Some((s, records)) if *s == step => records.push(record),
                Some((s, _)) if *s > step => {
                    return Err(bad(i, format!("step {step} after step {s}: sort by step")));
                }
                _ => out.push((step, vec![record])),
            }
        }
        let names = |t: &[T]| t.iter().map(|t| t.name().to_string()).collect::<Vec<_>>();
        if let Some((first_step, first)) = out.first()
            && let Some((step, _)) = out.iter().find(|(_, t)| names(t) != names(first))
        {
            return Err(Error::Input(format!(
                "{file}: step {step} lists other tensors than step {first_step}"
            )));
        }
        Ok(ByStep(out))
    }
}

/// Tensor norms by step, for a layer-rate policy ([`ByStep`]).
pub type Norms = ByStep<TensorNorms>;

impl Norms {
    /// Parses `step,name,role,shape,weight_norm,grad_norm,update_norm,weight_decay` lines
    /// (shape as `32x1x3x3`), as [`ByStep`] reads them.
    pub fn parse(text: &str, file: &str) -> Result<Norms> {
        ByStep::parse_with(text, file, norms_record)
    }
}

fn norms_record(line: &str) -> std::result::Result<(u64, TensorNorms), String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    let [step, name, role, shape, w, g, u, wd] = f[..] else {
        return Err(format!("{} fields, expected 8", f.len()));
    };
    let (step, role, shape) = (parse_step(step)?, parse_role(role)?, parse_shape(shape)?);
    Ok((
        step,
        TensorNorms {
            name: name.to_string(),
            shape,
            role,
            weight_norm: parse_num("weight_norm", w)?,
            grad_norm: parse_num("grad_norm", g)?,
            update_norm: parse_num("update_norm", u)?,
            weight_decay: parse_num("weight_decay", wd)?,
        },
    ))
}

fn parse_num(what: &str, v: &str) -> std::result::Result<f64, String> {
    v.parse::<f64>()
        .map_err(|_| format!("{what} `{v}` is not a number"))
}

fn parse_step(step: &str) -> std::result::Result<u64, String> {
    step.parse::<u64>()
        .map_err(|_| format!("step `{step}` is not a step"))
}

fn parse_role(role: &str) -> std::result::Result<Role, String> {
    match role {
        "weight" => Ok(Role::Weight),
        "bias" => Ok(Role::Bias),
        "batchnorm" => Ok(Role::BatchNorm),
        other => Err(format!("role `{other}`: weight, bias or batchnorm")),
    }
}

fn parse_shape(shape: &str) -> std::result::Result<Vec<u32>, String> {
    shape
        .split('x')
        .map(|d| {
            d.parse::<u32>()
                .map_err(|_| format!("shape `{shape}`: like 32x1x3x3"))
        })
        .collect()
}

/// The pseudo-gradient's norms at the end of windows, by step, for a sync policy's
/// `outer-step`: a step not listed uses the latest listed step before it (the first listed one
/// before that). Without a file ([`Drift::default`]) one tensor, `model` of shape 1, whose
/// weight, delta and rank-delta norms are 1 and whose momentum norms are 0: every rank drifted
/// alike, no outer momentum yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Drift(ByStep<TensorDrift>);

impl Default for Drift {
    fn default() -> Self {
        Drift(ByStep(vec![(
            0,
            vec![TensorDrift {
                name: "model".into(),
                shape: vec![1],
                role: Role::Weight,
                weight_norm: 1.0,
                delta_norm: 1.0,
                rank_delta_norm: 1.0,
                momentum_norm: 0.0,
                delta_dot_momentum: 0.0,
            }],
        )]))
    }
}

impl Drift {
    /// The records of `step`.
    pub fn at(&self, step: u64) -> &[TensorDrift] {
        self.0.at(step)
    }

    /// The tensor names, from the first listed step.
    pub fn names(&self) -> Vec<&str> {
        self.0.names()
    }

    /// Parses
    /// `step,name,role,shape,weight_norm,delta_norm,rank_delta_norm,momentum_norm,delta_dot_momentum`
    /// lines (shape as `32x1x3x3`), as [`ByStep`] reads them; at least one must be listed.
    pub fn parse(text: &str, file: &str) -> Result<Drift> {
        let drift = ByStep::parse_with(text, file, drift_record)?;
        if drift.0.is_empty() {
            return Err(Error::Input(format!("{file}: no tensors listed")));
        }
        Ok(Drift(drift))
    }
}

fn drift_record(line: &str) -> std::result::Result<(u64, TensorDrift), String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    let [step, name, role, shape, w, d, r, m, dm] = f[..] else {
        return Err(format!("{} fields, expected 9", f.len()));
    };
    let (step, role, shape) = (parse_step(step)?, parse_role(role)?, parse_shape(shape)?);
    Ok((
        step,
        TensorDrift {
            name: name.to_string(),
            shape,
            role,
            weight_norm: parse_num("weight_norm", w)?,
            delta_norm: parse_num("delta_norm", d)?,
            rank_delta_norm: parse_num("rank_delta_norm", r)?,
            momentum_norm: parse_num("momentum_norm", m)?,
            delta_dot_momentum: parse_num("delta_dot_momentum", dm)?,
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

/// Reads a file for [`parse_series`], [`Norms::parse`] or [`Drift::parse`].
pub fn read_input<T>(path: &Path, parse: impl Fn(&str, &str) -> Result<T>) -> Result<T> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Input(format!("cannot read {name}: {e}")))?;
    parse(&text, &name)
}

/// Runs the policies over the whole run described by `clock`, fed `inputs` (a sync policy's
/// outer steps the default [`Drift`]).
pub fn trace(
    policies: &mut PolicySet,
    clock: Clock,
    inputs: &Inputs,
) -> std::result::Result<Vec<Row>, PluginError> {
    trace_with_drift(policies, clock, inputs, &Drift::default())
}

/// [`trace`], a sync policy's outer steps fed `drift`. (Not a field of [`Inputs`], whose
/// callers build it field by field.)
pub fn trace_with_drift(
    policies: &mut PolicySet,
    mut clock: Clock,
    inputs: &Inputs,
    drift: &Drift,
) -> std::result::Result<Vec<Row>, PluginError> {
    let mut rows = Vec::new();
    let mut epochs_done = 0;
    while !clock.finished() {
        let d = policies.decide(&clock)?;
        let step = d.state.step;
        let scales = policies
            .layer_rates(&d.state, inputs.norms.at(step))?
            .unwrap_or_default();
        let outer_step = match d.plan {
            Some(StepKind::Average) => policies.outer_step(&d.state, &d.window, drift.at(step))?,
            _ => None,
        };
        rows.push(Row {
            step,
            epoch: d.state.epoch_fraction,
            lr: d.lr,
            global_batch: d.global_batch,
            label_smoothing: d.label_smoothing,
            momentum: d.momentum,
            scales,
            plan: d.plan,
            window: d.plan.map(|_| d.window),
            outer_step,
        });
        inputs.end_step(&mut clock, d.global_batch, d.plan, &mut epochs_done);
    }
    Ok(rows)
}

impl Inputs {
    /// Ends the clock's current step at `global_batch` as training would: its loss becomes
    /// `last-loss`, and at a completed epoch (`epochs_done` counts them) that epoch's metric
    /// becomes `last-metric`.
    pub fn advance(&self, clock: &mut Clock, global_batch: u32, epochs_done: &mut u32) {
        self.end_step(clock, global_batch, None, epochs_done);
    }

    /// [`Inputs::advance`] for a step a sync policy planned as `plan`: the window moves on
    /// ([`Clock::pass`]), and a `local` step's loss stays unknown to the policies (the ranks
    /// agree on losses only when they agree on weights), so `last-loss` is the loss of the
    /// last step that agreed.
    pub fn end_step(
        &self,
        clock: &mut Clock,
        global_batch: u32,
        plan: Option<StepKind>,
        epochs_done: &mut u32,
    ) {
        let step = clock.step();
        let loss = self.losses.get(step as usize).copied();
        if let Some(kind) = plan {
            clock.pass(kind);
        }
        let agreed = plan.is_none_or(StepKind::agrees);
        clock.advance(global_batch, loss.filter(|_| agreed));
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
/// `tensors` when the rows have multipliers, and with a sync policy [`SYNC_COLUMNS`] and, when
/// an outer step scales its tensors, an `outer_scale:<tensor>` column per tensor of
/// `drift_tensors` (empty where the outer step gave no scales: 1 everywhere).
pub fn write_csv(
    rows: &[Row],
    tensors: &[&str],
    drift_tensors: &[&str],
    mut out: impl Write,
) -> io::Result<()> {
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
    let synced = rows.iter().any(|r| r.plan.is_some());
    if synced {
        write!(out, ",{SYNC_COLUMNS}")?;
    }
    let outer_scaled = rows.iter().any(|r| {
        r.outer_step
            .as_ref()
            .is_some_and(|o| !o.lr_scale.is_empty())
    });
    if outer_scaled {
        for t in drift_tensors {
            write!(out, ",outer_scale:{t}")?;
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
        if synced {
            write_sync_cells(&mut out, r, drift_tensors.len(), outer_scaled)?;
        }
        writeln!(out)?;
    }
    out.flush()
}

/// The [`SYNC_COLUMNS`] cells of a row, then its `outer_scale` cells (`scales` of them) when
/// the trace has those columns.
fn write_sync_cells(
    out: &mut impl Write,
    r: &Row,
    scales: usize,
    outer_scaled: bool,
) -> io::Result<()> {
    match (r.plan, r.window) {
        (Some(plan), Some(w)) => write!(out, ",{},{},{}", plan.name(), w.local_steps, w.windows)?,
        _ => write!(out, ",,,")?,
    }
    match &r.outer_step {
        Some(o) => write!(out, ",{},{},{}", o.lr, o.momentum, o.nesterov)?,
        None => write!(out, ",,,")?,
    }
    if outer_scaled {
        match r.outer_step.as_ref().filter(|o| !o.lr_scale.is_empty()) {
            Some(o) => {
                for s in &o.lr_scale {
                    write!(out, ",{s}")?;
                }
            }
            None => write!(out, "{}", ",".repeat(scales))?,
        }
    }
    Ok(())
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

    const DRIFT: &str = "\
step,name,role,shape,weight_norm,delta_norm,rank_delta_norm,momentum_norm,delta_dot_momentum
7,fc.bias,bias,10,0.5,0.01,0.02,0,0
7,fc.weight,weight,10x784,4,0.25,0.5,0,0
15,fc.bias,bias,10,0.5,0.01,0.02,0.01,0.0001
15,fc.weight,weight,10x784,4,0.25,0.5,0.25,0.06
";

    #[test]
    fn drift_holds_until_the_next_listed_step_and_defaults_to_one_unit_tensor() {
        let d = Drift::parse(DRIFT, "d.csv").unwrap();
        assert_eq!(d.names(), ["fc.bias", "fc.weight"]);
        assert_eq!(d.at(0)[1].delta_norm, 0.25);
        assert_eq!(d.at(14)[1].momentum_norm, 0.0);
        assert_eq!(d.at(15)[1].delta_dot_momentum, 0.06);
        assert_eq!(d.at(99)[0].rank_delta_norm, 0.02);
        assert_eq!(
            (d.at(7)[1].shape.as_slice(), d.at(7)[0].role),
            (&[10, 784][..], Role::Bias)
        );
        let unit = Drift::default();
        assert_eq!(unit.names(), ["model"]);
        let t = &unit.at(123)[0];
        assert_eq!(
            (
                t.weight_norm,
                t.delta_norm,
                t.rank_delta_norm,
                t.momentum_norm
            ),
            (1.0, 1.0, 1.0, 0.0)
        );
    }

    #[test]
    fn bad_drift_files_name_the_line() {
        let e = Drift::parse("0,a,weight,3,1,1,1,0", "d.csv").unwrap_err();
        assert!(
            e.to_string().contains("d.csv:1: 8 fields, expected 9"),
            "{e}"
        );
        let e = Drift::parse("0,a,weight,3,1,x,1,0,0", "d.csv").unwrap_err();
        assert!(e.to_string().contains("delta_norm `x`"), "{e}");
        let e = Drift::parse("# nothing\n", "d.csv").unwrap_err();
        assert!(e.to_string().contains("d.csv: no tensors"), "{e}");
        let e =
            Drift::parse("0,a,weight,3,1,1,1,0,0\n4,b,weight,3,1,1,1,0,0", "d.csv").unwrap_err();
        assert!(e.to_string().contains("step 4 lists other tensors"), "{e}");
    }

    /// A row of a sync trace at `step`.
    fn sync_row(step: u64, plan: StepKind, local_steps: u32, outer: Option<OuterStep>) -> Row {
        Row {
            step,
            epoch: step as f64 / 4.0,
            lr: 0.1,
            global_batch: 256,
            label_smoothing: 0.0,
            momentum: None,
            scales: Vec::new(),
            plan: Some(plan),
            window: Some(Window {
                local_steps,
                windows: 0,
            }),
            outer_step: outer,
        }
    }

    #[test]
    fn a_sync_trace_writes_the_plan_the_window_and_the_outer_step() {
        let diloco = OuterStep {
            lr: 0.7,
            momentum: 0.9,
            nesterov: true,
            lr_scale: Vec::new(),
        };
        let rows = [
            sync_row(0, StepKind::Local, 0, None),
            sync_row(1, StepKind::Average, 1, Some(diloco.clone())),
        ];
        let mut csv = Vec::new();
        write_csv(&rows, &[], &["a", "b"], &mut csv).unwrap();
        assert_eq!(
            String::from_utf8(csv).unwrap(),
            "step,epoch,lr,global_batch,label_smoothing,plan,local_steps,windows,outer_lr,\
             outer_momentum,nesterov\n\
             0,0,0.1,256,0,local,0,0,,,\n\
             1,0.25,0.1,256,0,average,1,0,0.7,0.9,true\n"
        );
        let scaled = OuterStep {
            lr_scale: vec![0.5, 2.0],
            ..diloco
        };
        let rows = [
            sync_row(0, StepKind::Local, 0, None),
            sync_row(1, StepKind::Average, 1, Some(scaled)),
        ];
        let mut csv = Vec::new();
        write_csv(&rows, &[], &["a", "b"], &mut csv).unwrap();
        let text = String::from_utf8(csv).unwrap();
        assert!(
            text.contains("nesterov,outer_scale:a,outer_scale:b\n")
                && text.contains("local,0,0,,,,,\n")
                && text.ends_with("true,0.5,2\n"),
            "{text}"
        );
        let mut json = Vec::new();
        write_json(&rows[1..], &mut json).unwrap();
        let json = String::from_utf8(json).unwrap();
        assert!(
            json.contains(r#""plan":"average","window":{"local_steps":1,"windows":0}"#)
                && json.contains(
                    r#""outer_step":{"lr":0.7,"momentum":0.9,"nesterov":true,"lr_scale":[0.5,2.0]}"#
                ),
            "{json}"
        );
    }

    #[test]
    fn a_local_step_moves_the_window_and_keeps_the_last_agreed_loss() {
        let shape = crate::policy::RunShape {
            epochs: 1,
            samples_per_epoch: 4 * 256,
            initial_batch: 256,
            world_size: 4,
            base_lr: 0.1,
            reference_batch: 256,
        };
        let mut clock = Clock::new(shape).unwrap();
        let inputs = Inputs {
            losses: vec![2.0, 1.5, 1.25, 1.0],
            ..Inputs::default()
        };
        let mut epochs = 0;
        inputs.end_step(&mut clock, 256, Some(StepKind::Synchronous), &mut epochs);
        assert_eq!(clock.state().last_loss, Some(2.0));
        inputs.end_step(&mut clock, 256, Some(StepKind::Local), &mut epochs);
        inputs.end_step(&mut clock, 256, Some(StepKind::Local), &mut epochs);
        // Nothing agreed inside the window: the policies still see step 0's loss.
        assert_eq!(clock.state().last_loss, Some(2.0));
        assert_eq!(clock.window().local_steps, 2);
        inputs.end_step(&mut clock, 256, Some(StepKind::Average), &mut epochs);
        assert_eq!(clock.state().last_loss, Some(1.0));
        assert_eq!(
            clock.window(),
            Window {
                local_steps: 0,
                windows: 1
            }
        );
        // Without a sync policy every loss is agreed and the window never moves.
        let mut plain = Clock::new(shape).unwrap();
        inputs.advance(&mut plain, 256, &mut 0);
        inputs.advance(&mut plain, 256, &mut 0);
        assert_eq!(
            (plain.state().last_loss, plain.window()),
            (Some(1.5), Window::default())
        );
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
