//! `one-cycle`: PyTorch's `OneCycleLR` (Smith's 1cycle policy), learning rate and momentum,
//! counted in optimizer steps as torch counts them when its scheduler steps once per batch.
//!
//! `torch.optim.lr_scheduler.OneCycleLR.get_lr` line for line: the same phase boundaries
//! (`float(pct_start * total_steps) - 1` ...), the same phase search and the same annealing
//! expressions in the same order, so with max_lr = η torch's values come out bit for bit wherever
//! libm's `cos` and the C library's agree (`scripts/torch-schedule-reference.py` prints torch's).
//! The max learning rate is the scaled target η, as the other reference schedules' is.
//!
//! Where torch has no answer this keeps a finite one: past the last step (torch extrapolates at
//! `total_steps` and raises after it) the rate and momentum stay at their final values, and a
//! first phase of zero length (`pct_start * total_steps == 1`, where torch divides by zero)
//! counts as finished at step 0.

use crate::lr::Scaling;
use crate::util::{count, float_above, float_below, float_in, steps_or_run};
use crate::{Info, ParamSpec, Params, Policy, Schedule, State};
use core::f64::consts::PI;

/// How each phase interpolates between its start and end values (torch's `anneal_strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anneal {
    /// `end + (start - end) / 2 * (cos(π·pct) + 1)`.
    Cos,
    /// `(end - start) * pct + start`.
    Linear,
}

impl Anneal {
    /// From `start` at pct = 0 to `end` at pct = 1, in torch's operation order.
    pub fn at(self, start: f64, end: f64, pct: f64) -> f64 {
        match self {
            Anneal::Cos => {
                let cos_out = libm::cos(PI * pct) + 1.0;
                end + (start - end) / 2.0 * cos_out
            }
            Anneal::Linear => (end - start) * pct + start,
        }
    }
}

/// Which of torch's named group values a phase starts or ends at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Initial,
    Max,
    Min,
}

/// One of torch's `_schedule_phases`: where it ends and what it anneals between. Momentum
/// levels reuse [`Level`]: `Max` is `max_momentum`, `Initial` is `base_momentum`.
struct Phase {
    end_step: f64,
    lr: (Level, Level),
    momentum: (Level, Level),
}

/// OneCycleLR: up from η/`div_factor` to η, then down to η/`div_factor`/`final_div_factor`,
/// with momentum cycled the opposite way.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OneCycle {
    /// How the max learning rate η follows the batch.
    pub scaling: Scaling,
    /// Steps in the cycle; 0 = the run's `total_steps`.
    pub total_steps: u64,
    /// Fraction of the cycle spent increasing the learning rate.
    pub pct_start: f64,
    /// Cosine or linear annealing within each phase.
    pub anneal: Anneal,
    /// Initial learning rate = η / `div_factor`.
    pub div_factor: f64,
    /// Minimum learning rate = initial / `final_div_factor`.
    pub final_div_factor: f64,
    /// Fast.ai's three phases (up, back down to the initial rate, then to the minimum).
    pub three_phase: bool,
    /// Whether momentum is cycled inversely to the learning rate; if not, `momentum` is `None`.
    pub cycle_momentum: bool,
    /// The momentum where the learning rate peaks.
    pub base_momentum: f64,
    /// The momentum at the start and end of the cycle.
    pub max_momentum: f64,
}

