//! `plateau`: PyTorch's `ReduceLROnPlateau` as a stateful schedule, composed with the scaling
//! rule and warmup of the other reference schedules, so it can replace the step decay of
//! Goyal's recipe: the learning rate is the scaled target η reduced once per plateau.
//!
//! The decision logic is `torch.optim.lr_scheduler.ReduceLROnPlateau.step` line for line (its
//! `is_better`, patience, cooldown and `eps` test), and `scripts/torch-plateau-reference.py`
//! records torch's learning rates for `tests/plateau_torch.rs` to replay.

use crate::lr::Warmup;
use crate::util::{count, float_at_least};
use crate::{Info, ParamSpec, Params, Policy, Schedule, State, Stateful};

/// What the policy watches for a plateau.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Monitor {
    /// `last_metric`, the evaluation after each epoch; observed once per epoch.
    Metric,
    /// `last_loss`, the previous step's training loss; observed once per step.
    Loss,
}

/// Whether the monitored value should go up or down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Lower is better (a loss).
    Min,
    /// Higher is better (an accuracy).
    Max,
}

/// How `threshold` decides that a value beats the best one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThresholdMode {
    /// Better by a factor: best · (1 ± threshold).
    Rel,
    /// Better by a margin: best ± threshold.
    Abs,
}

/// What the policy remembers between calls: exactly what [`Stateful::snapshot`] captures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlateauState {
    /// The epoch (monitor metric) or step (monitor loss) of the latest observation.
    pub last_observed: Option<u64>,
    /// The best value seen so far; ±∞ before the first observation, as in torch.
    pub best: f64,
    /// Observations since the best one (torch's `num_bad_epochs`).
    pub num_bad: u64,
    /// Observations left in which bad ones are ignored after a reduction.
    pub cooldown_counter: u64,
    /// Reductions applied so far.
    pub reductions: u64,
}

/// ReduceLROnPlateau over the scaled, warmed-up target learning rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plateau {
    /// Scaling rule and warmup phase.
    pub warmup: Warmup,
    /// Metric or loss.
    pub monitor: Monitor,
    /// Min or max, resolved from `auto`.
    pub mode: Mode,
    /// Multiplier of each reduction, in (0, 1).
    pub factor: f64,
    /// Bad observations tolerated before a reduction.
    pub patience: u64,
    /// The margin a value must beat the best one by.
    pub threshold: f64,
    /// Whether that margin is relative or absolute.
    pub threshold_mode: ThresholdMode,
    /// Observations after a reduction during which bad ones are not counted.
    pub cooldown: u64,
    /// The learning rate is never reduced below this.
    pub min_lr: f64,
    /// A reduction smaller than this is skipped.
    pub eps: f64,
    /// Counters and best value, advanced by [`Stateful::observe`].
    pub state: PlateauState,
}

/// The format version of [`Plateau`]'s snapshot, its first byte.
pub const SNAPSHOT_VERSION: u8 = 1;

/// The length of [`Plateau`]'s snapshot in bytes.
pub const SNAPSHOT_LEN: usize = 42;

