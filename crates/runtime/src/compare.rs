//! `lsgd-host compare`: two plugins of the same kind over the same sequence of states, without
//! training; for codecs, decode(encode(x)) of both over the same gradient buckets. The state
//! sequence is the one the run shape alone defines (constant batch) and the trace's
//! [`Inputs`] (metric, loss, tensor norms) feed back, so both plugins see identical inputs
//! whatever they return. This is the regression check users
//! keep in CI: a port of a schedule to another language, or a refactoring, must stay within
//! tolerance (bit-identical by default).
//!
//! Two sync policies are compared plan by plan, and at the steps both end a window outer step
//! by outer step (fed the same [`Drift`]); each side's window moves with its own plans, as in
//! its own training, so after their first difference the two may drift apart.

use lsgd_policy::StepKind;
use serde::Serialize;

use crate::plugin::{Plugin, PluginError, PolicyKind};
use crate::policy::{Clock, PolicySet};
use crate::trace::{Drift, Inputs};
use crate::{Error, Result};

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
    /// The output that differs: the kind's function, `momentum` (contract 0.4 schedules), or
    /// a sync policy's `outer-step.lr`, `outer-step.momentum`, `outer-step.nesterov`,
    /// `outer-step.lr-scale`.
    pub output: &'static str,
    /// Plugin A's output (NaN where A returned none or the output is a word).
    pub a: f64,
    /// Plugin B's output (NaN where B returned none or the output is a word).
    pub b: f64,
    /// A's and B's outputs in words, for an output that is not a number (a sync policy's
    /// plan, `outer-step.nesterov`); `none` where a side returned none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub words: Option<[&'static str; 2]>,
}

