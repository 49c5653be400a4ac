//! `dgc`: the codec half of Deep Gradient Compression (Lin et al. 2018): top-k of the bucket
//! (or of every tensor slice) at a sparsity that ramps up over the first steps (the paper's
//! *warm-up training*), sent as a [sparse] payload and all-gathered.
//!
//! The sparsity at step t is `warmup_stages[⌊t / warmup_steps⌋]` while that index is in the
//! list, then `sparsity`; the defaults are the paper's exponential ramp 75%, 93.75%, 98.4375%,
//! 99.609375% (1 − 4⁻ⁱ, which the paper prints as 99.6%), then 99.9%. The paper moves one stage
//! per epoch; a codec sees only the step, so `warmup_steps` is the stage length in steps (set
//! it to the run's steps per epoch for the paper's schedule; 0 starts at `sparsity`). Every
//! rank computes the same sparsity from `meta.step`, so the ranks' payloads of a step keep the
//! same number of entries.
//!
//! Selection keeps the k = max(1, n − ⌊s·n⌋) largest magnitudes of n elements, exactly (the
//! top-k of [`top_k::select`], which the paper's sampled threshold approximates), either over
//! the whole bucket (`selection=bucket`, the default: the entries compete across tensors, as
//! in `top-k`) or in every tensor slice of it (`selection=tensor`, `meta.tensors`, the whole
//! bucket without them: the paper's layer-by-layer sparsification, which makes every tensor
//! send its share, k ≥ 1 each, however small its gradients). On a short run the bucket-wide
//! choice trains markedly better, because a small layer that matters (the classifier)
//! is not held to its share. The payload is the bucket's kept entries in ascending index order.
//!
//! DGC's other three parts change state that lives outside a codec, and the host does them:
//! momentum correction and momentum factor masking (`--error-feedback momentum`: the velocity
//! is accumulated instead of the gradient, and zeroed where the payload sent an entry) and
//! local gradient clipping (`--local-clip-norm`). See `docs/plugin-contract.md`.

use crate::ef_sign::slices;
use crate::sparse;
use crate::top_k::select;
use crate::wire::{check_len, expect_rounds};
use crate::{Codec, Info, Meta, ParamSpec, Params, Policy, Properties};

/// The paper's warm-up sparsities before the final one: 1 − 4⁻ⁱ for i = 1..4.
pub const PAPER_WARMUP: [f64; 4] = [0.75, 0.9375, 0.984375, 0.99609375];

/// Top-k of the bucket or of each tensor slice, at a sparsity chosen by the step.
#[derive(Clone, Debug, PartialEq)]
pub struct Dgc {
    /// Select per tensor slice rather than over the whole bucket.
    pub per_tensor: bool,
    /// Fraction of each slice dropped once the warm-up is over, in [0, 1).
    pub sparsity: f64,
    /// Steps per warm-up stage (0: no warm-up).
    pub warmup_steps: u64,
    /// The sparsity of each warm-up stage, in [0, 1).
    pub warmup_stages: Vec<f64>,
}

