//! Schedules made of several schedule plugins, with PyTorch's semantics: one after another
//! (`SequentialLR`) or multiplied (`ChainedScheduler`). The host composes, so every part keeps
//! its own identity, snapshot and fault report, and any plugin of any contract version can be
//! a part.

use std::fmt;

use lsgd_policy::State;

/// How the parts of a composed schedule make one learning rate.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Composition {
    /// One schedule (or none): its own output.
    #[default]
    Single,
    /// Part 0 until the first milestone, part i from milestone i on, each later part counting
    /// its steps from its milestone (`SequentialLR`): `milestones[i - 1]` is the step at which
    /// part `i` takes over, strictly increasing.
    Sequential(Vec<u64>),
    /// Every part at every step, the LR being part 0's LR times each later part's factor
    /// (`ChainedScheduler`).
    Chained,
}

impl Composition {
    /// The index of the part that decides `step` (sequential), or `None` when every part does.
    pub fn active(&self, step: u64) -> Option<usize> {
        match self {
            Composition::Single => Some(0),
            Composition::Sequential(m) => Some(m.partition_point(|&s| s <= step)),
            Composition::Chained => None,
        }
    }

    /// Checks the composition against its number of parts.
    pub fn check(&self, parts: usize) -> Result<(), String> {
        match self {
            Composition::Single if parts > 1 => Err(format!(
                "{parts} schedules given without a composition (sequential or chained)"
            )),
            Composition::Sequential(m) if m.len() + 1 != parts => Err(format!(
                "a sequential schedule of {parts} parts needs {} milestones, got {}",
                parts.saturating_sub(1),
                m.len()
            )),
            Composition::Sequential(m) if m.first() == Some(&0) => {
                Err("a sequential milestone must be a step after 0".into())
            }
            Composition::Sequential(m) if m.windows(2).any(|w| w[0] >= w[1]) => {
                Err(format!("sequential milestones must increase: {}", join(m)))
            }
            Composition::Chained if parts < 2 => {
                Err("a chained schedule needs at least two parts".into())
            }
            _ => Ok(()),
        }
    }

    /// What part `part` sees at `state`: for a later part of a sequential schedule, the run as
    /// if it started at the part's milestone (step, samples, epochs and total steps counted
    /// from there); `samples_per_epoch` is the run's. The batch must have been constant (a
    /// sequential schedule refuses a batch-size policy), so the milestone's samples are known.
    pub fn view(&self, part: usize, state: &State, samples_per_epoch: u64) -> State {
        let Composition::Sequential(m) = self else {
            return *state;
        };
        let Some(&from) = part.checked_sub(1).and_then(|i| m.get(i)) else {
            return *state;
        };
        let per_epoch = samples_per_epoch.max(1);
        let samples_before = from * u64::from(state.global_batch);
        let samples = state.samples_seen.saturating_sub(samples_before);
        State {
            step: state.step.saturating_sub(from),
            epoch: (samples / per_epoch) as u32,
            epoch_fraction: samples as f64 / per_epoch as f64,
            total_steps: state.total_steps.saturating_sub(from),
            total_epochs: state
                .total_epochs
                .saturating_sub((samples_before / per_epoch) as u32),
            samples_seen: samples,
            ..*state
        }
    }

    /// How part `part` of a schedule whose slot key is `key` is named in checkpoints and
    /// messages: the key, and for a later part its place in the composition (`schedule.1 (from
    /// step 30)`, `schedule.1 (chained)`), so a different composition is a different run.
    pub fn part_label(&self, key: String, part: usize) -> String {
        match (self, part) {
            (_, 0) | (Composition::Single, _) => key,
            (Composition::Sequential(m), n) => format!("{key} (from step {})", m[n - 1]),
            (Composition::Chained, _) => format!("{key} (chained)"),
        }
    }

    /// What a chained part after the first sees: the state at base LR 1 for the step's own
    /// batch, so that a schedule whose LR is η·f(t) answers f(t) whatever its scaling rule.
    pub fn factor_view(state: &State) -> State {
        State {
            base_lr: 1.0,
            reference_batch: state.global_batch,
            ..*state
        }
    }
}

impl fmt::Display for Composition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Composition::Single => f.write_str("single"),
            Composition::Sequential(m) => write!(f, "sequential at steps {}", join(m)),
            Composition::Chained => f.write_str("chained"),
        }
    }
}

fn join(m: &[u64]) -> String {
    m.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(step: u64, batch: u32, steps_per_epoch: u64) -> State {
        let samples = step * u64::from(batch);
        let n = u64::from(batch) * steps_per_epoch;
        State {
            step,
            epoch: (samples / n) as u32,
            epoch_fraction: samples as f64 / n as f64,
            steps_per_epoch,
            total_steps: 10 * steps_per_epoch,
            total_epochs: 10,
            samples_seen: samples,
            global_batch: batch,
            worker_batch: batch,
            world_size: 1,
            base_lr: 0.1,
            reference_batch: 256,
            last_loss: None,
            last_metric: None,
        }
    }

    #[test]
    fn the_active_part_changes_at_each_milestone() {
        let c = Composition::Sequential(vec![5, 9]);
        let parts: Vec<_> = (0..12).map(|s| c.active(s).unwrap()).collect();
        assert_eq!(parts, [0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]);
        assert_eq!(Composition::Chained.active(3), None);
        assert_eq!(Composition::Single.active(3), Some(0));
    }

    #[test]
    fn a_later_part_sees_the_run_from_its_milestone() {
        let c = Composition::Sequential(vec![20]);
        let s = state(25, 256, 10);
        let v = c.view(1, &s, 2560);
        assert_eq!(v.step, 5);
        assert_eq!(v.samples_seen, 5 * 256);
        assert_eq!(v.epoch, 0);
        assert_eq!(v.epoch_fraction, 0.5);
        assert_eq!(v.total_steps, 80);
        assert_eq!(v.total_epochs, 8);
        assert_eq!(v.base_lr, s.base_lr);
        assert_eq!(c.view(0, &s, 2560), s);
    }

    #[test]
    fn a_chained_factor_is_asked_at_base_lr_one() {
        let v = Composition::factor_view(&state(3, 512, 10));
        assert_eq!(
            (v.base_lr, v.reference_batch, v.global_batch),
            (1.0, 512, 512)
        );
    }

    #[test]
    fn bad_compositions_are_refused() {
        assert!(Composition::Sequential(vec![5]).check(3).is_err());
        assert!(Composition::Sequential(vec![0]).check(2).is_err());
        assert!(Composition::Sequential(vec![5, 5]).check(3).is_err());
        assert!(Composition::Chained.check(1).is_err());
        assert!(Composition::Single.check(2).is_err());
        assert!(Composition::Sequential(vec![5, 9]).check(3).is_ok());
        assert_eq!(
            Composition::Sequential(vec![5, 9]).to_string(),
            "sequential at steps 5, 9"
        );
    }
}