impl Policy for OneCycle {
    fn info() -> Info {
        let params = vec![
            Scaling::spec(),
            ParamSpec::integer(
                "total_steps",
                0,
                "steps in the cycle; 0 = the run's total steps",
            ),
            ParamSpec::float(
                "pct_start",
                0.3,
                "fraction of the cycle spent increasing the LR (0..1)",
            ),
            ParamSpec::choice(
                "anneal_strategy",
                &["cos", "linear"],
                "annealing within each phase: cos or linear",
            ),
            ParamSpec::float("div_factor", 25.0, "initial LR = eta / div_factor (> 0)"),
            ParamSpec::float(
                "final_div_factor",
                1e4,
                "minimum LR = initial LR / final_div_factor (> 0)",
            ),
            ParamSpec::boolean(
                "three_phase",
                false,
                "a third phase: back down to the initial LR, then to the minimum",
            ),
            ParamSpec::boolean(
                "cycle_momentum",
                true,
                "cycle momentum (or AdamW's beta1) inversely to the LR",
            ),
            ParamSpec::float(
                "base_momentum",
                0.85,
                "momentum where the LR peaks, in [0, 1)",
            ),
            ParamSpec::float(
                "max_momentum",
                0.95,
                "momentum at the start and end of the cycle, in [0, 1)",
            ),
        ];
        Info::new(
            "one-cycle",
            "PyTorch's OneCycleLR in optimizer steps: LR up to eta and down, momentum cycled",
            params,
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let anneal = match p.text("anneal_strategy")? {
            "cos" => Anneal::Cos,
            "linear" => Anneal::Linear,
            other => {
                return Err(format!(
                    "anneal_strategy must be cos or linear, got '{other}'"
                ));
            }
        };
        Ok(OneCycle {
            scaling: Scaling::from_params(p)?,
            total_steps: count(p, "total_steps")?,
            pct_start: float_in(p, "pct_start", 0.0, 1.0)?,
            anneal,
            div_factor: float_above(p, "div_factor", 0.0)?,
            final_div_factor: float_above(p, "final_div_factor", 0.0)?,
            three_phase: p.boolean("three_phase")?,
            cycle_momentum: p.boolean("cycle_momentum")?,
            base_momentum: float_below(p, "base_momentum", 0.0, 1.0)?,
            max_momentum: float_below(p, "max_momentum", 0.0, 1.0)?,
        })
    }
}

impl OneCycle {
    /// Torch's `_schedule_phases` for a cycle of `total` steps.
    fn phases(&self, total: u64) -> ([Phase; 3], usize) {
        use Level::{Initial, Max, Min};
        let t = total as f64;
        let last = (total - 1) as f64;
        if self.three_phase {
            let phases = [
                Phase {
                    end_step: self.pct_start * t - 1.0,
                    lr: (Initial, Max),
                    momentum: (Max, Initial),
                },
                Phase {
                    end_step: 2.0 * self.pct_start * t - 2.0,
                    lr: (Max, Initial),
                    momentum: (Initial, Max),
                },
                Phase {
                    end_step: last,
                    lr: (Initial, Min),
                    momentum: (Max, Max),
                },
            ];
            (phases, 3)
        } else {
            let unused = Phase {
                end_step: last,
                lr: (Min, Min),
                momentum: (Max, Max),
            };
            let phases = [
                Phase {
                    end_step: self.pct_start * t - 1.0,
                    lr: (Initial, Max),
                    momentum: (Max, Initial),
                },
                Phase {
                    end_step: last,
                    lr: (Max, Min),
                    momentum: (Initial, Max),
                },
                unused,
            ];
            (phases, 2)
        }
    }

    /// Torch's phase search: the phase `s.step` falls in and the fraction `pct` of it done.
    fn locate(&self, s: &State) -> ((Level, Level), (Level, Level), f64) {
        let total = steps_or_run(self.total_steps, s);
        let (phases, n) = self.phases(total);
        // Past the cycle, its last step: torch would extrapolate the last phase, then raise.
        let step = s.step.min(total - 1) as f64;
        let mut start_step = 0.0;
        for (i, phase) in phases[..n].iter().enumerate() {
            let end_step = phase.end_step;
            if step <= end_step || i == n - 1 {
                let span = end_step - start_step;
                // Only a first phase ending at step 0 has no length; torch divides by zero there.
                let pct = if span == 0.0 {
                    1.0
                } else {
                    (step - start_step) / span
                };
                return (phase.lr, phase.momentum, pct);
            }
            start_step = end_step;
        }
        unreachable!("the last phase always matches")
    }
}

impl Schedule for OneCycle {
    fn learning_rate(&self, s: &State) -> f64 {
        let max_lr = self.scaling.target(s);
        let initial_lr = max_lr / self.div_factor;
        let min_lr = initial_lr / self.final_div_factor;
        let level = |l| match l {
            Level::Initial => initial_lr,
            Level::Max => max_lr,
            Level::Min => min_lr,
        };
        let ((start, end), _, pct) = self.locate(s);
        self.anneal.at(level(start), level(end), pct)
    }

