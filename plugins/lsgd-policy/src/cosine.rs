//! `cosine`: warmup, then cosine annealing to a floor, optionally with SGDR warm restarts.

use crate::lr::Warmup;
use crate::util::{float_at_least, float_in};
use crate::{Info, ParamSpec, Params, Policy, Schedule, State};
use core::f64::consts::PI;

/// Cosine annealing from η down to `final_lr_factor`·η (Loshchilov & Hutter's SGDR when restarts are on).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cosine {
    /// Scaling rule and warmup phase.
    pub warmup: Warmup,
    /// The floor as a fraction of η.
    pub final_lr_factor: f64,
    /// Length of the first annealing cycle in epochs; 0 anneals once, up to `total_epochs`.
    pub restart_epochs: f64,
    /// Each cycle is this many times longer than the previous one.
    pub restart_mult: f64,
}

impl Policy for Cosine {
    fn info() -> Info {
        let mut params = Warmup::specs(0.0);
        params.extend([
            ParamSpec::float(
                "final_lr_factor",
                0.0,
                "LR at the end of each cycle, as a fraction of eta (0..1)",
            ),
            ParamSpec::float(
                "restart_epochs",
                0.0,
                "first SGDR cycle length in epochs; 0 = no restarts",
            ),
            ParamSpec::float(
                "restart_mult",
                1.0,
                "each SGDR cycle is this many times the previous one (>= 1)",
            ),
        ]);
        Info::new(
            "cosine",
            "Warmup, then cosine annealing to a floor, with optional SGDR restarts",
            params,
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(Cosine {
            warmup: Warmup::from_params(p)?,
            final_lr_factor: float_in(p, "final_lr_factor", 0.0, 1.0)?,
            restart_epochs: float_at_least(p, "restart_epochs", 0.0)?,
            restart_mult: float_at_least(p, "restart_mult", 1.0)?,
        })
    }
}

impl Cosine {
    /// Position t in [0, 1] inside the current SGDR cycle, in closed form so that tiny cycles
    /// stay O(1) per call.
    fn cycle_position(&self, x: f64) -> f64 {
        let (r, m) = (self.restart_epochs, self.restart_mult);
        let (start, len) = if m == 1.0 {
            let n = (x / r).floor();
            (n * r, r)
        } else {
            // Cycle n starts at r·(m^n − 1)/(m − 1); invert that for n.
            let n = (libm::log(1.0 + x * (m - 1.0) / r) / libm::log(m)).floor();
            let mn = libm::pow(m, n);
            (r * (mn - 1.0) / (m - 1.0), r * mn)
        };
        ((x - start) / len).clamp(0.0, 1.0)
    }
}

impl Schedule for Cosine {
    fn learning_rate(&self, s: &State) -> f64 {
        let eta = self.warmup.scaling.target(s);
        if let Some(lr) = self.warmup.during(s, eta) {
            return lr;
        }
        let t = if self.restart_epochs > 0.0 {
            self.cycle_position(s.epoch_fraction - self.warmup.epochs)
        } else {
            self.warmup.progress(s, s.total_epochs as f64)
        };
        let floor = self.final_lr_factor * eta;
        floor + (eta - floor) * 0.5 * (1.0 + libm::cos(PI * t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::testing::{configure, error, state_at};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn endpoints_without_warmup() {
        let p: Cosine = configure(&[]).unwrap();
        let lr = |e| p.learning_rate(&state_at(e));
        assert_eq!(lr(0.0), 3.2);
        assert!(close(lr(45.0), 1.6));
        assert!(close(lr(90.0), 0.0));
        assert!(close(lr(200.0), 0.0), "clamped past the end");
    }

    #[test]
    fn warmup_then_floor() {
        let p: Cosine = configure(&[
            ("warmup_epochs", Value::Float(5.0)),
            ("final_lr_factor", Value::Float(0.01)),
        ])
        .unwrap();
        let lr = |e| p.learning_rate(&state_at(e));
        assert_eq!(lr(0.0), 0.1);
        assert_eq!(lr(5.0), 3.2);
        assert!(close(lr(47.5), (3.2 + 0.032) / 2.0));
        assert!(close(lr(90.0), 0.032));
    }

    #[test]
    fn sgdr_restarts() {
        let p: Cosine = configure(&[("restart_epochs", Value::Float(10.0))]).unwrap();
        let lr = |e| p.learning_rate(&state_at(e));
        assert!(close(lr(5.0), 1.6));
        assert_eq!(lr(10.0), 3.2, "restart at the cycle boundary");
        assert!(close(lr(35.0), 1.6));

        let doubling: Cosine = configure(&[
            ("restart_epochs", Value::Float(10.0)),
            ("restart_mult", Value::Float(2.0)),
        ])
        .unwrap();
        let lr = |e| doubling.learning_rate(&state_at(e));
        assert!(close(lr(20.0), 1.6), "second cycle runs 10..30");
        assert!(close(lr(30.0), 3.2), "third cycle starts at 30");
        assert!(close(lr(50.0), 1.6), "third cycle runs 30..70");
    }

    #[test]
    fn configure_errors() {
        let err = error::<Cosine>;
        assert_eq!(
            err(&[("final_lr_factor", Value::Float(1.5))]),
            "final_lr_factor must be in [0, 1], got 1.5"
        );
        assert_eq!(
            err(&[("restart_mult", Value::Float(0.5))]),
            "restart_mult must be >= 1, got 0.5"
        );
        assert_eq!(
            err(&[("restart_epochs", Value::Float(-2.0))]),
            "restart_epochs must be >= 0, got -2"
        );
    }
}
