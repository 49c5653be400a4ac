//! `label-smoothing`: Szegedy et al.'s label smoothing (used by Mikami et al.), optionally ramped.

use crate::util::float_at_least;
use crate::{Info, LabelSmoothing, ParamSpec, Params, Policy, State};

/// ε moving linearly in e from `epsilon` to `final_epsilon` between two epochs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Smoothing {
    /// ε up to `ramp_start_epoch`.
    pub epsilon: f64,
    /// ε from `ramp_end_epoch` on (already resolved: never negative).
    pub final_epsilon: f64,
    /// Where the ramp begins.
    pub ramp_start_epoch: f64,
    /// Where the ramp ends; 0 means `total_epochs`.
    pub ramp_end_epoch: f64,
}

/// An ε in [0, 1) that stays below 1 after the f32 conversion the contract requires.
fn epsilon_param(p: &Params, name: &str) -> Result<f64, String> {
    let v = p.float(name)?;
    if v.is_finite() && v >= 0.0 && (v as f32) < 1.0 {
        Ok(v)
    } else {
        Err(format!("{name} must be in [0, 1), got {v}"))
    }
}

impl Policy for Smoothing {
    fn info() -> Info {
        Info::new(
            "label-smoothing",
            "Label-smoothing epsilon, constant or ramped linearly between two epochs",
            vec![
                ParamSpec::float("epsilon", 0.1, "epsilon at the start, in [0, 1)"),
                ParamSpec::float(
                    "final_epsilon",
                    -1.0,
                    "epsilon at the end of the ramp, in [0, 1); negative = same as epsilon",
                ),
                ParamSpec::float("ramp_start_epoch", 0.0, "epoch where the ramp begins"),
                ParamSpec::float(
                    "ramp_end_epoch",
                    0.0,
                    "epoch where the ramp ends; 0 = total epochs",
                ),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let epsilon = epsilon_param(p, "epsilon")?;
        // A negative default stands in for "none", which the WIT default cannot express for a float.
        let final_epsilon = if p.float("final_epsilon")? < 0.0 {
            epsilon
        } else {
            epsilon_param(p, "final_epsilon")?
        };
        let ramp_start_epoch = float_at_least(p, "ramp_start_epoch", 0.0)?;
        let ramp_end_epoch = float_at_least(p, "ramp_end_epoch", 0.0)?;
        if ramp_end_epoch > 0.0 && ramp_end_epoch < ramp_start_epoch {
            return Err(format!(
                "ramp_end_epoch must be >= ramp_start_epoch ({ramp_start_epoch}), got {ramp_end_epoch}"
            ));
        }
        Ok(Smoothing {
            epsilon,
            final_epsilon,
            ramp_start_epoch,
            ramp_end_epoch,
        })
    }
}

impl LabelSmoothing for Smoothing {
    fn epsilon(&self, s: &State) -> f32 {
        let (start, e) = (self.ramp_start_epoch, s.epoch_fraction);
        let end = if self.ramp_end_epoch == 0.0 {
            s.total_epochs as f64
        } else {
            self.ramp_end_epoch
        };
        let eps = if e <= start {
            self.epsilon
        } else if e >= end {
            self.final_epsilon
        } else {
            let v =
                self.epsilon + (self.final_epsilon - self.epsilon) * (e - start) / (end - start);
            // Rounding must not step outside the two endpoints, which are known to be valid.
            v.clamp(
                self.epsilon.min(self.final_epsilon),
                self.epsilon.max(self.final_epsilon),
            )
        };
        eps as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::testing::{configure, error, state_at};

    #[test]
    fn constant_by_default() {
        let p: Smoothing = configure(&[]).unwrap();
        assert_eq!(p.epsilon(&state_at(0.0)), 0.1f32);
        assert_eq!(p.epsilon(&state_at(89.0)), 0.1f32);
    }

    #[test]
    fn ramps_and_clamps() {
        let p: Smoothing = configure(&[
            ("epsilon", Value::Float(0.0)),
            ("final_epsilon", Value::Float(0.2)),
        ])
        .unwrap();
        assert_eq!(p.epsilon(&state_at(0.0)), 0.0);
        assert_eq!(p.epsilon(&state_at(45.0)), 0.1f32);
        assert_eq!(p.epsilon(&state_at(90.0)), 0.2f32);
        assert_eq!(p.epsilon(&state_at(120.0)), 0.2f32);

        let window: Smoothing = configure(&[
            ("epsilon", Value::Float(0.2)),
            ("final_epsilon", Value::Float(0.0)),
            ("ramp_start_epoch", Value::Float(10.0)),
            ("ramp_end_epoch", Value::Float(20.0)),
        ])
        .unwrap();
        assert_eq!(window.epsilon(&state_at(5.0)), 0.2f32);
        assert_eq!(window.epsilon(&state_at(15.0)), 0.1f32);
        assert_eq!(window.epsilon(&state_at(25.0)), 0.0);
    }

    #[test]
    fn configure_errors() {
        let err = error::<Smoothing>;
        assert_eq!(
            err(&[("epsilon", Value::Float(1.0))]),
            "epsilon must be in [0, 1), got 1"
        );
        assert_eq!(
            err(&[("epsilon", Value::Float(0.999_999_999))]),
            "epsilon must be in [0, 1), got 0.999999999"
        );
        assert_eq!(
            err(&[("final_epsilon", Value::Float(1.5))]),
            "final_epsilon must be in [0, 1), got 1.5"
        );
        assert_eq!(
            err(&[
                ("ramp_start_epoch", Value::Float(10.0)),
                ("ramp_end_epoch", Value::Float(5.0))
            ]),
            "ramp_end_epoch must be >= ramp_start_epoch (10), got 5"
        );
    }
}
