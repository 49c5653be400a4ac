//! `linear`: PyTorch's `LinearLR`, counted in optimizer steps.
//!
//! The closed form of `torch.optim.lr_scheduler.LinearLR` (`_get_closed_form_lr`), in its
//! operation order, over the scaled target η. Torch stepped without an epoch argument
//! multiplies its stored rate by a ratio at every step instead, which drifts from this form by
//! a few ulps (`scripts/torch-schedule-reference.py` prints that recursive form).

use crate::lr::Scaling;
use crate::{Info, ParamSpec, Params, Policy, Schedule, State};

/// η scaled by a factor that moves linearly from `start_factor` to `end_factor` over
/// `total_iters` steps and then stays.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Linear {
    /// How η follows the batch.
    pub scaling: Scaling,
    /// The factor at step 0, in (0, 1].
    pub start_factor: f64,
    /// The factor from step `total_iters` on, in [0, 1].
    pub end_factor: f64,
    /// Steps the factor takes to get from start to end, >= 1.
    pub total_iters: u64,
}

impl Policy for Linear {
    fn info() -> Info {
        let params = vec![
            Scaling::spec(),
            ParamSpec::float(
                "start_factor",
                1.0 / 3.0,
                "factor of eta at step 0, in (0, 1]",
            ),
            ParamSpec::float(
                "end_factor",
                1.0,
                "factor of eta from step total_iters on, in [0, 1]",
            ),
            ParamSpec::integer(
                "total_iters",
                5,
                "steps over which the factor moves from start to end (>= 1)",
            ),
        ];
        Info::new(
            "linear",
            "PyTorch's LinearLR in optimizer steps: eta times a linearly changing factor",
            params,
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        // Torch's own ranges; a zero start factor would make its recursive form divide by zero.
        let start_factor = p.float("start_factor")?;
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(format!(
                "start_factor must be in (0, 1], got {start_factor}"
            ));
        }
        let end_factor = crate::util::float_in(p, "end_factor", 0.0, 1.0)?;
        let total_iters = p.integer("total_iters")?;
        let total_iters = u64::try_from(total_iters)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| format!("total_iters must be >= 1, got {total_iters}"))?;
        Ok(Linear {
            scaling: Scaling::from_params(p)?,
            start_factor,
            end_factor,
            total_iters,
        })
    }
}

impl Schedule for Linear {
    fn learning_rate(&self, s: &State) -> f64 {
        let eta = self.scaling.target(s);
        let (start, end) = (self.start_factor, self.end_factor);
        let done = self.total_iters.min(s.step) as f64;
        eta * (start + (end - start) * done / self.total_iters as f64)
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
            global_batch: 512,
            worker_batch: 256,
            world_size: 2,
            base_lr: 0.05,
            reference_batch: 256,
            ..State::default()
        }
    }

    #[test]
    fn ramps_then_holds() {
        // Torch's docstring example: lr 0.05, start_factor 0.05, 40 iterations.
        let p: Linear = configure(&[
            ("scaling", text("none")),
            ("start_factor", Value::Float(0.05)),
            ("total_iters", Value::Integer(40)),
        ])
        .unwrap();
        let lr = |k| p.learning_rate(&at(k));
        assert_eq!(lr(0), 0.05 * 0.05);
        assert!((lr(1) - 0.0036875).abs() < 1e-15);
        assert!((lr(20) - 0.02625).abs() < 1e-15);
        assert_eq!(lr(40), 0.05);
        assert_eq!(lr(41), 0.05);
        assert_eq!(lr(1_000_000), 0.05, "beyond the ramp the end factor stays");
    }

    #[test]
    fn defaults_scale_eta_and_can_decay() {
        let p: Linear = configure(&[]).unwrap();
        // η = 0.05 · 512/256 = 0.1; factor 1/3 + (2/3)·k/5.
        assert_eq!(p.learning_rate(&at(0)), 0.1 * (1.0 / 3.0));
        assert!((p.learning_rate(&at(3)) - 0.1 * (1.0 / 3.0 + 0.4)).abs() < 1e-16);
        assert_eq!(p.learning_rate(&at(5)), 0.1);
        let down: Linear = configure(&[
            ("start_factor", Value::Float(1.0)),
            ("end_factor", Value::Float(0.0)),
            ("total_iters", Value::Integer(4)),
        ])
        .unwrap();
        assert_eq!(down.learning_rate(&at(2)), 0.05);
        assert_eq!(down.learning_rate(&at(4)), 0.0);
        assert_eq!(down.learning_rate(&at(9)), 0.0);
    }

    #[test]
    fn configure_errors() {
        let err = error::<Linear>;
        assert_eq!(
            err(&[("start_factor", Value::Float(0.0))]),
            "start_factor must be in (0, 1], got 0"
        );
        assert_eq!(
            err(&[("start_factor", Value::Float(f64::NAN))]),
            "start_factor must be in (0, 1], got NaN"
        );
        assert_eq!(
            err(&[("end_factor", Value::Float(1.5))]),
            "end_factor must be in [0, 1], got 1.5"
        );
        assert_eq!(
            err(&[("total_iters", Value::Integer(0))]),
            "total_iters must be >= 1, got 0"
        );
    }
}