impl Policy for Plateau {
    fn info() -> Info {
        let mut params = Warmup::specs(0.0);
        params.extend(plateau_specs());
        Info::new(
            "plateau",
            "ReduceLROnPlateau (as torch computes it) over the scaled target LR, after warmup",
            params,
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let monitor = match p.text("monitor")? {
            "metric" => Monitor::Metric,
            "loss" => Monitor::Loss,
            other => return Err(format!("monitor must be metric or loss, got '{other}'")),
        };
        let mode = match (p.text("mode")?, monitor) {
            ("max", _) | ("auto", Monitor::Metric) => Mode::Max,
            ("min", _) | ("auto", Monitor::Loss) => Mode::Min,
            (other, _) => return Err(format!("mode must be auto, max or min, got '{other}'")),
        };
        let threshold_mode = match p.text("threshold_mode")? {
            "rel" => ThresholdMode::Rel,
            "abs" => ThresholdMode::Abs,
            other => return Err(format!("threshold_mode must be rel or abs, got '{other}'")),
        };
        let factor = p.float("factor")?;
        if !(factor > 0.0 && factor < 1.0) {
            return Err(format!("factor must be in (0, 1), got {factor}"));
        }
        Ok(Plateau {
            warmup: Warmup::from_params(p)?,
            monitor,
            mode,
            factor,
            patience: count(p, "patience")?,
            threshold: float_at_least(p, "threshold", 0.0)?,
            threshold_mode,
            cooldown: count(p, "cooldown")?,
            min_lr: float_at_least(p, "min_lr", 0.0)?,
            eps: float_at_least(p, "eps", 0.0)?,
            state: PlateauState {
                last_observed: None,
                best: worst(mode),
                num_bad: 0,
                cooldown_counter: 0,
                reductions: 0,
            },
        })
    }
}

/// The parameters of ReduceLROnPlateau itself, with torch's defaults.
fn plateau_specs() -> Vec<ParamSpec> {
    vec![
        ParamSpec::choice(
            "monitor",
            &["metric", "loss"],
            "watch the evaluation metric (once per epoch) or the training loss (once per step)",
        ),
        ParamSpec::choice(
            "mode",
            &["auto", "max", "min"],
            "whether the monitored value should rise (max) or fall (min); auto: max for metric, min for loss",
        ),
        ParamSpec::float("factor", 0.1, "LR multiplier of each reduction, in (0, 1)"),
        ParamSpec::integer(
            "patience",
            10,
            "bad observations tolerated before a reduction (>= 0)",
        ),
        ParamSpec::float(
            "threshold",
            1e-4,
            "margin a value must beat the best one by (>= 0)",
        ),
        ParamSpec::choice(
            "threshold_mode",
            &["rel", "abs"],
            "threshold relative (best * (1 +- threshold)) or absolute (best +- threshold)",
        ),
        ParamSpec::integer(
            "cooldown",
            0,
            "observations after a reduction that are not counted (>= 0)",
        ),
        ParamSpec::float("min_lr", 0.0, "the LR is never reduced below this (>= 0)"),
        ParamSpec::float(
            "eps",
            1e-8,
            "a reduction smaller than this is skipped (>= 0)",
        ),
    ]
}

/// torch's `mode_worse`, the starting best value.
fn worst(mode: Mode) -> f64 {
    match mode {
        Mode::Min => f64::INFINITY,
        Mode::Max => f64::NEG_INFINITY,
    }
}

impl Plateau {
    /// torch's `_is_better`, with its expressions unchanged so the comparisons agree exactly.
    fn is_better(&self, a: f64, best: f64) -> bool {
        match (self.mode, self.threshold_mode) {
            (Mode::Min, ThresholdMode::Rel) => a < best * (1.0 - self.threshold),
            (Mode::Min, ThresholdMode::Abs) => a < best - self.threshold,
            (Mode::Max, ThresholdMode::Rel) => a > best * (self.threshold + 1.0),
            (Mode::Max, ThresholdMode::Abs) => a > best + self.threshold,
        }
    }

    /// One reduction as torch's `_reduce_lr` computes it: Python's `max(old * factor, min_lr)`,
    /// which keeps its first argument unless the second is greater.
    fn reduce(&self, old: f64) -> f64 {
        let new = old * self.factor;
        if self.min_lr > new { self.min_lr } else { new }
    }

    /// η after the reductions so far. Replayed one multiplication at a time, as torch applies
    /// them to its stored LR, rather than η·factorⁿ: that is what makes the result equal to
    /// torch's bit for bit, and it still follows η when a batch-size policy changes it.
    pub fn reduced(&self, eta: f64) -> f64 {
        let mut lr = eta;
        for _ in 0..self.state.reductions {
            let next = self.reduce(lr);
            if next == lr {
                break; // at min_lr (or 0): a fixed point, so the remaining rounds change nothing
            }
            lr = next;
        }
        lr
    }

    /// The value and the clock (epoch or step) of what `s` offers to observe, if anything.
    fn reading(&self, s: &State) -> Option<(u64, f64)> {
        match self.monitor {
            Monitor::Metric => s.last_metric.map(|v| (u64::from(s.epoch), v)),
            Monitor::Loss => s.last_loss.map(|v| (s.step, v)),
        }
    }

