//! `constant`: the scaled learning rate η and nothing else, the baseline every schedule is compared to.

use crate::lr::Scaling;
use crate::{Info, Params, Policy, Schedule, State};

/// η after the scaling rule, at every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Constant {
    /// How η follows the batch.
    pub scaling: Scaling,
}

impl Policy for Constant {
    fn info() -> Info {
        Info::new(
            "constant",
            "The scaled learning rate eta at every step",
            vec![Scaling::spec()],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(Constant {
            scaling: Scaling::from_params(p)?,
        })
    }
}

impl Schedule for Constant {
    fn learning_rate(&self, s: &State) -> f64 {
        self.scaling.target(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{configure, error, state_at, text};

    #[test]
    fn scaled_and_flat() {
        let p: Constant = configure(&[]).unwrap();
        assert_eq!(p.learning_rate(&state_at(0.0)), 3.2);
        assert_eq!(p.learning_rate(&state_at(89.0)), 3.2);
        let none: Constant = configure(&[("scaling", text("none"))]).unwrap();
        assert_eq!(none.learning_rate(&state_at(0.0)), 0.1);
        assert_eq!(
            error::<Constant>(&[("scaling", text("cubic"))]),
            "parameter 'scaling' must be one of linear, sqrt, none, got 'cubic'"
        );
    }
}
