//! `local-sgd`: local SGD (Lin et al. 2018, "Don't Use Large Mini-Batches, Use Local SGD";
//! Stich 2019), which with every rank taking part is Federated Averaging (McMahan et al. 2017):
//! every rank steps on its own and the ranks average their weights every `period` steps.

use crate::sync::{ends_period, period, period_spec};
use crate::{Info, OuterStep, Params, Policy, State, StepKind, SyncPolicy, TensorDrift, Window};

/// Local steps, and an average at every step that ends a period of H = `period` steps:
/// steps H − 1, 2H − 1 ..., torch's `PeriodicModelAverager(period=H, warmup_steps=H - 1)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalSgd {
    /// H, the steps of one window (1 averages after every step).
    pub period: u32,
}

impl Policy for LocalSgd {
    fn info() -> Info {
        Info::new(
            "local-sgd",
            "Local SGD / Federated Averaging over every rank: local steps, weights averaged every \
             `period` steps",
            vec![period_spec(
                8,
                "H: steps per window; the ranks average after steps H-1, 2H-1 ... (>= 1)",
            )],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(LocalSgd {
            period: period(p, "period")?,
        })
    }
}

impl SyncPolicy for LocalSgd {
    fn plan(&self, s: &State, _w: &Window) -> StepKind {
        if ends_period(s.step, self.period) {
            StepKind::Average
        } else {
            StepKind::Local
        }
    }

    fn outer_step(&mut self, _s: &State, _w: &Window, _tensors: &[TensorDrift]) -> OuterStep {
        OuterStep::average()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::sync::testing::{at, drift, plan_letters};
    use crate::testing::{configure, error};

    #[test]
    fn averages_at_the_end_of_every_period() {
        let p: LocalSgd = configure(&[]).unwrap();
        assert_eq!(p.period, 8);
        assert_eq!(plan_letters(&p, 16), "LLLLLLLALLLLLLLA");
        let four: LocalSgd = configure(&[("period", Value::Integer(4))]).unwrap();
        assert_eq!(plan_letters(&four, 12), "LLLALLLALLLA");
        let one: LocalSgd = configure(&[("period", Value::Integer(1))]).unwrap();
        assert_eq!(plan_letters(&one, 4), "AAAA");
    }

    #[test]
    fn torch_periodic_model_averager_with_warmup_h_minus_1() {
        // torch averages after optimizer step s when s >= warmup_steps and
        // (s - warmup_steps) % period == 0.
        for h in [1u32, 2, 3, 4, 8, 16] {
            let p = LocalSgd { period: h };
            let warmup = u64::from(h) - 1;
            for s in 0..100 {
                let torch = s >= warmup && (s - warmup) % u64::from(h) == 0;
                let ours = p.plan(&at(s, 1000), &Window::default()) == StepKind::Average;
                assert_eq!(ours, torch, "H={h} step {s}");
            }
        }
    }

    #[test]
    fn the_outer_step_is_plain_averaging() {
        let mut p: LocalSgd = configure(&[]).unwrap();
        let o = p.outer_step(&at(7, 100), &Window::default(), &[drift(1.0, 2.0)]);
        assert_eq!(o, OuterStep::average());
        assert_eq!((o.lr, o.momentum, o.nesterov), (1.0, 0.0, false));
    }

    #[test]
    fn configure_errors() {
        assert_eq!(
            error::<LocalSgd>(&[("period", Value::Integer(0))]),
            "period must be in [1, 4294967295], got 0"
        );
        assert_eq!(
            error::<LocalSgd>(&[("period", Value::Integer(-3))]),
            "period must be in [1, 4294967295], got -3"
        );
        assert_eq!(
            error::<LocalSgd>(&[("period", Value::Float(4.0))]),
            "parameter 'period' must be an integer, got a float"
        );
    }
}
