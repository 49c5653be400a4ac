//! `multistep`: PyTorch's `MultiStepLR`, with milestones in optimizer steps.
//!
//! The closed form of `torch.optim.lr_scheduler.MultiStepLR` (`_get_closed_form_lr`):
//! `base_lr * gamma ** bisect_right(milestones, step)`, over the scaled target η. Torch stepped
//! without an epoch argument multiplies its stored rate at each milestone instead, which can
//! differ from the power in the last ulp.

use crate::lr::Scaling;
use crate::util::{float_above, milestones, passed};
use crate::{Info, ParamSpec, Params, Policy, Schedule, State};

/// η multiplied by `gamma` once for every milestone the step has reached.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiStep {
    /// How η follows the batch.
    pub scaling: Scaling,
    /// Steps at which the rate drops, ascending whole numbers; a repeated one drops it twice.
    pub milestones: Vec<f64>,
    /// The factor of each drop.
    pub gamma: f64,
}

impl Policy for MultiStep {
    fn info() -> Info {
        let params = vec![
            Scaling::spec(),
            ParamSpec::float_list(
                "milestones",
                &[],
                "optimizer steps at which the LR is multiplied by gamma (ascending integers); \
                 none = constant",
            ),
            ParamSpec::float("gamma", 0.1, "factor of each drop (> 0)"),
        ];
        Info::new(
            "multistep",
            "PyTorch's MultiStepLR in optimizer steps: eta times gamma per milestone reached",
            params,
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let milestones = milestones(p, "milestones")?;
        if let Some(m) = milestones.iter().find(|m| m.fract() != 0.0) {
            return Err(format!("milestones must be whole steps, got {m}"));
        }
        Ok(MultiStep {
            scaling: Scaling::from_params(p)?,
            milestones,
            gamma: float_above(p, "gamma", 0.0)?,
        })
    }
}

impl Schedule for MultiStep {
    fn learning_rate(&self, s: &State) -> f64 {
        // Torch's bisect_right: milestones m <= step, so the drop applies at step m itself.
        let n = passed(&self.milestones, s.step as f64);
        self.scaling.target(s) * libm::pow(self.gamma, n as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::testing::{configure, error, text};

    fn at(step: u64) -> State {
        State {
            step,
            total_steps: 100,
            global_batch: 256,
            worker_batch: 256,
            world_size: 1,
            base_lr: 0.05,
            reference_batch: 256,
            ..State::default()
        }
    }

    #[test]
    fn drops_at_each_milestone() {
        // Torch's docstring example: 0.05, milestones 30 and 80.
        let p: MultiStep = configure(&[
            ("scaling", text("none")),
            ("milestones", Value::FloatList(vec![30.0, 80.0])),
        ])
        .unwrap();
        let lr = |k| p.learning_rate(&at(k));
        assert_eq!(lr(0), 0.05);
        assert_eq!(lr(29), 0.05);
        assert_eq!(lr(30), 0.05 * 0.1);
        assert_eq!(lr(79), 0.05 * 0.1);
        assert_eq!(lr(80), 0.05 * libm::pow(0.1, 2.0));
        assert!((lr(80) - 0.0005).abs() < 1e-18);
        assert_eq!(lr(1_000_000), lr(80), "past the last milestone");
    }

    #[test]
    fn step_zero_repeats_and_no_milestones() {
        let p: MultiStep = configure(&[
            ("milestones", Value::FloatList(vec![0.0, 10.0, 10.0])),
            ("gamma", Value::Float(0.5)),
        ])
        .unwrap();
        assert_eq!(
            p.learning_rate(&at(0)),
            0.025,
            "a milestone at 0 applies at step 0"
        );
        assert_eq!(
            p.learning_rate(&at(10)),
            0.00625,
            "a repeated one applies twice"
        );
        let constant: MultiStep = configure(&[]).unwrap();
        assert_eq!(constant.learning_rate(&at(99)), 0.05);
    }

    #[test]
    fn configure_errors() {
        let err = error::<MultiStep>;
        let list = |v: &[f64]| Value::FloatList(v.to_vec());
        assert_eq!(
            err(&[("milestones", list(&[10.0, 5.0]))]),
            "milestones must be ascending, got 5 after 10"
        );
        assert_eq!(
            err(&[("milestones", list(&[10.5]))]),
            "milestones must be whole steps, got 10.5"
        );
        assert_eq!(
            err(&[("milestones", list(&[-1.0]))]),
            "milestones must all be >= 0, got -1"
        );
        assert_eq!(
            err(&[("gamma", Value::Float(0.0))]),
            "gamma must be > 0, got 0"
        );
    }
}
