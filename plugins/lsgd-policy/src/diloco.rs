//! `diloco`: DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of
//! Language Models"): H inner steps of the run's optimizer on every rank, then an outer
//! Nesterov SGD step on the averaged pseudo-gradient Δ = θ_global − mean_k θ_k.

use crate::sync::{ends_period, outer_from_params, outer_specs, period, period_spec};
use crate::{Info, OuterStep, Params, Policy, State, StepKind, SyncPolicy, TensorDrift, Window};

/// Local steps, a window ending every H = `period` steps (steps H − 1, 2H − 1 ..., as
/// `local-sgd`), and the paper's outer step: SGD with lr 0.7, momentum 0.9, Nesterov.
#[derive(Clone, Debug, PartialEq)]
pub struct Diloco {
    /// H, the inner steps of one window.
    pub period: u32,
    /// The outer learning rate (the paper's 0.7).
    pub outer_lr: f64,
    /// The outer momentum (the paper's 0.9).
    pub outer_momentum: f64,
    /// Nesterov's form of the outer momentum (the paper's choice).
    pub nesterov: bool,
}

impl Policy for Diloco {
    fn info() -> Info {
        let mut params = vec![period_spec(
            16,
            "H: inner steps per window; the paper's 500 is longer than our whole jobs (>= 1)",
        )];
        params.extend(outer_specs(0.7, 0.9, true));
        Info::new(
            "diloco",
            "DiLoCo (Douillard et al. 2023): `period` inner steps, then outer Nesterov SGD on the \
             averaged pseudo-gradient",
            params,
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let outer = outer_from_params(p)?;
        Ok(Diloco {
            period: period(p, "period")?,
            outer_lr: outer.lr,
            outer_momentum: outer.momentum,
            nesterov: outer.nesterov,
        })
    }
}

impl SyncPolicy for Diloco {
    fn plan(&self, s: &State, _w: &Window) -> StepKind {
        if ends_period(s.step, self.period) {
            StepKind::Average
        } else {
            StepKind::Local
        }
    }

    fn outer_step(&mut self, _s: &State, _w: &Window, _tensors: &[TensorDrift]) -> OuterStep {
        OuterStep {
            lr: self.outer_lr,
            momentum: self.outer_momentum,
            nesterov: self.nesterov,
            lr_scale: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::sync::testing::{at, drift, letters};
    use crate::testing::{configure, error};

    #[test]
    fn paper_outer_step_every_period() {
        let mut p: Diloco = configure(&[]).unwrap();
        assert_eq!(
            p,
            Diloco {
                period: 16,
                outer_lr: 0.7,
                outer_momentum: 0.9,
                nesterov: true
            }
        );
        let mut w = Window::default();
        let kinds: Vec<StepKind> = (0..32)
            .map(|s| {
                let k = p.plan(&at(s, 1000), &w);
                w = w.after(k);
                k
            })
            .collect();
        assert_eq!(letters(&kinds), format!("{0}A{0}A", "L".repeat(15)));
        assert_eq!(w.windows, 2);
        let o = p.outer_step(&at(15, 1000), &Window::default(), &[drift(1.0, 2.0)]);
        assert_eq!(
            o,
            OuterStep {
                lr: 0.7,
                momentum: 0.9,
                nesterov: true,
                lr_scale: vec![]
            }
        );
    }

    #[test]
    fn outer_parameters_reach_the_outer_step() {
        let mut p: Diloco = configure(&[
            ("period", Value::Integer(4)),
            ("outer_lr", Value::Float(1.0)),
            ("outer_momentum", Value::Float(0.0)),
            ("nesterov", Value::Boolean(false)),
        ])
        .unwrap();
        assert_eq!(p.plan(&at(3, 100), &Window::default()), StepKind::Average);
        assert_eq!(
            p.outer_step(&at(3, 100), &Window::default(), &[]),
            OuterStep::average(),
            "lr 1, momentum 0 is local SGD"
        );
    }

    #[test]
    fn configure_errors() {
        let err = error::<Diloco>;
        assert_eq!(
            err(&[("outer_lr", Value::Float(-0.1))]),
            "outer_lr must be >= 0, got -0.1"
        );
        assert_eq!(
            err(&[("outer_lr", Value::Float(f64::NAN))]),
            "outer_lr must be >= 0, got NaN"
        );
        assert_eq!(
            err(&[("outer_momentum", Value::Float(1.0))]),
            "outer_momentum must be in [0, 1), got 1"
        );
        assert_eq!(
            err(&[("outer_momentum", Value::Float(-0.5))]),
            "outer_momentum must be in [0, 1), got -0.5"
        );
        assert_eq!(
            err(&[("period", Value::Integer(0))]),
            "period must be in [1, 4294967295], got 0"
        );
        assert!(configure::<Diloco>(&[("outer_lr", Value::Float(0.0))]).is_ok());
    }
}
