//! `lamb`: the layer-wise trust ratio of You et al.'s LAMB ("Large Batch Optimization for Deep
//! Learning: Training BERT in 76 minutes", 2019), applied to the host's AdamW update.

use crate::layer_rate::{exclude_spec, excluded, guarded};
use crate::util::float_at_least;
use crate::{Info, LayerRate, ParamSpec, Params, Policy, State, TensorNorms};

/// The LAMB trust ratio φ(‖w‖/‖u‖) per tensor, φ clamping to `[min_ratio, max_ratio]`, with
/// ‖u‖ the AdamW update including weight decay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lamb {
    /// Lower bound of the ratio.
    pub min_ratio: f64,
    /// Upper bound of the ratio, so a near-zero update cannot blow a layer's rate up.
    pub max_ratio: f64,
    /// Biases and BatchNorm parameters keep multiplier 1.
    pub exclude_bias_and_bn: bool,
}

impl Policy for Lamb {
    fn info() -> Info {
        Info::new(
            "lamb",
            "LAMB (You et al. 2019): per-tensor LR multiplier clamp(|w|/|u|, min_ratio, max_ratio)",
            vec![
                ParamSpec::float("min_ratio", 0.0, "lower bound of the trust ratio (>= 0)"),
                ParamSpec::float(
                    "max_ratio",
                    10.0,
                    "upper bound of the trust ratio (>= min_ratio)",
                ),
                exclude_spec(),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let min_ratio = float_at_least(p, "min_ratio", 0.0)?;
        let max_ratio = p.float("max_ratio")?;
        if !(max_ratio.is_finite() && max_ratio >= min_ratio) {
            return Err(format!(
                "max_ratio must be finite and >= min_ratio ({min_ratio}), got {max_ratio}"
            ));
        }
        Ok(Lamb {
            min_ratio,
            max_ratio,
            exclude_bias_and_bn: p.boolean("exclude_bias_and_bn")?,
        })
    }
}

impl Lamb {
    /// One tensor's multiplier: `w / u`, clamped.
    pub fn multiplier(&self, t: &TensorNorms) -> f64 {
        if excluded(t.role, self.exclude_bias_and_bn) {
            return 1.0;
        }
        let (w, u) = (t.weight_norm, t.update_norm);
        guarded(w, u, || (w / u).clamp(self.min_ratio, self.max_ratio))
    }
}

impl LayerRate for Lamb {
    fn multipliers(&self, _s: &State, tensors: &[TensorNorms]) -> Vec<f64> {
        tensors.iter().map(|t| self.multiplier(t)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Role::{BatchNorm, Bias, Weight};
    use crate::Value;
    use crate::layer_rate::testing::tensor;
    use crate::testing::{configure, error, state_at};

    #[test]
    fn hand_computed_ratios() {
        let p: Lamb = configure(&[]).unwrap();
        // 2 / 4; the gradient norm and weight decay play no part (the decay is inside u).
        assert_eq!(p.multiplier(&tensor(Weight, 2.0, 1e6, 4.0, 0.3)), 0.5);
        assert_eq!(p.multiplier(&tensor(Weight, 3.0, 0.0, 0.5, 0.0)), 6.0);
        assert_eq!(p.multiplier(&tensor(Weight, 1.0, 1.0, 3.0, 0.0)), 1.0 / 3.0);
    }

    #[test]
    fn clamped_to_the_ratio_bounds() {
        let p: Lamb = configure(&[("min_ratio", Value::Float(0.1))]).unwrap();
        assert_eq!(p.multiplier(&tensor(Weight, 30.0, 1.0, 1.0, 0.0)), 10.0);
        assert_eq!(p.multiplier(&tensor(Weight, 1.0, 1.0, 100.0, 0.0)), 0.1);
        let pinned: Lamb = configure(&[
            ("min_ratio", Value::Float(2.0)),
            ("max_ratio", Value::Float(2.0)),
        ])
        .unwrap();
        assert_eq!(
            pinned.multiplier(&tensor(Weight, 1.0, 1.0, 100.0, 0.0)),
            2.0
        );
    }

    #[test]
    fn zero_norms_give_one_even_outside_the_bounds() {
        let p: Lamb = configure(&[
            ("min_ratio", Value::Float(2.0)),
            ("max_ratio", Value::Float(3.0)),
        ])
        .unwrap();
        for (w, u) in [(0.0, 1.0), (1.0, 0.0), (0.0, 0.0), (1.0, f64::NAN)] {
            assert_eq!(
                p.multiplier(&tensor(Weight, w, 1.0, u, 0.0)),
                1.0,
                "w={w} u={u}"
            );
        }
    }

    #[test]
    fn excluded_roles() {
        let p: Lamb = configure(&[]).unwrap();
        let t = |role| tensor(role, 1.0, 1.0, 4.0, 0.0);
        let got = p.multipliers(&state_at(0.0), &[t(Bias), t(Weight), t(BatchNorm)]);
        assert_eq!(got, vec![1.0, 0.25, 1.0]);
        let all: Lamb = configure(&[("exclude_bias_and_bn", Value::Boolean(false))]).unwrap();
        let got = all.multipliers(&state_at(0.0), &[t(Bias), t(Weight), t(BatchNorm)]);
        assert_eq!(got, vec![0.25, 0.25, 0.25]);
    }

    #[test]
    fn configure_errors() {
        let err = error::<Lamb>;
        assert_eq!(
            err(&[("min_ratio", Value::Float(-0.5))]),
            "min_ratio must be >= 0, got -0.5"
        );
        assert_eq!(
            err(&[("max_ratio", Value::Float(-1.0))]),
            "max_ratio must be finite and >= min_ratio (0), got -1"
        );
        assert_eq!(
            err(&[
                ("min_ratio", Value::Float(2.0)),
                ("max_ratio", Value::Float(1.0))
            ]),
            "max_ratio must be finite and >= min_ratio (2), got 1"
        );
        assert_eq!(
            err(&[("max_ratio", Value::Float(f64::INFINITY))]),
            "max_ratio must be finite and >= min_ratio (0), got inf"
        );
    }
}