/// A side's named outputs at one step.
type Outputs = Vec<(&'static str, Value)>;

/// One output of one side at one step.
enum Value {
    /// A number, compared within tolerance.
    Number(Option<f64>),
    /// A word (a plan, a flag), compared for equality.
    Word(Option<&'static str>),
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

/// Refuses two plugins of different kinds ([`Error::Kinds`]): their outputs mean different
/// things.
pub fn same_kind(a: &Plugin, b: &Plugin) -> Result<()> {
    if a.kind() == b.kind() {
        return Ok(());
    }
    Err(Error::Kinds {
        a: a.label().to_string(),
        a_kind: a.kind(),
        b: b.label().to_string(),
        b_kind: b.kind(),
    })
}

/// Compares the `kind` policies of `a` and `b` (each one plugin, or for schedules a composed
/// schedule) at every step of the run `clock` describes, fed `inputs` as a trace is: a
/// schedule's LR and momentum, a layer-rate plugin's multipliers tensor by tensor, a sync
/// policy's plan and, where both end a window, its outer step for `drift`. A momentum one side
/// returns and the other does not is a difference.
pub fn compare(
    a: &mut PolicySet,
    b: &mut PolicySet,
    kind: PolicyKind,
    clock: Clock,
    inputs: &Inputs,
    drift: &Drift,
    tolerance: Tolerance,
) -> Result<Report> {
    let mut report = Report {
        call: kind.function(),
        steps: 0,
        max_abs_diff: 0.0,
        max_rel_diff: 0.0,
        differing_steps: 0,
        first_difference: None,
    };
    // One clock per side: a sync policy's window follows that side's own plans.
    let mut clocks = [clock.clone(), clock];
    let mut epochs_done = [0, 0];
    while !clocks[0].finished() {
        let state = clocks[0].state();
        let (va, plan_a) = outputs(a, kind, &clocks[0], inputs, drift)?;
        let (vb, plan_b) = outputs(b, kind, &clocks[1], inputs, drift)?;
        let mut differs = false;
        for ((output, va), (_, vb)) in va.into_iter().zip(vb) {
            let (va, vb) = match (va, vb) {
                (Value::Word(wa), Value::Word(wb)) => {
                    if wa != wb && !differs {
                        differs = true;
                        report.first_difference.get_or_insert(Difference {
                            step: state.step,
                            output,
                            a: f64::NAN,
                            b: f64::NAN,
                            words: Some([wa.unwrap_or("none"), wb.unwrap_or("none")]),
                        });
                    }
                    continue;
                }
                (Value::Number(va), Value::Number(vb)) => match (va, vb) {
                    (None, None) => continue,
                    (Some(va), Some(vb)) => (va, vb),
                    (va, vb) => (va.unwrap_or(f64::NAN), vb.unwrap_or(f64::NAN)),
                },
                _ => unreachable!("both sides name their outputs alike"),
            };
            let abs = (va - vb).abs();
            let scale = va.abs().max(vb.abs());
            if abs.is_finite() {
                report.max_abs_diff = report.max_abs_diff.max(abs);
                if scale > 0.0 {
                    report.max_rel_diff = report.max_rel_diff.max(abs / scale);
                }
            }
            if !tolerance.accepts(va, vb) && !differs {
                differs = true;
                report.first_difference.get_or_insert(Difference {
                    step: state.step,
                    output,
                    a: va,
                    b: vb,
                    words: None,
                });
            }
        }
        report.differing_steps += u64::from(differs);
        report.steps += 1;
        let [clock_a, clock_b] = &mut clocks;
        let [done_a, done_b] = &mut epochs_done;
        inputs.end_step(clock_a, state.global_batch, plan_a, done_a);
        inputs.end_step(clock_b, state.global_batch, plan_b, done_b);
    }
    Ok(report)
}

/// A policy set's checked outputs of `kind` at the clock's step, each named by what it is:
/// a schedule's LR and momentum, another kind's value, a layer-rate plugin's multipliers for
/// the norms of `inputs` at that step, or a sync policy's plan and, at an `average` step, its
/// outer step for `drift` (a missing `lr-scale` as 1 per tensor, which it means); with the
/// step's plan, which moves the side's window.
fn outputs(
    set: &mut PolicySet,
    kind: PolicyKind,
    clock: &Clock,
    inputs: &Inputs,
    drift: &Drift,
) -> Result<(Outputs, Option<StepKind>)> {
    let d = set.decide(clock)?;
    let number = |name, v: f64| (name, Value::Number(Some(v)));
    let values = match kind {
        PolicyKind::Schedule => vec![
            number(kind.function(), d.lr),
            ("momentum", Value::Number(d.momentum)),
        ],
        PolicyKind::BatchSize => vec![number(kind.function(), f64::from(d.global_batch))],
        PolicyKind::LabelSmoothing => {
            vec![number(kind.function(), f64::from(d.label_smoothing))]
        }
        PolicyKind::LayerRate => set
            .layer_rates(&d.state, inputs.norms.at(d.state.step))?
            .unwrap_or_default()
            .into_iter()
            .map(|m| number(kind.function(), m))
            .collect(),
        PolicyKind::Sync => {
            let mut values = vec![(kind.function(), Value::Word(d.plan.map(StepKind::name)))];
            if d.plan == Some(StepKind::Average) {
                let tensors = drift.at(d.state.step);
                if let Some(o) = set.outer_step(&d.state, &d.window, tensors)? {
                    values.push(number("outer-step.lr", o.lr));
                    values.push(number("outer-step.momentum", o.momentum));
                    let nesterov = if o.nesterov { "true" } else { "false" };
                    values.push(("outer-step.nesterov", Value::Word(Some(nesterov))));
                    let scales = match o.lr_scale.is_empty() {
                        true => vec![1.0; tensors.len()],
                        false => o.lr_scale,
                    };
                    values.extend(scales.into_iter().map(|m| number("outer-step.lr-scale", m)));
                }
            }
            values
        }
        PolicyKind::Codec => unreachable!("codecs are compared by compare_codecs"),
    };
    Ok((values, d.plan))
}

/// The first element whose reconstructions differ beyond tolerance.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ElementDifference {
    /// The bucket (0-based call).
    pub bucket: u64,
    /// The element within it.
    pub index: usize,
    /// Codec A's reconstruction.
    pub a: f32,
    /// Codec B's reconstruction.
    pub b: f32,
}

/// What one codec made of the compared buckets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CodecSide {
    /// describe() name.
    pub name: String,
    /// Payload bytes over every bucket and round.
    pub payload_bytes: u64,
    /// Input bytes (binary32) over payload bytes.
    pub compression_ratio: f64,
    /// Largest |decode(encode(x)) − x| over every element.
    pub max_abs_error: f64,
    /// ‖decode(encode(x)) − x‖₂ / ‖x‖₂ over all buckets.
    pub rel_l2_error: f64,
    /// Per bucket, blake3 (hex) of its payloads (every round, in order) concatenated: what
    /// another implementation of the same exchange (lsgd-torch's comm hook) must reproduce.
    pub payload_blake3: Vec<String>,
}

/// The outcome of comparing two codecs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CodecReport {
    /// Buckets compared.
    pub buckets: u64,
    /// Floats per bucket.
    pub floats: u64,
    /// True when both codecs produced the same payload bytes for every bucket and round.
    pub payloads_identical: bool,
    /// Largest |a − b| between the reconstructions.
    pub max_abs_diff: f64,
    /// Largest |a − b| / max(|a|, |b|) (0 where both are 0).
    pub max_rel_diff: f64,
    /// Elements whose reconstructions differ beyond tolerance.
    pub differing_elements: u64,
    /// The first of them.
    pub first_difference: Option<ElementDifference>,
    /// Codec A.
    pub a: CodecSide,
    /// Codec B.
    pub b: CodecSide,
}

impl CodecReport {
    /// True when no element differed beyond tolerance.
    pub fn within_tolerance(&self) -> bool {
        self.first_difference.is_none()
    }
}

