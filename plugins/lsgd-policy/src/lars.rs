//! `lars`: You, Gitman and Ginsburg's layer-wise adaptive rate scaling ("Large Batch Training of
//! Convolutional Networks", 2017).

use crate::layer_rate::{exclude_spec, excluded, guarded};
use crate::util::{float_above, float_at_least};
use crate::{Info, LayerRate, ParamSpec, Params, Policy, State, TensorNorms};

/// The LARS trust ratio η·‖w‖ / (‖g‖ + λ‖w‖ + ε) per tensor, λ being the tensor's weight decay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lars {
    /// The trust coefficient η (the paper's 0.001).
    pub coefficient: f64,
    /// ε added to the denominator.
    pub eps: f64,
    /// Biases and BatchNorm parameters keep multiplier 1.
    pub exclude_bias_and_bn: bool,
    /// Cap the multiplier at 1, so LARS can only slow a layer down.
    pub clip: bool,
}

impl Policy for Lars {
    fn info() -> Info {
        Info::new(
            "lars",
            "LARS (You et al. 2017): per-tensor LR multiplier coefficient*|w|/(|g| + wd*|w| + eps)",
            vec![
                ParamSpec::float("coefficient", 0.001, "trust coefficient eta (> 0)"),
                ParamSpec::float("eps", 0.0, "added to the denominator (>= 0)"),
                exclude_spec(),
                ParamSpec::boolean(
                    "clip",
                    false,
                    "cap each multiplier at 1 (after LARC's clip mode)",
                ),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(Lars {
            coefficient: float_above(p, "coefficient", 0.0)?,
            eps: float_at_least(p, "eps", 0.0)?,
            exclude_bias_and_bn: p.boolean("exclude_bias_and_bn")?,
            clip: p.boolean("clip")?,
        })
    }
}

impl Lars {
    /// One tensor's multiplier. Evaluated as `coefficient * w / (g + wd * w + eps)`, in this
    /// order, so that a guest in another language can reproduce it bit for bit.
    pub fn multiplier(&self, t: &TensorNorms) -> f64 {
        if excluded(t.role, self.exclude_bias_and_bn) {
            return 1.0;
        }
        let (w, g, wd) = (t.weight_norm, t.grad_norm, t.weight_decay);
        let trust = guarded(w, g, || self.coefficient * w / (g + wd * w + self.eps));
        if self.clip && trust > 1.0 { 1.0 } else { trust }
    }
}

impl LayerRate for Lars {
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

    fn unit(set: &[(&str, Value)]) -> Lars {
        let mut set = set.to_vec();
        set.push(("coefficient", Value::Float(1.0)));
        configure(&set).unwrap()
    }

    #[test]
    fn paper_defaults() {
        let p: Lars = configure(&[]).unwrap();
        assert_eq!(
            p,
            Lars {
                coefficient: 0.001,
                eps: 0.0,
                exclude_bias_and_bn: true,
                clip: false
            }
        );
        // 0.001 * 2 / 1: doubling is exact, so this is the literal 0.002.
        assert_eq!(p.multiplier(&tensor(Weight, 2.0, 1.0, 9.0, 0.0)), 0.002);
    }

    #[test]
    fn hand_computed_trust_ratios() {
        let p = unit(&[]);
        // 3 / (1 + 0.5 * 3) = 3 / 2.5
        assert_eq!(p.multiplier(&tensor(Weight, 3.0, 1.0, 0.0, 0.5)), 1.2);
        // update_norm plays no part in LARS.
        assert_eq!(p.multiplier(&tensor(Weight, 3.0, 1.0, 1e9, 0.5)), 1.2);
        let q: Lars = configure(&[
            ("coefficient", Value::Float(0.5)),
            ("eps", Value::Float(1.0)),
        ])
        .unwrap();
        // 0.5 * 4 / (1 + 0.25 * 4 + 1) = 2 / 3
        assert_eq!(
            q.multiplier(&tensor(Weight, 4.0, 1.0, 0.0, 0.25)),
            2.0 / 3.0
        );
    }

    #[test]
    fn bit_exact_expression() {
        let p: Lars = configure(&[("eps", Value::Float(1e-9))]).unwrap();
        let (w, g, wd) = (1.37f64, 0.0123f64, 5e-5f64);
        let want = 0.001 * w / (g + wd * w + 1e-9);
        assert_eq!(
            p.multiplier(&tensor(Weight, w, g, 0.0, wd)).to_bits(),
            want.to_bits()
        );
    }

    #[test]
    fn zero_and_non_finite_norms_give_one() {
        let p = unit(&[]);
        for (w, g) in [
            (0.0, 1.0),
            (1.0, 0.0),
            (0.0, 0.0),
            (f64::NAN, 1.0),
            (1.0, f64::INFINITY),
        ] {
            assert_eq!(
                p.multiplier(&tensor(Weight, w, g, 1.0, 0.1)),
                1.0,
                "w={w} g={g}"
            );
        }
        // A positive eps does not make a zero gradient usable: without a gradient there is
        // no step to scale, and w/eps would be an arbitrary huge rate.
        let eps: Lars = configure(&[("eps", Value::Float(1e-8))]).unwrap();
        assert_eq!(eps.multiplier(&tensor(Weight, 1.0, 0.0, 1.0, 0.0)), 1.0);
    }

    #[test]
    fn excluded_roles() {
        let p = unit(&[]);
        let t = |role| tensor(role, 1.0, 4.0, 0.0, 0.0);
        let got = p.multipliers(&state_at(0.0), &[t(Weight), t(Bias), t(BatchNorm)]);
        assert_eq!(got, vec![0.25, 1.0, 1.0]);
        let all = unit(&[("exclude_bias_and_bn", Value::Boolean(false))]);
        let got = all.multipliers(&state_at(0.0), &[t(Weight), t(Bias), t(BatchNorm)]);
        assert_eq!(got, vec![0.25, 0.25, 0.25]);
        assert!(p.multipliers(&state_at(0.0), &[]).is_empty());
    }

    #[test]
    fn clipping_caps_at_one() {
        let clip = unit(&[("clip", Value::Boolean(true))]);
        assert_eq!(clip.multiplier(&tensor(Weight, 4.0, 1.0, 0.0, 0.0)), 1.0);
        assert_eq!(clip.multiplier(&tensor(Weight, 1.0, 4.0, 0.0, 0.0)), 0.25);
        let free = unit(&[]);
        assert_eq!(free.multiplier(&tensor(Weight, 4.0, 1.0, 0.0, 0.0)), 4.0);
    }

    #[test]
    fn configure_errors() {
        let err = error::<Lars>;
        assert_eq!(
            err(&[("coefficient", Value::Float(0.0))]),
            "coefficient must be > 0, got 0"
        );
        assert_eq!(
            err(&[("coefficient", Value::Float(f64::INFINITY))]),
            "coefficient must be > 0, got inf"
        );
        assert_eq!(
            err(&[("eps", Value::Float(-1.0))]),
            "eps must be >= 0, got -1"
        );
        assert_eq!(
            err(&[("clip", Value::Float(1.0))]),
            "parameter 'clip' must be a boolean, got a float"
        );
    }
}
