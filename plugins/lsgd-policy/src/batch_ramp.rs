//! `batch-ramp`: grow the global batch at milestones instead of decaying the learning rate
//! (Smith et al., "Don't decay the learning rate, increase the batch size"; Mikami et al.).

use crate::util::{milestones, passed, u32_at_least};
use crate::{BatchSize, Info, ParamSpec, Params, Policy, State};

/// The configured global batch × `factor` per passed milestone, capped, then fitted to the world size.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchRamp {
    /// Multiplier per milestone.
    pub factor: u32,
    /// Epochs at which the batch grows, ascending.
    pub milestones: Vec<f64>,
    /// Largest batch to grow to; 0 means no cap.
    pub max_batch: u32,
}

/// Rounds `batch` down to a multiple of `world_size` but never below one sample per worker,
/// since the contract requires divisibility and a rank cannot take an empty batch.
/// A world size of 0 is treated as 1.
pub fn fit_to_world(batch: u32, world_size: u32) -> u32 {
    let ws = world_size.max(1);
    (batch - batch % ws).max(ws)
}

impl Policy for BatchRamp {
    fn info() -> Info {
        Info::new(
            "batch-ramp",
            "Batch-size control: multiply the global batch by factor at each milestone epoch",
            vec![
                ParamSpec::integer("factor", 2, "batch multiplier at each milestone (>= 1)"),
                ParamSpec::float_list(
                    "milestones",
                    &[30.0, 60.0, 80.0],
                    "epochs at which the batch grows (ascending)",
                ),
                ParamSpec::integer("max_batch", 0, "largest global batch; 0 = no cap"),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(BatchRamp {
            factor: u32_at_least(p, "factor", 1)?,
            milestones: milestones(p, "milestones")?,
            max_batch: u32_at_least(p, "max_batch", 0)?,
        })
    }
}

impl BatchSize for BatchRamp {
    fn global_batch(&self, s: &State) -> u32 {
        let mut b = s.global_batch;
        for _ in 0..passed(&self.milestones, s.epoch_fraction) {
            b = b.saturating_mul(self.factor);
        }
        if self.max_batch > 0 && b > self.max_batch {
            b = self.max_batch;
        }
        fit_to_world(b, s.world_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::testing::{configure, error, state_at};

    #[test]
    fn ramps_at_milestones() {
        let p: BatchRamp = configure(&[]).unwrap();
        let b = |e| p.global_batch(&state_at(e));
        assert_eq!(b(0.0), 8192);
        assert_eq!(b(29.9), 8192);
        assert_eq!(b(30.0), 16384);
        assert_eq!(b(60.0), 32768);
        assert_eq!(b(80.0), 65536);
    }

    #[test]
    fn caps_saturates_and_rounds() {
        let capped: BatchRamp = configure(&[
            ("factor", Value::Integer(3)),
            ("max_batch", Value::Integer(30000)),
        ])
        .unwrap();
        assert_eq!(capped.global_batch(&state_at(30.0)), 24576);
        assert_eq!(
            capped.global_batch(&state_at(60.0)),
            30000 - 30000 % 32,
            "cap, then world-size rounding"
        );

        let huge: BatchRamp = configure(&[("factor", Value::Integer(1 << 20))]).unwrap();
        assert_eq!(
            huge.global_batch(&state_at(85.0)),
            u32::MAX - u32::MAX % 32,
            "saturates"
        );

        let tiny = State {
            global_batch: 5,
            world_size: 8,
            ..state_at(0.0)
        };
        assert_eq!(
            capped.global_batch(&tiny),
            8,
            "at least one sample per worker"
        );
        assert_eq!(fit_to_world(100, 0), 100);
        assert_eq!(fit_to_world(100, 3), 99);
    }

    #[test]
    fn configure_errors() {
        let err = error::<BatchRamp>;
        assert_eq!(
            err(&[("factor", Value::Integer(0))]),
            "factor must be in [1, 4294967295], got 0"
        );
        assert_eq!(
            err(&[("max_batch", Value::Integer(-5))]),
            "max_batch must be in [0, 4294967295], got -5"
        );
    }
}