impl Policy for Dgc {
    fn info() -> Info {
        Info::new(
            "dgc",
            "Deep Gradient Compression's codec: top-k as index+value pairs, all-gathered, at a sparsity ramping over warm-up stages of warmup_steps steps each; use with --error-feedback momentum",
            vec![
                ParamSpec::float(
                    "sparsity",
                    0.999,
                    "fraction of each tensor dropped after the warm-up, in [0, 1)",
                ),
                ParamSpec::integer(
                    "warmup_steps",
                    100,
                    "steps per warm-up stage (>= 0; the paper: one epoch; 0 = no warm-up)",
                ),
                ParamSpec::float_list(
                    "warmup_stages",
                    &PAPER_WARMUP,
                    "sparsity of each warm-up stage, each in [0, 1)",
                ),
                ParamSpec::choice(
                    "selection",
                    &["bucket", "tensor"],
                    "top-k over the whole bucket, or within each tensor (the paper's layer-wise)",
                ),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let sparsity = sparsity_param(p.float("sparsity")?, "sparsity")?;
        let steps = p.integer("warmup_steps")?;
        let warmup_steps =
            u64::try_from(steps).map_err(|_| format!("warmup_steps must be >= 0, got {steps}"))?;
        let warmup_stages = p
            .float_list("warmup_stages")?
            .iter()
            .map(|&s| sparsity_param(s, "every warmup_stages value"))
            .collect::<Result<_, _>>()?;
        Ok(Dgc {
            per_tensor: p.text("selection")? == "tensor",
            sparsity,
            warmup_steps,
            warmup_stages,
        })
    }
}

/// `s` when it lies in [0, 1), else an error naming `what`.
fn sparsity_param(s: f64, what: &str) -> Result<f64, String> {
    if (0.0..1.0).contains(&s) {
        Ok(s)
    } else {
        Err(format!("{what} must be in [0, 1), got {s}"))
    }
}

impl Dgc {
    /// The sparsity of step `step`: its warm-up stage's, or the final one after the warm-up.
    pub fn sparsity_at(&self, step: u64) -> f64 {
        if self.warmup_steps == 0 {
            return self.sparsity;
        }
        usize::try_from(step / self.warmup_steps)
            .ok()
            .and_then(|stage| self.warmup_stages.get(stage))
            .copied()
            .unwrap_or(self.sparsity)
    }
}

/// Elements of `n` kept at `sparsity`: n − ⌊sparsity·n⌋, at least 1 (0 of 0). Counting the
/// dropped ones keeps 99.9% of 1000 at 1, where ⌈(1 − 0.999)·1000⌉ would round up to 2.
pub fn kept(sparsity: f64, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let dropped = (sparsity * n as f64).floor() as usize;
    n.saturating_sub(dropped).clamp(1, n)
}

impl Codec for Dgc {
    fn properties(&self) -> Properties {
        Properties::GATHER
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        check_len(meta, data)?;
        let s = self.sparsity_at(meta.step);
        if !self.per_tensor {
            return Ok(sparse::encode(
                data,
                &select(data, kept(s, data.len())),
                1.0,
            ));
        }
        let mut indices = Vec::new();
        let mut next = 0; // slices must be in bucket order for the indices to ascend
        for r in slices(meta)? {
            if r.start < next {
                return Err(format!(
                    "tensor slices overlap or are out of order at bucket offset {}",
                    r.start
                ));
            }
            next = r.end;
            let at = r.start as u32;
            let part = &data[r];
            indices.extend(
                select(part, kept(s, part.len()))
                    .into_iter()
                    .map(|i| i + at),
            );
        }
        Ok(sparse::encode(data, &indices, 1.0))
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        expect_rounds(payloads, 1)?;
        sparse::decode(&payloads[0], meta.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TensorSlice, Value, dynamic, round_trip};

    fn codec(set: &[(&str, Value)]) -> Result<Dgc, String> {
        let given = set
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        Dgc::configure(&Params::resolve(&Dgc::info().params, given)?)
    }

    #[test]
    fn the_ramp_follows_the_stages_then_stays_at_the_final_sparsity() {
        let d = codec(&[("warmup_steps", Value::Integer(10))]).unwrap();
        let at: Vec<f64> = [0, 9, 10, 19, 20, 29, 30, 39, 40, 1000, u64::MAX]
            .iter()
            .map(|&t| d.sparsity_at(t))
            .collect();
        assert_eq!(
            at,
            [
                0.75, 0.75, 0.9375, 0.9375, 0.984375, 0.984375, 0.99609375, 0.99609375, 0.999,
                0.999, 0.999
            ]
        );
        let none = codec(&[("warmup_steps", Value::Integer(0))]).unwrap();
        assert_eq!(none.sparsity_at(0), 0.999);
        let custom = codec(&[
            ("warmup_steps", Value::Integer(2)),
            ("warmup_stages", Value::FloatList(vec![0.5])),
            ("sparsity", Value::Float(0.9)),
        ])
        .unwrap();
        assert_eq!(
            (0..4).map(|t| custom.sparsity_at(t)).collect::<Vec<_>>(),
            [0.5, 0.5, 0.9, 0.9]
        );
    }

    #[test]
    fn counts_drop_the_floor_of_the_sparse_part() {
        assert_eq!(kept(0.999, 1000), 1);
        assert_eq!(kept(0.999, 421_738), 422);
        assert_eq!(kept(0.75, 10), 3);
        assert_eq!(kept(0.9375, 32), 2);
        assert_eq!(kept(0.999, 10), 1);
        assert_eq!(kept(0.0, 7), 7);
        assert_eq!(kept(0.5, 0), 0);
    }

    /// A bucket of two tensors: a 4×8 weight whose magnitudes rise with the index and a bias
    /// of 4 small values.
    fn two_tensors(step: u64) -> (Meta, Vec<f32>) {
        let meta = Meta {
            step,
            len: 36,
            tensors: vec![
                TensorSlice::whole("w", &[4, 8], 0),
                TensorSlice::whole("b", &[4], 32),
            ],
            ..Meta::default()
        };
        let mut data: Vec<f32> = (0..32)
            .map(|i| if i % 2 == 0 { i as f32 } else { -(i as f32) })
            .collect();
        data.extend([0.01, -0.04, 0.03, 0.02]);
        (meta, data)
    }

    #[test]
    fn the_bucket_keeps_its_largest_entries_at_the_steps_sparsity() {
        let d = dynamic(codec(&[("warmup_steps", Value::Integer(1))]).unwrap());
        // Step 0 at 75%: 36 − 27 = 9 of the bucket, all of them the weight's largest.
        let (meta, data) = two_tensors(0);
        let (payloads, out) = round_trip(d.as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0].len(), sparse::encoded_len(9));
        let sent: Vec<usize> = (0..36).filter(|&i| out[i] != 0.0).collect();
        assert_eq!(sent, (23..32).collect::<Vec<_>>());
        assert!(sent.iter().all(|&i| out[i] == data[i]));
        // Step 1 at 93.75%: 36 − ⌊33.75⌋ = 3; the same bytes as top-k at that count.
        let (meta, data) = two_tensors(1);
        let (payloads, out) = round_trip(d.as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0], sparse::encode(&data, &[29, 30, 31], 1.0));
        assert_eq!(
            (0..36).filter(|&i| out[i] != 0.0).collect::<Vec<_>>(),
            [29, 30, 31]
        );
    }

    #[test]
    fn per_tensor_every_tensor_keeps_its_own_largest_entries() {
        let d = dynamic(
            codec(&[
                ("warmup_steps", Value::Integer(1)),
                ("selection", Value::Text("tensor".into())),
            ])
            .unwrap(),
        );
        // Step 0 at 75%: the weight keeps 32 − 24 = 8, the bias 4 − 3 = 1 (its largest, −0.04,
        // though every weight entry is larger).
        let (meta, data) = two_tensors(0);
        let (payloads, out) = round_trip(d.as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0].len(), sparse::encoded_len(9));
        let sent: Vec<usize> = (0..36).filter(|&i| out[i] != 0.0).collect();
        assert_eq!(sent, [24, 25, 26, 27, 28, 29, 30, 31, 33]);
        assert!(sent.iter().all(|&i| out[i] == data[i]));
        // Step 1 at 93.75%: 2 of the weight, 1 of the bias.
        let (meta, data) = two_tensors(1);
        let (payloads, out) = round_trip(d.as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0].len(), sparse::encoded_len(3));
        assert_eq!(
            (0..36).filter(|&i| out[i] != 0.0).collect::<Vec<_>>(),
            [30, 31, 33]
        );
        // Without tensor information the bucket is one slice of 36, which keeps 3: the bias
        // loses out.
        let (mut meta, data) = two_tensors(1);
        meta.tensors.clear();
        let out = round_trip(d.as_ref(), &meta, &data).unwrap().1;
        assert_eq!(
            (0..36).filter(|&i| out[i] != 0.0).collect::<Vec<_>>(),
            [29, 30, 31]
        );
    }

    #[test]
    fn rejects_bad_parameters_and_slices() {
        for (set, want) in [
            (
                ("sparsity", Value::Float(1.0)),
                "sparsity must be in [0, 1), got 1",
            ),
            (
                ("warmup_steps", Value::Integer(-1)),
                "warmup_steps must be >= 0, got -1",
            ),
            (
                ("warmup_stages", Value::FloatList(vec![0.5, -0.1])),
                "every warmup_stages value must be in [0, 1), got -0.1",
            ),
        ] {
            assert_eq!(codec(&[set]).unwrap_err(), want);
        }
        let d = codec(&[("selection", Value::Text("tensor".into()))]).unwrap();
        let (mut meta, data) = two_tensors(0);
        meta.tensors.swap(0, 1);
        assert!(
            d.encode(&meta, &data, &[])
                .unwrap_err()
                .contains("out of order")
        );
        assert_eq!(Dgc::info().name, "dgc");
    }
}