    fn momentum(&self, s: &State) -> Option<f64> {
        if !self.cycle_momentum {
            return None;
        }
        let level = |l| match l {
            Level::Max => self.max_momentum,
            Level::Initial | Level::Min => self.base_momentum,
        };
        let (_, (start, end), pct) = self.locate(s);
        Some(self.anneal.at(level(start), level(end), pct))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::testing::{configure, error, text};

    /// Step `step` of a 100-step run at the reference batch with base_lr 1.
    fn at(step: u64) -> State {
        State {
            step,
            total_steps: 100,
            global_batch: 256,
            worker_batch: 256,
            world_size: 1,
            base_lr: 1.0,
            reference_batch: 256,
            ..State::default()
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1e-300)
    }

    #[test]
    fn two_phase_cos_endpoints_and_midpoints() {
        let p: OneCycle = configure(&[]).unwrap();
        let (lr, m) = (|k| p.learning_rate(&at(k)), |k| p.momentum(&at(k)).unwrap());
        // Phase 1 ends at step 0.3·100 − 1 = 29, phase 2 at 99. Torch's cos form does not land
        // on its start exactly: 1 + (0.04 − 1)/2·2 is 0.040000000000000036.
        assert_eq!(lr(0), 0.040000000000000036);
        assert_eq!(m(0), 0.95);
        assert_eq!(lr(29), 1.0);
        assert_eq!(m(29), 0.85);
        // cos(π·14/29) = 0.05413890858541761.
        assert!(close(lr(14), 1.0 - 0.48 * 1.054_138_908_585_417_6));
        // Phase 2 is 70 steps long: step 64 is halfway down.
        let min_lr = 0.04 / 1e4;
        assert!(close(lr(64), (1.0 + min_lr) / 2.0));
        assert!(close(m(64), 0.9));
        assert_eq!(lr(99), min_lr);
        assert_eq!(m(99), 0.95);
    }

    #[test]
    fn beyond_the_cycle_the_final_values_stay() {
        let p: OneCycle = configure(&[("total_steps", Value::Integer(50))]).unwrap();
        let last = p.learning_rate(&at(49));
        assert_eq!(last, 1.0 / 25.0 / 1e4);
        for k in [50, 51, 99, 10_000] {
            assert_eq!(p.learning_rate(&at(k)), last, "step {k}");
            assert_eq!(p.momentum(&at(k)), Some(0.95), "step {k}");
        }
    }

    #[test]
    fn linear_three_phase_and_no_momentum() {
        let p: OneCycle = configure(&[
            ("anneal_strategy", text("linear")),
            ("three_phase", Value::Boolean(true)),
            ("pct_start", Value::Float(0.25)),
            ("cycle_momentum", Value::Boolean(false)),
            ("div_factor", Value::Float(10.0)),
            ("final_div_factor", Value::Float(100.0)),
        ])
        .unwrap();
        let lr = |k| p.learning_rate(&at(k));
        // Ends: 24, 48, 99.
        assert_eq!(lr(0), 0.1);
        assert_eq!(lr(24), 1.0);
        assert!(close(lr(36), 0.55));
        assert!(close(lr(48), 0.1));
        // pct = (99 − 48) / 51 = 1 at the last step; the linear form lands on 0.001 up to rounding.
        assert!(close(lr(99), 0.001));
        assert!(close(lr(48 + 17), 0.1 + (0.001 - 0.1) / 3.0));
        assert_eq!(p.momentum(&at(10)), None);
    }

    #[test]
    fn total_steps_follows_the_run_and_scaling_the_batch() {
        let p: OneCycle = configure(&[]).unwrap();
        let doubled = State {
            global_batch: 512,
            total_steps: 50,
            ..at(14)
        };
        // 50 steps: phase 1 ends at 14, where the doubled batch's η = 2 is reached.
        assert_eq!(p.learning_rate(&doubled), 2.0);
        let no_total = State {
            total_steps: 0,
            ..at(0)
        };
        assert_eq!(
            p.learning_rate(&no_total),
            0.04 / 1e4,
            "a run of one step is all last phase"
        );
    }

    #[test]
    fn a_first_phase_ending_at_step_zero_is_finished() {
        // pct_start · total = 1: torch divides 0 by 0 here.
        let p: OneCycle = configure(&[
            ("total_steps", Value::Integer(10)),
            ("pct_start", Value::Float(0.1)),
        ])
        .unwrap();
        assert_eq!(p.learning_rate(&at(0)), 1.0);
        assert_eq!(p.momentum(&at(0)), Some(0.85));
        assert!(p.learning_rate(&at(1)) < 1.0);
    }

    #[test]
    fn configure_errors() {
        let err = error::<OneCycle>;
        assert_eq!(
            err(&[("total_steps", Value::Integer(-1))]),
            "total_steps must be >= 0, got -1"
        );
        assert_eq!(
            err(&[("pct_start", Value::Float(1.5))]),
            "pct_start must be in [0, 1], got 1.5"
        );
        assert_eq!(
            err(&[("div_factor", Value::Float(0.0))]),
            "div_factor must be > 0, got 0"
        );
        assert_eq!(
            err(&[("final_div_factor", Value::Float(f64::INFINITY))]),
            "final_div_factor must be > 0, got inf"
        );
        assert_eq!(
            err(&[("max_momentum", Value::Float(1.0))]),
            "max_momentum must be in [0, 1), got 1"
        );
        assert_eq!(
            err(&[("base_momentum", Value::Float(-0.1))]),
            "base_momentum must be in [0, 1), got -0.1"
        );
        assert_eq!(
            err(&[("anneal_strategy", text("exp"))]),
            "parameter 'anneal_strategy' must be one of cos, linear, got 'exp'"
        );
    }
}
