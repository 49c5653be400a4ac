//! Test guest: a label-smoothing policy that returns its `epsilon` parameter with no checks,
//! so the host's validation of out-of-range epsilons can be tested; its one parameter is
//! required.

wit_bindgen::generate!({ path: "../../../wit/v0.1.0", world: "label-smoothing-plugin" });

use lsgd_policy::{Info, LabelSmoothing, ParamSpec, ParamType, Params, Policy, State};

/// Returns whatever it was configured with.
struct BadSmoothing {
    epsilon: f64,
}

impl Policy for BadSmoothing {
    fn info() -> Info {
        Info::new(
            "bad-smoothing",
            "Test guest: returns its epsilon parameter unchecked",
            // Required (no default), so the host's handling of required parameters is tested too.
            vec![ParamSpec::new(
                "epsilon",
                ParamType::Float,
                None,
                "epsilon to return, as f32, unvalidated",
            )],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(BadSmoothing {
            epsilon: p.float("epsilon")?,
        })
    }
}

impl LabelSmoothing for BadSmoothing {
    fn epsilon(&self, _s: &State) -> f32 {
        self.epsilon as f32
    }
}

lsgd_policy::export_label_smoothing!(BadSmoothing);
