//! `cosine-annealing`: PyTorch's `CosineAnnealingLR`, counted in optimizer steps.
//!
//! The closed form of `torch.optim.lr_scheduler.CosineAnnealingLR` (`_get_closed_form_lr`), in
//! its operation order, over the scaled target η. Like torch's, it does not stop at `t_max`:
//! the cosine carries on and the rate climbs back towards η over the next `t_max` steps. Torch
//! stepped without an epoch argument updates its stored rate by a ratio at every step instead,
//! which drifts from this form by rounding (`scripts/torch-schedule-reference.py`).

use crate::lr::Scaling;
use crate::util::{count, float_at_least, steps_or_run};
use crate::{Info, ParamSpec, Params, Policy, Schedule, State};
use core::f64::consts::PI;

/// Cosine annealing from η at step 0 to `eta_min` at step `t_max`, without restarts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineAnnealing {
    /// How η follows the batch.
    pub scaling: Scaling,
    /// Half-period in steps; 0 = the run's `total_steps`.
    pub t_max: u64,
    /// The lowest rate, absolute (not scaled with the batch).
    pub eta_min: f64,
}

impl Policy for CosineAnnealing {
    fn info() -> Info {
        let params = vec![
            Scaling::spec(),
            ParamSpec::integer(
                "t_max",
                0,
                "steps from eta down to eta_min; 0 = the run's total steps",
            ),
            ParamSpec::float("eta_min", 0.0, "lowest LR, absolute (>= 0)"),
        ];
        Info::new(
            "cosine-annealing",
            "PyTorch's CosineAnnealingLR in optimizer steps: eta down to eta_min over t_max",
            params,
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(CosineAnnealing {
            scaling: Scaling::from_params(p)?,
            t_max: count(p, "t_max")?,
            eta_min: float_at_least(p, "eta_min", 0.0)?,
        })
    }
}

impl Schedule for CosineAnnealing {
    fn learning_rate(&self, s: &State) -> f64 {
        let eta = self.scaling.target(s);
        let t_max = steps_or_run(self.t_max, s) as f64;
        let eta_min = self.eta_min;
        eta_min + (eta - eta_min) * (1.0 + libm::cos(PI * s.step as f64 / t_max)) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::testing::{configure, error};

    fn at(step: u64) -> State {
        State {
            step,
            total_steps: 100,
            global_batch: 1024,
            worker_batch: 256,
            world_size: 4,
            base_lr: 0.1,
            reference_batch: 256,
            ..State::default()
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-15
    }

    #[test]
    fn over_the_run_by_default() {
        let p: CosineAnnealing = configure(&[]).unwrap();
        let lr = |k| p.learning_rate(&at(k));
        // η = 0.1 · 1024/256 = 0.4.
        assert_eq!(lr(0), 0.4);
        assert!(close(lr(50), 0.2));
        assert!(close(
            lr(25),
            0.2 * (1.0 + core::f64::consts::FRAC_1_SQRT_2)
        ));
        assert!(lr(99) > 0.0 && lr(99) < 1e-3);
        assert_eq!(lr(100), 0.0);
    }

    #[test]
    fn floor_and_past_t_max() {
        let p: CosineAnnealing = configure(&[
            ("t_max", Value::Integer(10)),
            ("eta_min", Value::Float(0.01)),
        ])
        .unwrap();
        let lr = |k| p.learning_rate(&at(k));
        assert!(close(lr(5), 0.205));
        assert_eq!(lr(10), 0.01);
        // As torch: the cosine continues, back up to η at 2·t_max.
        assert!(close(lr(15), 0.205));
        assert!(close(lr(20), 0.4));
    }

    #[test]
    fn a_run_of_unknown_length_is_one_step() {
        let p: CosineAnnealing = configure(&[]).unwrap();
        let s = State {
            total_steps: 0,
            ..at(1)
        };
        assert_eq!(p.learning_rate(&s), 0.0);
    }

    #[test]
    fn configure_errors() {
        let err = error::<CosineAnnealing>;
        assert_eq!(
            err(&[("t_max", Value::Integer(-3))]),
            "t_max must be >= 0, got -3"
        );
        assert_eq!(
            err(&[("eta_min", Value::Float(-0.1))]),
            "eta_min must be >= 0, got -0.1"
        );
    }
}