    /// torch's `step(metrics)`, with the LR it would reduce being η reduced so far.
    fn step(&mut self, current: f64, eta: f64) {
        if self.is_better(current, self.state.best) {
            self.state.best = current;
            self.state.num_bad = 0;
        } else {
            self.state.num_bad = self.state.num_bad.saturating_add(1);
        }
        if self.state.cooldown_counter > 0 {
            self.state.cooldown_counter -= 1;
            self.state.num_bad = 0;
        }
        if self.state.num_bad > self.patience {
            let old = self.reduced(eta);
            if old - self.reduce(old) > self.eps {
                self.state.reductions += 1;
            }
            self.state.cooldown_counter = self.cooldown;
            self.state.num_bad = 0;
        }
    }
}

impl Schedule for Plateau {
    fn learning_rate(&self, s: &State) -> f64 {
        let lr = self.reduced(self.warmup.scaling.target(s));
        self.warmup.during(s, lr).unwrap_or(lr)
    }
}

impl Stateful for Plateau {
    fn observe(&mut self, s: &State) {
        let Some((clock, value)) = self.reading(s) else {
            return;
        };
        if self.state.last_observed.is_some_and(|seen| clock <= seen) {
            return;
        }
        self.state.last_observed = Some(clock);
        self.step(value, self.warmup.scaling.target(s));
    }