/// The buckets `compare` feeds two codecs: `buckets` samples of a `rows`×`cols` layer
/// (weight and bias) at steps 0, 1, … from `seed` (see [`crate::codec::sample_bucket`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CodecInputs {
    /// Weight rows.
    pub rows: u32,
    /// Weight columns (and bias length).
    pub cols: u32,
    /// Buckets (steps) to compare.
    pub buckets: u64,
    /// Seed of the data and of the codecs' seeds.
    pub seed: u64,
}

/// blake3 (hex) of one bucket's payloads, every round in order, concatenated.
pub fn payload_digest(payloads: &[Vec<u8>]) -> String {
    let mut h = blake3::Hasher::new();
    for p in payloads {
        h.update(p);
    }
    h.finalize().to_hex().to_string()
}

/// Compares decode(encode(x)) of two codec plugins on the same buckets, element by element; a
/// stateful codec (contract 0.4) carries its state from each bucket to the next, as from one
/// training step to the next.
pub fn compare_codecs(
    a: &mut Plugin,
    b: &mut Plugin,
    inputs: CodecInputs,
    tolerance: Tolerance,
) -> Result<CodecReport> {
    same_kind(a, b)?;
    let side = |p: &Plugin| CodecSide {
        name: p.info().name.clone(),
        payload_bytes: 0,
        compression_ratio: 0.0,
        max_abs_error: 0.0,
        rel_l2_error: 0.0,
        payload_blake3: Vec::with_capacity(inputs.buckets as usize),
    };
    let mut report = CodecReport {
        buckets: inputs.buckets,
        floats: u64::from(inputs.rows * inputs.cols + inputs.cols),
        payloads_identical: true,
        max_abs_diff: 0.0,
        max_rel_diff: 0.0,
        differing_elements: 0,
        first_difference: None,
        a: side(a),
        b: side(b),
    };
    let (mut norm2, mut err2) = (0.0f64, [0.0f64; 2]);
    let mut states = [Vec::new(), Vec::new()];
    for step in 0..inputs.buckets {
        let (meta, data) = crate::codec::sample_bucket(inputs.rows, inputs.cols, step, inputs.seed);
        let run = |codec: &mut Plugin, state: &mut Vec<u8>| {
            let meta = lsgd_codec::Meta {
                state: std::mem::take(state),
                ..meta.clone()
            };
            let (trip, next) = crate::codec::step(codec, &meta, &data)?;
            *state = next;
            Ok::<_, PluginError>(trip)
        };
        let [state_a, state_b] = &mut states;
        let (pa, ra) = run(a, state_a)?;
        let (pb, rb) = run(b, state_b)?;
        report.payloads_identical &= pa == pb;
        report.a.payload_bytes += pa.iter().map(|p| p.len() as u64).sum::<u64>();
        report.b.payload_bytes += pb.iter().map(|p| p.len() as u64).sum::<u64>();
        report.a.payload_blake3.push(payload_digest(&pa));
        report.b.payload_blake3.push(payload_digest(&pb));
        for (i, ((&x, &va), &vb)) in data.iter().zip(&ra).zip(&rb).enumerate() {
            norm2 += f64::from(x) * f64::from(x);
            for (k, (v, side)) in [(va, &mut report.a), (vb, &mut report.b)]
                .into_iter()
                .enumerate()
            {
                let e = f64::from(v) - f64::from(x);
                err2[k] += e * e;
                side.max_abs_error = side.max_abs_error.max(e.abs());
            }
            let (da, db) = (f64::from(va), f64::from(vb));
            let abs = (da - db).abs();
            let scale = da.abs().max(db.abs());
            report.max_abs_diff = report.max_abs_diff.max(abs);
            if scale > 0.0 {
                report.max_rel_diff = report.max_rel_diff.max(abs / scale);
            }
            if !tolerance.accepts(da, db) {
                report.differing_elements += 1;
                report.first_difference.get_or_insert(ElementDifference {
                    bucket: step,
                    index: i,
                    a: va,
                    b: vb,
                });
            }
        }
    }
    let input_bytes = (report.floats * inputs.buckets * 4) as f64;
    for (k, side) in [&mut report.a, &mut report.b].into_iter().enumerate() {
        side.compression_ratio = input_bytes / side.payload_bytes.max(1) as f64;
        side.rel_l2_error = if norm2 > 0.0 {
            (err2[k] / norm2).sqrt()
        } else {
            0.0
        };
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_payload_digest_is_the_hash_of_the_concatenated_rounds() {
        let rounds = vec![b"ab".to_vec(), Vec::new(), b"cde".to_vec()];
        let whole = blake3::hash(b"abcde").to_hex().to_string();
        assert_eq!(payload_digest(&rounds), whole);
        // Where one round ends is not part of the digest, but the order of the rounds is.
        assert_eq!(payload_digest(&[b"abcde".to_vec()]), whole);
        assert_ne!(payload_digest(&[b"cde".to_vec(), b"ab".to_vec()]), whole);
    }
}
