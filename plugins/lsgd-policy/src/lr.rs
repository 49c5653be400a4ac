//! The scaling rules and the warmup phase that the warmup, cosine, poly and constant schedules share.
//!
//! Only `+ - * /` and `sqrt` appear here (all correctly rounded in IEEE 754), so a guest in any
//! language that evaluates the same expressions in the same order reproduces them bit for bit.

use crate::util::float_at_least;
use crate::{ParamSpec, Params, State};

/// How the target learning rate η grows with the global batch B relative to the reference B_ref.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scaling {
    /// Goyal's linear scaling rule: η = base_lr · r.
    Linear,
    /// Square-root scaling, which keeps the gradient-noise variance constant: η = base_lr · √r.
    Sqrt,
    /// η = base_lr, for when the user already scaled it.
    None,
}

/// The shape of the learning rate during the first `warmup_epochs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarmupShape {
    /// Goyal's gradual warmup, linear in e from η/k to η.
    Gradual,
    /// η/k throughout, then a jump to η: the variant Goyal found to spike the loss.
    Constant,
    /// No warmup at all.
    None,
}

/// The batch ratio r = B / B_ref in f64, with `reference_batch == 0` read as r = 1 so a
/// misconfigured state cannot produce an infinite learning rate.
pub fn batch_ratio(s: &State) -> f64 {
    if s.reference_batch == 0 {
        1.0
    } else {
        s.global_batch as f64 / s.reference_batch as f64
    }
}

/// Goyal's k: the batch ratio, but never below 1 so a small batch never warms up downwards.
pub fn warmup_k(s: &State) -> f64 {
    let r = batch_ratio(s);
    if r > 1.0 { r } else { 1.0 }
}

impl Scaling {
    /// The `scaling` parameter, shared so every schedule documents it identically.
    pub fn spec() -> ParamSpec {
        ParamSpec::choice(
            "scaling",
            &["linear", "sqrt", "none"],
            "target LR from base_lr: linear (x B/B_ref), sqrt (x sqrt(B/B_ref)) or none",
        )
    }

    /// Reads the `scaling` parameter.
    pub fn from_params(p: &Params) -> Result<Self, String> {
        match p.text("scaling")? {
            "linear" => Ok(Scaling::Linear),
            "sqrt" => Ok(Scaling::Sqrt),
            "none" => Ok(Scaling::None),
            other => Err(format!(
                "scaling must be linear, sqrt or none, got '{other}'"
            )),
        }
    }

    /// The target learning rate η for this state's batch.
    pub fn target(self, s: &State) -> f64 {
        match self {
            Scaling::Linear => s.base_lr * batch_ratio(s),
            Scaling::Sqrt => s.base_lr * batch_ratio(s).sqrt(),
            Scaling::None => s.base_lr,
        }
    }
}

/// The scaling rule plus the warmup phase that precedes every reference schedule's main phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Warmup {
    /// How η follows the batch.
    pub scaling: Scaling,
    /// Gradual, constant or no warmup.
    pub shape: WarmupShape,
    /// W, the warmup length in epochs.
    pub epochs: f64,
}

impl Warmup {
    /// The `scaling`, `warmup` and `warmup_epochs` parameters; schedules differ only in W's default.
    pub fn specs(default_epochs: f64) -> Vec<ParamSpec> {
        vec![
            Scaling::spec(),
            ParamSpec::choice(
                "warmup",
                &["gradual", "constant", "none"],
                "warmup shape: gradual (eta/k rising to eta), constant (eta/k) or none",
            ),
            ParamSpec::float("warmup_epochs", default_epochs, "warmup length W in epochs"),
        ]
    }

    /// Reads and range-checks the parameters of [`Warmup::specs`].
    pub fn from_params(p: &Params) -> Result<Self, String> {
        let shape = match p.text("warmup")? {
            "gradual" => WarmupShape::Gradual,
            "constant" => WarmupShape::Constant,
            "none" => WarmupShape::None,
            other => {
                return Err(format!(
                    "warmup must be gradual, constant or none, got '{other}'"
                ));
            }
        };
        let epochs = float_at_least(p, "warmup_epochs", 0.0)?;
        let epochs = if shape == WarmupShape::None {
            0.0
        } else {
            epochs
        };
        Ok(Warmup {
            scaling: Scaling::from_params(p)?,
            shape,
            epochs,
        })
    }

    /// The warmup learning rate while e < W, `None` once the main phase has begun.
    ///
    /// Gradual is `eta * (1.0 / k) * (1.0 + (k - 1.0) * e / w)`, evaluated left to right; other
    /// languages must keep that order to match bit for bit. At e = W it hands over to exactly η.
    pub fn during(&self, s: &State, eta: f64) -> Option<f64> {
        let (e, w) = (s.epoch_fraction, self.epochs);
        if e >= w {
            return None;
        }
        let k = warmup_k(s);
        match self.shape {
            WarmupShape::Gradual => Some(eta * (1.0 / k) * (1.0 + (k - 1.0) * e / w)),
            WarmupShape::Constant => Some(eta / k),
            WarmupShape::None => None,
        }
    }

    /// Fraction t in [0, 1] of the main phase from W to `end` epochs, for cosine and poly; a main
    /// phase of zero length counts as finished.
    pub fn progress(&self, s: &State, end: f64) -> f64 {
        let span = end - self.epochs;
        if span <= 0.0 {
            return 1.0;
        }
        let t = (s.epoch_fraction - self.epochs) / span;
        t.clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::state_at;

    #[test]
    fn ratio_guards_zero_reference() {
        let s = State {
            global_batch: 512,
            reference_batch: 0,
            ..state_at(0.0)
        };
        assert_eq!(batch_ratio(&s), 1.0);
        let small = State {
            global_batch: 128,
            ..state_at(0.0)
        };
        assert_eq!(batch_ratio(&small), 0.5);
        assert_eq!(warmup_k(&small), 1.0);
        assert_eq!(warmup_k(&state_at(0.0)), 32.0);
    }

    #[test]
    fn gradual_is_linear_in_e() {
        let w = Warmup {
            scaling: Scaling::Linear,
            shape: WarmupShape::Gradual,
            epochs: 5.0,
        };
        let eta = 3.2;
        let mid = w.during(&state_at(2.5), eta).unwrap();
        assert!((mid - (0.1 + 3.2) / 2.0).abs() < 1e-12, "{mid}");
        assert_eq!(w.during(&state_at(5.0), eta), None);
    }
}
