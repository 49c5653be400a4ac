//! `poly`: warmup, then polynomial decay η·(1−t)^power with a floor.

use crate::lr::Warmup;
use crate::util::{float_at_least, float_in};
use crate::{Info, ParamSpec, Params, Policy, Schedule, State};

/// Polynomial decay over the post-warmup epochs, as in the LARS large-batch recipes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Poly {
    /// Scaling rule and warmup phase.
    pub warmup: Warmup,
    /// The exponent; 1 is linear decay, 2 the usual LARS choice.
    pub power: f64,
    /// The floor as a fraction of η.
    pub final_lr_factor: f64,
}

impl Policy for Poly {
    fn info() -> Info {
        let mut params = Warmup::specs(0.0);
        params.extend([
            ParamSpec::float("power", 2.0, "decay exponent: eta * (1 - t)^power"),
            ParamSpec::float(
                "final_lr_factor",
                0.0,
                "lowest LR, as a fraction of eta (0..1)",
            ),
        ]);
        Info::new(
            "poly",
            "Warmup, then polynomial decay eta * (1 - t)^power with a floor",
            params,
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(Poly {
            warmup: Warmup::from_params(p)?,
            power: float_at_least(p, "power", 0.0)?,
            final_lr_factor: float_in(p, "final_lr_factor", 0.0, 1.0)?,
        })
    }
}

impl Schedule for Poly {
    fn learning_rate(&self, s: &State) -> f64 {
        let eta = self.warmup.scaling.target(s);
        if let Some(lr) = self.warmup.during(s, eta) {
            return lr;
        }
        let t = self.warmup.progress(s, s.total_epochs as f64);
        let lr = eta * libm::pow(1.0 - t, self.power);
        let floor = self.final_lr_factor * eta;
        if lr > floor { lr } else { floor }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::testing::{configure, error, state_at, text};

    #[test]
    fn endpoints() {
        let p: Poly = configure(&[]).unwrap();
        let lr = |e| p.learning_rate(&state_at(e));
        assert_eq!(lr(0.0), 3.2);
        assert_eq!(lr(45.0), 3.2 * 0.25);
        assert_eq!(lr(90.0), 0.0);
    }

    #[test]
    fn warmup_power_and_floor() {
        let p: Poly = configure(&[
            ("warmup_epochs", Value::Float(10.0)),
            ("power", Value::Float(1.0)),
            ("final_lr_factor", Value::Float(0.1)),
            ("scaling", text("none")),
        ])
        .unwrap();
        let lr = |e| p.learning_rate(&state_at(e));
        assert_eq!(lr(0.0), 0.1 / 32.0);
        assert_eq!(lr(10.0), 0.1);
        assert!((lr(50.0) - 0.05).abs() < 1e-15);
        assert_eq!(lr(89.0), 0.1 * 0.1, "floored");
    }

    #[test]
    fn configure_errors() {
        let err = error::<Poly>;
        assert_eq!(
            err(&[("power", Value::Float(-1.0))]),
            "power must be >= 0, got -1"
        );
        assert_eq!(
            err(&[("final_lr_factor", Value::Float(-0.1))]),
            "final_lr_factor must be in [0, 1], got -0.1"
        );
    }
}
