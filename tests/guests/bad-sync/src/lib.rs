//! Test guest: a sync policy (contract 0.5) that breaks the contract on request, so the host's
//! checks of `plan` and `outer-step` can be tested against a real component. It is local SGD
//! averaging every `period` steps with plain averaging as its outer step; from step `at_step`
//! on, the chosen `fault` happens:
//!
//! - `synchronous`: `plan` answers `synchronous` at every step inside a window (window
//!   `local-steps` > 0), which the host must refuse;
//! - `negative-lr`, `nan-lr`: the outer lr is -1 or NaN;
//! - `momentum-one`, `negative-momentum`: the outer momentum is 1 or -0.5;
//! - `nan-scale`, `negative-scale`: the first tensor's lr scale is NaN or -1, every other 1
//!   (with no tensors at all the list is empty, which is correct);
//! - `scale-count`: one lr scale more than there are tensors (wrong even with no tensors).

wit_bindgen::generate!({ path: "../../../wit/v0.5.0", world: "sync-plugin" });

use lsgd_policy::{
    Info, OuterStep, ParamSpec, Params, Policy, State, StepKind, SyncPolicy, TensorDrift, Window,
};

/// The faults, in the order the `fault` parameter lists them.
const FAULTS: [&str; 8] = [
    "synchronous",
    "negative-lr",
    "nan-lr",
    "momentum-one",
    "negative-momentum",
    "nan-scale",
    "negative-scale",
    "scale-count",
];

/// The misbehaving sync policy.
struct BadSync {
    fault: &'static str,
    at_step: u64,
    period: u64,
}

impl Policy for BadSync {
    fn info() -> Info {
        Info::new(
            "bad-sync",
            "Test guest: local SGD that plans synchronous mid-window or returns an invalid outer \
             step from a given step",
            vec![
                ParamSpec::choice(
                    "fault",
                    &FAULTS,
                    "what goes wrong: synchronous inside a window, outer lr -1 or NaN, outer \
                     momentum 1 or -0.5, the first lr scale NaN or -1, or one lr scale too many",
                ),
                ParamSpec::integer(
                    "at_step",
                    0,
                    "misbehave from this step on; valid answers before",
                ),
                ParamSpec::integer("period", 4, "average after steps H-1, 2H-1 ... (>= 1)"),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let word = p.text("fault")?;
        let fault = FAULTS
            .into_iter()
            .find(|f| *f == word)
            .ok_or_else(|| format!("fault must be one of {}, got '{word}'", FAULTS.join(", ")))?;
        let at_step = p.integer("at_step")?;
        let at_step =
            u64::try_from(at_step).map_err(|_| format!("at_step must be >= 0, got {at_step}"))?;
        let period = p.integer("period")?;
        let period = u64::try_from(period)
            .ok()
            .filter(|&h| h >= 1)
            .ok_or_else(|| format!("period must be >= 1, got {period}"))?;
        Ok(BadSync {
            fault,
            at_step,
            period,
        })
    }
}

impl SyncPolicy for BadSync {
    fn plan(&self, s: &State, w: &Window) -> StepKind {
        if s.step >= self.at_step && self.fault == "synchronous" && w.local_steps > 0 {
            return StepKind::Synchronous;
        }
        if s.step % self.period == self.period - 1 {
            StepKind::Average
        } else {
            StepKind::Local
        }
    }

    fn outer_step(&mut self, s: &State, _w: &Window, tensors: &[TensorDrift]) -> OuterStep {
        let mut o = OuterStep::average();
        if s.step < self.at_step {
            return o;
        }
        let first = |v: f64| {
            let mut scale = vec![1.0; tensors.len()];
            if let Some(f) = scale.first_mut() {
                *f = v;
            }
            scale
        };
        match self.fault {
            "negative-lr" => o.lr = -1.0,
            "nan-lr" => o.lr = f64::NAN,
            "momentum-one" => o.momentum = 1.0,
            "negative-momentum" => o.momentum = -0.5,
            "nan-scale" => o.lr_scale = first(f64::NAN),
            "negative-scale" => o.lr_scale = first(-1.0),
            "scale-count" => o.lr_scale = vec![1.0; tensors.len() + 1],
            _ => {}
        }
        o
    }
}

lsgd_policy::export_sync!(BadSync);
