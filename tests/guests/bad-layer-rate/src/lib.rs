//! Test guest: a layer-rate policy (contract 0.3) that breaks the contract on request, so the
//! host's validation of multipliers can be tested against a real component. Before `at_step`
//! it returns 1.0 for every tensor; from `at_step` on, the first tensor's multiplier is NaN or
//! -1, or the list is one multiplier short (with no tensors at all, every fault returns the
//! empty list, which is correct).

wit_bindgen::generate!({ path: "../../../wit/v0.3.0", world: "layer-rate-plugin" });

use lsgd_policy::{Info, LayerRate, ParamSpec, Params, Policy, State, TensorNorms};

/// How the multipliers are wrong.
#[derive(Clone, Copy)]
enum Fault {
    Nan,
    Negative,
    Count,
}

/// The misbehaving layer-rate policy.
struct BadLayerRate {
    fault: Fault,
    at_step: u64,
}

impl Policy for BadLayerRate {
    fn info() -> Info {
        Info::new(
            "bad-layer-rate",
            "Test guest: multipliers 1.0, then NaN, negative or one too few from a given step",
            vec![
                ParamSpec::choice(
                    "fault",
                    &["nan", "negative", "count"],
                    "what goes wrong: the first multiplier NaN, the first multiplier -1, or one \
                     multiplier too few",
                ),
                ParamSpec::integer("at_step", 0, "misbehave from this step on; all 1.0 before"),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let fault = match p.text("fault")? {
            "nan" => Fault::Nan,
            "negative" => Fault::Negative,
            "count" => Fault::Count,
            other => {
                return Err(format!(
                    "fault must be nan, negative or count, got '{other}'"
                ));
            }
        };
        let at_step = p.integer("at_step")?;
        let at_step =
            u64::try_from(at_step).map_err(|_| format!("at_step must be >= 0, got {at_step}"))?;
        Ok(BadLayerRate { fault, at_step })
    }
}

impl LayerRate for BadLayerRate {
    fn multipliers(&self, s: &State, tensors: &[TensorNorms]) -> Vec<f64> {
        let mut m = vec![1.0; tensors.len()];
        if s.step < self.at_step {
            return m;
        }
        match (self.fault, m.first_mut()) {
            (Fault::Nan, Some(first)) => *first = f64::NAN,
            (Fault::Negative, Some(first)) => *first = -1.0,
            (Fault::Count, _) => {
                m.pop();
            }
            (_, None) => {}
        }
        m
    }
}

lsgd_policy::export_layer_rate!(BadLayerRate);
