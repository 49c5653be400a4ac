//! `warmup`: Goyal et al.'s schedule — linear scaling, gradual warmup, then step decay.

use crate::lr::Warmup as Phase;
use crate::util::{float_at_least, milestones, passed};
use crate::{Info, ParamSpec, Params, Policy, Schedule, State};

/// Warmup to η, then η multiplied by `gamma` at each milestone epoch (Goyal: 30, 60, 80).
#[derive(Clone, Debug, PartialEq)]
pub struct Warmup {
    /// Scaling rule and warmup phase.
    pub phase: Phase,
    /// Epochs at which the rate is multiplied by `gamma`, ascending.
    pub milestones: Vec<f64>,
    /// Decay factor per milestone.
    pub gamma: f64,
}

impl Policy for Warmup {
    fn info() -> Info {
        let mut params = Phase::specs(5.0);
        params.push(ParamSpec::float_list(
            "milestones",
            &[30.0, 60.0, 80.0],
            "epochs at which the LR is multiplied by gamma (ascending)",
        ));
        params.push(ParamSpec::float(
            "gamma",
            0.1,
            "decay factor applied at each milestone",
        ));
        Info::new(
            "warmup",
            "Goyal et al.: LR scaling, gradual warmup, then step decay at milestones",
            params,
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(Warmup {
            phase: Phase::from_params(p)?,
            milestones: milestones(p, "milestones")?,
            gamma: float_at_least(p, "gamma", 0.0)?,
        })
    }
}

impl Schedule for Warmup {
    fn learning_rate(&self, s: &State) -> f64 {
        let eta = self.phase.scaling.target(s);
        if let Some(lr) = self.phase.during(s, eta) {
            return lr;
        }
        // Repeated multiplication, not powi: powi's rounding is not specified across languages.
        let mut lr = eta;
        for _ in 0..passed(&self.milestones, s.epoch_fraction) {
            lr *= self.gamma;
        }
        lr
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::testing::{configure, error, state_at, text};

    fn lr(p: &Warmup, e: f64) -> f64 {
        p.learning_rate(&state_at(e))
    }

    #[test]
    fn goyal_defaults() {
        let p: Warmup = configure(&[]).unwrap();
        let eta = 0.1 * 32.0;
        assert_eq!(lr(&p, 0.0), eta / 32.0, "step 0 starts at eta/k");
        assert_eq!(lr(&p, 5.0), eta, "exactly eta at e = W");
        assert_eq!(lr(&p, 29.999), eta);
        assert_eq!(lr(&p, 30.0), eta * 0.1);
        assert_eq!(lr(&p, 60.0), eta * 0.1 * 0.1);
        assert_eq!(lr(&p, 80.0), eta * 0.1 * 0.1 * 0.1);
        assert_eq!(lr(&p, 89.9), eta * 0.1 * 0.1 * 0.1);
        let mut prev = 0.0;
        for i in 0..50 {
            let now = lr(&p, i as f64 * 0.1);
            assert!(now > prev, "gradual warmup rises monotonically");
            prev = now;
        }
    }

    #[test]
    fn bit_exact_expression() {
        let p: Warmup = configure(&[]).unwrap();
        let (eta, k, e, w) = (3.2f64, 32.0f64, 1.37f64, 5.0f64);
        assert_eq!(
            lr(&p, e).to_bits(),
            (eta * (1.0 / k) * (1.0 + (k - 1.0) * e / w)).to_bits()
        );
    }

    #[test]
    fn scaling_rules() {
        let sqrt: Warmup =
            configure(&[("scaling", text("sqrt")), ("warmup", text("none"))]).unwrap();
        assert_eq!(lr(&sqrt, 0.0), 0.1 * 32f64.sqrt());
        let none: Warmup = configure(&[("scaling", text("none"))]).unwrap();
        assert_eq!(
            lr(&none, 0.0),
            0.1 / 32.0,
            "k still comes from the batch ratio"
        );
        assert_eq!(lr(&none, 10.0), 0.1);
    }

    #[test]
    fn constant_warmup_jumps() {
        let p: Warmup = configure(&[("warmup", text("constant"))]).unwrap();
        assert_eq!(lr(&p, 0.0), 0.1);
        assert_eq!(lr(&p, 4.99), 0.1);
        assert_eq!(lr(&p, 5.0), 3.2);
    }

    #[test]
    fn no_warmup_and_small_batch() {
        let p: Warmup = configure(&[("warmup", text("none"))]).unwrap();
        assert_eq!(lr(&p, 0.0), 3.2);
        let gradual: Warmup = configure(&[]).unwrap();
        let small = State {
            global_batch: 128,
            ..state_at(0.0)
        };
        assert_eq!(
            gradual.learning_rate(&small),
            0.05,
            "k = 1 below the reference batch"
        );
    }

    #[test]
    fn configure_errors() {
        let err = error::<Warmup>;
        assert_eq!(
            err(&[("warmup_epochs", Value::Float(-1.0))]),
            "warmup_epochs must be >= 0, got -1"
        );
        assert_eq!(
            err(&[("milestones", Value::FloatList(vec![60.0, 30.0]))]),
            "milestones must be ascending, got 30 after 60"
        );
        assert_eq!(
            err(&[("milestones", Value::FloatList(vec![-1.0]))]),
            "milestones must all be >= 0, got -1"
        );
        assert_eq!(
            err(&[("gamma", Value::Float(f64::NAN))]),
            "gamma must be >= 0, got NaN"
        );
    }
}