    fn snapshot(&self) -> Vec<u8> {
        let st = &self.state;
        let mut out = Vec::with_capacity(SNAPSHOT_LEN);
        out.push(SNAPSHOT_VERSION);
        out.push(u8::from(st.last_observed.is_some()));
        out.extend(st.last_observed.unwrap_or(0).to_le_bytes());
        out.extend(st.best.to_bits().to_le_bytes());
        out.extend(st.num_bad.to_le_bytes());
        out.extend(st.cooldown_counter.to_le_bytes());
        out.extend(st.reductions.to_le_bytes());
        out
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        if snapshot.len() != SNAPSHOT_LEN {
            return Err(format!(
                "plateau snapshot must be {SNAPSHOT_LEN} bytes, got {}",
                snapshot.len()
            ));
        }
        if snapshot[0] != SNAPSHOT_VERSION {
            return Err(format!(
                "plateau snapshot has version {}, this plugin reads version {SNAPSHOT_VERSION}",
                snapshot[0]
            ));
        }
        let word = |i: usize| {
            let at = 2 + 8 * i;
            u64::from_le_bytes(snapshot[at..at + 8].try_into().expect("8 bytes"))
        };
        let last_observed = match snapshot[1] {
            0 => None,
            1 => Some(word(0)),
            flag => return Err(format!("plateau snapshot has an invalid flag byte {flag}")),
        };
        self.state = PlateauState {
            last_observed,
            best: f64::from_bits(word(1)),
            num_bad: word(2),
            cooldown_counter: word(3),
            reductions: word(4),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::testing::{configure, error, state_at, text};

    /// Scaling none and no warmup, so the LR is base_lr (0.1) reduced, as in torch.
    fn plain(set: &[(&str, Value)]) -> Plateau {
        let mut all = vec![("scaling", text("none")), ("warmup", text("none"))];
        all.extend(set.iter().cloned());
        configure(&all).unwrap()
    }

    /// The first step of `epoch`, which sees the evaluation `metric` of the epoch before.
    fn metric_at(epoch: u32, metric: f64) -> State {
        State {
            last_metric: Some(metric),
            ..state_at(f64::from(epoch))
        }
    }

    /// Observes `metrics[i]` at epoch i + 1 and returns the LR after each.
    fn run(p: &mut Plateau, metrics: &[f64]) -> Vec<f64> {
        let first = p.state.last_observed.unwrap_or(0) as u32;
        (0..metrics.len())
            .map(|i| {
                let s = metric_at(first + i as u32 + 1, metrics[i]);
                p.observe(&s);
                p.learning_rate(&s)
            })
            .collect()
    }

    #[test]
    fn torch_defaults() {
        let p: Plateau = configure(&[]).unwrap();
        assert_eq!(
            (p.monitor, p.mode, p.threshold_mode),
            (Monitor::Metric, Mode::Max, ThresholdMode::Rel)
        );
        assert_eq!((p.factor, p.patience, p.threshold), (0.1, 10, 1e-4));
        assert_eq!((p.cooldown, p.min_lr, p.eps), (0, 0.0, 1e-8));
        assert_eq!(p.state.best, f64::NEG_INFINITY);
        assert_eq!(
            p.learning_rate(&state_at(0.0)),
            3.2,
            "linear scaling, no warmup"
        );
        let loss: Plateau = configure(&[("monitor", text("loss"))]).unwrap();
        assert_eq!((loss.mode, loss.state.best), (Mode::Min, f64::INFINITY));
        let forced: Plateau =
            configure(&[("monitor", text("loss")), ("mode", text("max"))]).unwrap();
        assert_eq!(forced.mode, Mode::Max);
    }

    #[test]
    fn reduces_after_more_than_patience_bad_observations() {
        let mut p = plain(&[
            ("patience", Value::Integer(2)),
            ("factor", Value::Float(0.5)),
        ]);
        // best 0.5, then three equal values: bad 1, 2, 3 > 2, so the fourth call reduces.
        assert_eq!(run(&mut p, &[0.5; 4]), [0.1, 0.1, 0.1, 0.05]);
        assert_eq!((p.state.num_bad, p.state.reductions), (0, 1));
        assert_eq!(run(&mut p, &[0.5; 3]), [0.05, 0.05, 0.025]);
        assert_eq!(
            run(&mut p, &[0.6, 0.5, 0.5, 0.7]),
            [0.025; 4],
            "improvements reset the count"
        );
        assert_eq!(p.state.best, 0.7);
    }

    #[test]
    fn thresholds_relative_and_absolute() {
        let better = |set: &[(&str, Value)], best: f64, a: f64| {
            let mut p = plain(set);
            p.state.best = best;
            p.is_better(a, best)
        };
        let abs = || ("threshold_mode", text("abs"));
        let th = |v| ("threshold", Value::Float(v));
        // max/rel: must exceed 0.5 * 1.0001 = 0.50005.
        assert!(!better(&[], 0.5, 0.50004) && better(&[], 0.5, 0.50006));
        assert!(!better(&[], 0.5, 0.5), "equal is not better");
        assert!(!better(&[abs(), th(0.01)], 0.5, 0.505) && better(&[abs(), th(0.01)], 0.5, 0.52));
        let min = || ("mode", text("min"));
        // min/rel: must be below 2 * 0.9 = 1.8.
        assert!(!better(&[min(), th(0.1)], 2.0, 1.85) && better(&[min(), th(0.1)], 2.0, 1.75));
        assert!(
            !better(&[min(), abs(), th(0.5)], 2.0, 1.6)
                && better(&[min(), abs(), th(0.5)], 2.0, 1.4)
        );
        assert!(
            better(&[min()], f64::INFINITY, 1e300),
            "anything finite beats the start"
        );
        assert!(
            !better(&[], f64::NEG_INFINITY, f64::NAN),
            "NaN never improves"
        );
    }

    #[test]
    fn cooldown_ignores_bad_observations() {
        let mut p = plain(&[
            ("patience", Value::Integer(0)),
            ("cooldown", Value::Integer(2)),
            ("factor", Value::Float(0.5)),
        ]);
        assert_eq!(run(&mut p, &[0.5; 5]), [0.1, 0.05, 0.05, 0.05, 0.025]);
        assert_eq!(p.state.cooldown_counter, 2);
    }

    #[test]
    fn min_lr_floors_and_eps_skips_small_reductions() {
        let floor = |min_lr, eps| {
            let mut p = plain(&[
                ("patience", Value::Integer(0)),
                ("factor", Value::Float(0.5)),
                ("min_lr", Value::Float(min_lr)),
                ("eps", Value::Float(eps)),
            ]);
            (run(&mut p, &[0.5; 5]), p.state.reductions)
        };
        assert_eq!(floor(0.03, 1e-8), (vec![0.1, 0.05, 0.03, 0.03, 0.03], 2));
        // 0.05 -> 0.025 would change the LR by 0.025, not more than eps = 0.03.
        assert_eq!(floor(0.0, 0.03), (vec![0.1, 0.05, 0.05, 0.05, 0.05], 1));
    }

    #[test]
    fn nan_is_a_bad_observation() {
        let mut p = plain(&[
            ("patience", Value::Integer(1)),
            ("factor", Value::Float(0.5)),
        ]);
        assert_eq!(run(&mut p, &[0.5, f64::NAN, f64::NAN]), [0.1, 0.1, 0.05]);
        assert_eq!(p.state.best, 0.5);
    }

    #[test]
    fn observes_each_epoch_once_however_often_it_is_called() {
        let mut p = plain(&[
            ("patience", Value::Integer(0)),
            ("factor", Value::Float(0.5)),
        ]);
        let mut call = |s: &State| {
            p.observe(s);
            (p.learning_rate(s), p.state)
        };
        assert_eq!(call(&state_at(0.0)).1.last_observed, None, "no metric yet");
        let (_, first) = call(&metric_at(1, 0.5));
        assert_eq!(first.last_observed, Some(1));
        for step in 0..5 {
            let s = State {
                step,
                epoch_fraction: 1.0 + step as f64 / 10.0,
                ..metric_at(1, 0.1)
            };
            assert_eq!(call(&s), (0.1, first), "same epoch: nothing new to observe");
        }
        assert_eq!(
            call(&metric_at(0, 0.1)).1,
            first,
            "an earlier epoch is not observed"
        );
        let (lr, second) = call(&metric_at(2, 0.1));
        assert_eq!(
            (lr, second.reductions, second.last_observed),
            (0.05, 1, Some(2))
        );
        assert_eq!(call(&metric_at(2, 0.1)), (0.05, second));
    }

    #[test]
    fn loss_monitor_observes_each_step_once() {
        let mut p = plain(&[
            ("monitor", text("loss")),
            ("patience", Value::Integer(1)),
            ("factor", Value::Float(0.5)),
        ]);
        let at = |step, loss: Option<f64>| State {
            step,
            last_loss: loss,
            ..state_at(0.0)
        };
        let mut lrs = Vec::new();
        for (step, loss) in [
            (0, None),
            (1, Some(2.0)),
            (1, Some(9.0)),
            (2, Some(2.5)),
            (3, Some(2.5)),
        ] {
            for _ in 0..3 {
                p.observe(&at(step, loss));
            }
            lrs.push(p.learning_rate(&at(step, loss)));
        }
        // 2.0 is the best; 2.5 at steps 2 and 3 are bad 1 and 2 > 1. The 9.0 at step 1 repeats
        // a step already observed, so it never counts.
        assert_eq!(lrs, [0.1, 0.1, 0.1, 0.1, 0.05]);
        assert_eq!((p.state.best, p.state.last_observed), (2.0, Some(3)));
    }

    #[test]
    fn reductions_compose_with_scaling_and_warmup() {
        let mut p: Plateau = configure(&[
            ("warmup_epochs", Value::Float(5.0)),
            ("patience", Value::Integer(0)),
            ("factor", Value::Float(0.5)),
        ])
        .unwrap();
        assert_eq!(p.learning_rate(&state_at(0.0)), 0.1, "eta / k at step 0");
        run(&mut p, &[0.5, 0.4]); // a bad epoch 2: one reduction, target 3.2 -> 1.6
        let s = State {
            last_metric: Some(0.4),
            ..state_at(2.5)
        };
        p.observe(&s);
        let (eta, k, e, w) = (1.6f64, 32.0f64, 2.5f64, 5.0f64);
        assert_eq!(
            p.learning_rate(&s),
            eta * (1.0 / k) * (1.0 + (k - 1.0) * e / w)
        );
        assert_eq!(
            p.learning_rate(&state_at(5.0)),
            1.6,
            "warmup hands over to the reduced target"
        );
        let half_batch = State {
            global_batch: 4096,
            ..state_at(10.0)
        };
        assert_eq!(
            p.learning_rate(&half_batch),
            0.8,
            "the reduction follows the scaled target"
        );
    }

    /// A noisy rising accuracy that plateaus, for long runs.
    fn accuracy(i: usize) -> f64 {
        let x = i as f64;
        0.9 - 0.5 * libm::exp(-x / 15.0) + 0.01 * libm::sin(1.7 * x)
    }

    #[test]
    fn snapshot_layout() {
        let mut p = plain(&[
            ("patience", Value::Integer(0)),
            ("cooldown", Value::Integer(3)),
        ]);
        assert_eq!(p.snapshot()[..2], [SNAPSHOT_VERSION, 0]);
        run(&mut p, &[0.5, 0.25]);
        let snap = p.snapshot();
        assert_eq!(snap.len(), SNAPSHOT_LEN);
        let mut want = vec![SNAPSHOT_VERSION, 1];
        for word in [2, 0.5f64.to_bits(), 0, 3, 1] {
            want.extend(u64::to_le_bytes(word));
        }
        assert_eq!(snap, want);
    }

    #[test]
    fn restored_snapshot_continues_bit_for_bit() {
        let set = [
            ("patience", Value::Integer(2)),
            ("cooldown", Value::Integer(1)),
        ];
        let series: Vec<f64> = (0..120).map(accuracy).collect();
        let mut whole = plain(&set);
        let want = run(&mut whole, &series);
        assert!(
            whole.state.reductions >= 3,
            "the series must exercise reductions"
        );
        for cut in [0, 1, 17, 60, 119] {
            let mut first = plain(&set);
            let mut got = run(&mut first, &series[..cut]);
            let mut resumed = plain(&set);
            resumed.restore(&first.snapshot()).unwrap();
            assert_eq!(resumed.state, first.state);
            got.extend(run(&mut resumed, &series[cut..]));
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "resumed after {cut} observations");
            assert_eq!(resumed.snapshot(), whole.snapshot());
        }
    }

    #[test]
    fn restore_refuses_what_it_cannot_read() {
        let mut p = plain(&[]);
        let good = p.snapshot();
        assert_eq!(
            p.restore(&good[..41]).unwrap_err(),
            "plateau snapshot must be 42 bytes, got 41"
        );
        assert_eq!(
            p.restore(&[]).unwrap_err(),
            "plateau snapshot must be 42 bytes, got 0"
        );
        let mut v2 = good.clone();
        v2[0] = 2;
        assert_eq!(
            p.restore(&v2).unwrap_err(),
            "plateau snapshot has version 2, this plugin reads version 1"
        );
        let mut flag = good.clone();
        flag[1] = 7;
        assert_eq!(
            p.restore(&flag).unwrap_err(),
            "plateau snapshot has an invalid flag byte 7"
        );
        assert_eq!(p, plain(&[]), "a refused snapshot leaves the state alone");
    }

    #[test]
    fn configure_errors() {
        let err = error::<Plateau>;
        for f in [0.0, 1.0, -0.5, f64::NAN] {
            assert_eq!(
                err(&[("factor", Value::Float(f))]),
                format!("factor must be in (0, 1), got {f}")
            );
        }
        assert_eq!(
            err(&[("patience", Value::Integer(-1))]),
            "patience must be >= 0, got -1"
        );
        assert_eq!(
            err(&[("cooldown", Value::Integer(-2))]),
            "cooldown must be >= 0, got -2"
        );
        assert_eq!(
            err(&[("threshold", Value::Float(-1e-4))]),
            "threshold must be >= 0, got -0.0001"
        );
        assert_eq!(
            err(&[("min_lr", Value::Float(-1.0))]),
            "min_lr must be >= 0, got -1"
        );
        assert_eq!(
            err(&[("eps", Value::Float(f64::INFINITY))]),
            "eps must be >= 0, got inf"
        );
        assert_eq!(
            err(&[("mode", text("up"))]),
            "parameter 'mode' must be one of auto, max, min, got 'up'"
        );
    }
}
