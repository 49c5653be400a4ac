//! `constant-batch`: a fixed global batch, the baseline for batch-size control.

use crate::batch_ramp::fit_to_world;
use crate::util::u32_at_least;
use crate::{BatchSize, Info, ParamSpec, Params, Policy, State};

/// The `batch` parameter (or the configured initial batch), fitted to the world size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConstantBatch {
    /// The global batch; 0 keeps the configured one.
    pub batch: u32,
}

impl Policy for ConstantBatch {
    fn info() -> Info {
        Info::new(
            "constant-batch",
            "A fixed global batch for the whole run",
            vec![ParamSpec::integer(
                "batch",
                0,
                "global batch; 0 = the configured --global-batch",
            )],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(ConstantBatch {
            batch: u32_at_least(p, "batch", 0)?,
        })
    }
}

impl BatchSize for ConstantBatch {
    fn global_batch(&self, s: &State) -> u32 {
        let b = if self.batch == 0 {
            s.global_batch
        } else {
            self.batch
        };
        fit_to_world(b, s.world_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::testing::{configure, error, state_at};

    #[test]
    fn keeps_or_overrides() {
        let keep: ConstantBatch = configure(&[]).unwrap();
        assert_eq!(keep.global_batch(&state_at(50.0)), 8192);
        let set: ConstantBatch = configure(&[("batch", Value::Integer(1000))]).unwrap();
        assert_eq!(
            set.global_batch(&state_at(0.0)),
            992,
            "rounded down to 32 workers"
        );
        assert_eq!(
            error::<ConstantBatch>(&[("batch", Value::Integer(1 << 40))]),
            "batch must be in [0, 4294967295], got 1099511627776"
        );
    }
}
