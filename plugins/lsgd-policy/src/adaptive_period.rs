//! `adaptive-period`: local SGD whose window length H adapts to how much the ranks' drifts
//! agree, measured at each window's end: H doubles while the ranks move together (averaging
//! them changes little, so it can wait) and halves when they move apart (averaging cancels
//! much of what each rank did, so it should come sooner).
//!
//! The measure is the share of the ranks' movement that is common to all of them. With
//! a = Σ_i ‖Δ_i‖² / Σ_i rank_delta_norm_i² (the averaged drift's energy over the ranks' mean
//! energy: 1 when every rank drifted alike, 1/k for independent drifts of k ranks), the
//! agreement ρ = (k·a − 1) / (k − 1) is 1 for identical drifts and 0 for independent ones,
//! whatever k: if Δ_k = μ + e_k with independent e_k of energy σ², then ρ = ‖μ‖² / (‖μ‖² + σ²).
//! That is the complement of gradient diversity (Yin et al. 2018) measured on a window's
//! pseudo-gradients, the client drift of Karimireddy et al. 2020. ADACOMM (Wang & Joshi 2019)
//! adapts the period from the training loss instead.

use crate::sync::{outer_from_params, outer_specs, period, period_spec};
use crate::util::float_in;
use crate::{
    Info, OuterStep, ParamSpec, Params, Policy, State, Stateful, StepKind, SyncPolicy, TensorDrift,
    Window,
};

/// What the policy remembers between calls: exactly what [`Stateful::snapshot`] captures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveState {
    /// H of the current window.
    pub period: u32,
    /// `window.windows` of the last outer step that adapted H, so that a repeated call for one
    /// window adapts once.
    pub adapted_at: Option<u64>,
}

/// Local SGD with H in [`min_period`, `max_period`], doubled when the agreement of a window
/// is at least `agree` and halved (rounded down) when it is below `disagree`; the outer step
/// is the configured one (plain averaging by default, DiLoCo's with its parameters).
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptivePeriod {
    /// The first window's H.
    pub initial_period: u32,
    /// H is never halved below this.
    pub min_period: u32,
    /// H is never doubled above this.
    pub max_period: u32,
    /// An agreement at least this doubles H.
    pub agree: f64,
    /// An agreement below this halves H.
    pub disagree: f64,
    /// The outer step every window ends with.
    pub outer: OuterStep,
    /// The current H, advanced by [`SyncPolicy::outer_step`].
    pub state: AdaptiveState,
}

/// The format version of [`AdaptivePeriod`]'s snapshot, its first byte.
pub const SNAPSHOT_VERSION: u8 = 1;

/// The length of [`AdaptivePeriod`]'s snapshot in bytes.
pub const SNAPSHOT_LEN: usize = 14;

/// The agreement ρ = (k·a − 1) / (k − 1) of a window's drift, k = `world_size`; `None` where
/// there is nothing to measure: a single rank, or ranks that did not move (or whose norms are
/// not finite).
pub fn agreement(world_size: u32, tensors: &[TensorDrift]) -> Option<f64> {
    if world_size <= 1 {
        return None;
    }
    let mut mean = 0.0;
    let mut ranks = 0.0;
    for t in tensors {
        mean += t.delta_norm * t.delta_norm;
        ranks += t.rank_delta_norm * t.rank_delta_norm;
    }
    if !(mean.is_finite() && ranks.is_finite() && ranks > 0.0) {
        return None;
    }
    let k = f64::from(world_size);
    Some((k * (mean / ranks) - 1.0) / (k - 1.0))
}

impl Policy for AdaptivePeriod {
    fn info() -> Info {
        let mut params = vec![
            period_spec(
                8,
                "H of the first window (min_period <= period <= max_period)",
            ),
            ParamSpec::integer("min_period", 1, "H is never halved below this (>= 1)"),
            ParamSpec::integer(
                "max_period",
                64,
                "H is never doubled above this (>= min_period)",
            ),
            ParamSpec::float(
                "agree",
                0.8,
                "H doubles after a window whose agreement is at least this (in [0, 1])",
            ),
            ParamSpec::float(
                "disagree",
                0.5,
                "H halves after a window whose agreement is below this (in [0, agree])",
            ),
        ];
        params.extend(outer_specs(1.0, 0.0, false));
        Info::new(
            "adaptive-period",
            "Local SGD whose period doubles while the ranks' drifts agree and halves when they \
             disagree (stateful)",
            params,
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let min_period = period(p, "min_period")?;
        let max_period = period(p, "max_period")?;
        if max_period < min_period {
            return Err(format!(
                "max_period must be >= min_period ({min_period}), got {max_period}"
            ));
        }
        let initial_period = period(p, "period")?;
        if !(min_period..=max_period).contains(&initial_period) {
            return Err(format!(
                "period must be in [min_period, max_period] = [{min_period}, {max_period}], got \
                 {initial_period}"
            ));
        }
        let agree = float_in(p, "agree", 0.0, 1.0)?;
        let disagree = float_in(p, "disagree", 0.0, 1.0)?;
        if disagree > agree {
            return Err(format!(
                "disagree must be <= agree ({agree}), got {disagree}"
            ));
        }
        Ok(AdaptivePeriod {
            initial_period,
            min_period,
            max_period,
            agree,
            disagree,
            outer: outer_from_params(p)?,
            state: AdaptiveState {
                period: initial_period,
                adapted_at: None,
            },
        })
    }
}

impl AdaptivePeriod {
    /// H after a window of agreement `rho`: doubled, halved or kept, within the bounds.
    pub fn next_period(&self, period: u32, rho: Option<f64>) -> u32 {
        match rho {
            Some(r) if r >= self.agree => period.saturating_mul(2).min(self.max_period),
            Some(r) if r < self.disagree => (period / 2).max(self.min_period),
            _ => period,
        }
    }
}

impl SyncPolicy for AdaptivePeriod {
    fn plan(&self, _s: &State, w: &Window) -> StepKind {
        // The window is counted by the host, so a window of H steps ends at its H-th local step
        // whatever the step number: H changes between windows, never inside one.
        if w.local_steps >= self.state.period - 1 {
            StepKind::Average
        } else {
            StepKind::Local
        }
    }

    fn outer_step(&mut self, s: &State, w: &Window, tensors: &[TensorDrift]) -> OuterStep {
        if self.state.adapted_at.is_none_or(|at| w.windows > at) {
            let rho = agreement(s.world_size, tensors);
            self.state.period = self.next_period(self.state.period, rho);
            self.state.adapted_at = Some(w.windows);
        }
        self.outer.clone()
    }
}

impl Stateful for AdaptivePeriod {
    /// Nothing to observe: everything the policy learns is in the drift of a window's end,
    /// which only `outer_step` sees.
    fn observe(&mut self, _s: &State) {}

    fn snapshot(&self) -> Vec<u8> {
        let st = &self.state;
        let mut out = Vec::with_capacity(SNAPSHOT_LEN);
        out.push(SNAPSHOT_VERSION);
        out.extend(st.period.to_le_bytes());
        out.push(u8::from(st.adapted_at.is_some()));
        out.extend(st.adapted_at.unwrap_or(0).to_le_bytes());
        out
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        if snapshot.len() != SNAPSHOT_LEN {
            return Err(format!(
                "adaptive-period snapshot must be {SNAPSHOT_LEN} bytes, got {}",
                snapshot.len()
            ));
        }
        if snapshot[0] != SNAPSHOT_VERSION {
            return Err(format!(
                "adaptive-period snapshot has version {}, this plugin reads version \
                 {SNAPSHOT_VERSION}",
                snapshot[0]
            ));
        }
        let period = u32::from_le_bytes(snapshot[1..5].try_into().expect("4 bytes"));
        if !(self.min_period..=self.max_period).contains(&period) {
            return Err(format!(
                "adaptive-period snapshot has period {period}, outside [min_period, max_period] \
                 = [{}, {}]: it was taken with other parameters",
                self.min_period, self.max_period
            ));
        }
        let window = u64::from_le_bytes(snapshot[6..14].try_into().expect("8 bytes"));
        let adapted_at = match snapshot[5] {
            0 => None,
            1 => Some(window),
            flag => {
                return Err(format!(
                    "adaptive-period snapshot has an invalid flag byte {flag}"
                ));
            }
        };
        self.state = AdaptiveState { period, adapted_at };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::sync::testing::{at, drift, letters};
    use crate::testing::{configure, error};

    /// ‖Δ‖ and the ranks' rms ‖Δ_k‖ whose agreement on 2 ranks is `rho`: a = (1 + ρ) / 2.
    fn window_of(rho: f64) -> Vec<TensorDrift> {
        vec![drift(((1.0 + rho) / 2.0).sqrt(), 1.0)]
    }

    /// Where a simulated run stands: the next step and its window.
    type Position = (u64, Window);

    /// Runs `p` from `pos` for one window per entry of `rho`, each window ending with a drift
    /// of that agreement, and returns the plan letters and H before and after every window.
    fn run(p: &mut AdaptivePeriod, pos: &mut Position, rho: &[f64]) -> (String, Vec<u32>) {
        let mut kinds = Vec::new();
        let mut periods = vec![p.state.period];
        for &r in rho {
            loop {
                let (step, w) = *pos;
                let s = at(step, 10_000);
                p.observe(&s);
                let k = p.plan(&s, &w);
                kinds.push(k);
                if k == StepKind::Average {
                    p.outer_step(&s, &w, &window_of(r));
                    periods.push(p.state.period);
                }
                *pos = (step + 1, w.after(k));
                if k == StepKind::Average {
                    break;
                }
            }
        }
        (letters(&kinds), periods)
    }

    fn with(set: &[(&str, Value)]) -> AdaptivePeriod {
        configure(set).unwrap()
    }

    #[test]
    fn defaults() {
        let p: AdaptivePeriod = configure(&[]).unwrap();
        assert_eq!((p.initial_period, p.min_period, p.max_period), (8, 1, 64));
        assert_eq!((p.agree, p.disagree), (0.8, 0.5));
        assert_eq!(p.outer, OuterStep::average());
        assert_eq!(
            p.state,
            AdaptiveState {
                period: 8,
                adapted_at: None
            }
        );
    }

    #[test]
    fn doubles_while_agreeing_and_halves_when_not() {
        let mut p = with(&[
            ("period", Value::Integer(2)),
            ("max_period", Value::Integer(8)),
        ]);
        // 0.9 doubles, 0.6 holds, 0.3 halves; capped at 8, floored at 1.
        let rho = [0.9, 0.9, 0.9, 0.6, 0.3, 0.3, 0.3, 0.3, 0.9];
        let (seq, periods) = run(&mut p, &mut (0, Window::default()), &rho);
        assert_eq!(periods, [2, 4, 8, 8, 8, 4, 2, 1, 1, 2]);
        assert_eq!(seq, "LALLLALLLLLLLALLLLLLLALLLLLLLALLLALAAA");
    }

    #[test]
    fn the_thresholds_are_inclusive_below() {
        let p: AdaptivePeriod = configure(&[]).unwrap();
        assert_eq!(p.next_period(8, Some(0.8)), 16, "agree is inclusive");
        assert_eq!(p.next_period(8, Some(0.5)), 8, "disagree is exclusive");
        assert_eq!(p.next_period(8, Some(0.4999)), 4);
        assert_eq!(p.next_period(5, Some(0.0)), 2, "halving rounds down");
        assert_eq!(p.next_period(8, None), 8, "no measurement, no change");
        assert_eq!(p.next_period(64, Some(1.0)), 64);
        assert_eq!(p.next_period(1, Some(-0.5)), 1);
        let single = with(&[
            ("agree", Value::Float(0.6)),
            ("disagree", Value::Float(0.6)),
        ]);
        assert_eq!(single.next_period(8, Some(0.6)), 16, "one threshold");
        assert_eq!(single.next_period(8, Some(0.59)), 4);
    }

    #[test]
    fn agreement_is_one_for_equal_drifts_and_zero_for_independent_ones() {
        // Equal drifts on k ranks: the mean is each of them, a = 1.
        let same = [drift(3.0, 3.0), drift(4.0, 4.0)];
        for k in [2, 4, 32] {
            assert_eq!(agreement(k, &same), Some(1.0), "k={k}");
        }
        // k orthogonal drifts of equal norm r: ‖mean‖² = r²/k, a = 1/k, ρ = 0.
        for k in [2u32, 4, 8] {
            let r: f64 = 2.0;
            let t = [drift((r * r / f64::from(k)).sqrt(), r)];
            let rho = agreement(k, &t).unwrap();
            assert!(rho.abs() < 1e-12, "k={k}: {rho}");
        }
        // Opposite drifts cancel: a = 0, ρ = -1/(k-1).
        assert_eq!(agreement(2, &[drift(0.0, 1.0)]), Some(-1.0));
        // Summed over tensors before the ratio: (1 + 0) / (1 + 1) on 2 ranks gives ρ = 0.
        assert_eq!(agreement(2, &[drift(1.0, 1.0), drift(0.0, 1.0)]), Some(0.0));
        assert_eq!(
            agreement(1, &same),
            None,
            "one rank has nothing to agree with"
        );
        assert_eq!(agreement(2, &[drift(0.0, 0.0)]), None, "no movement");
        assert_eq!(agreement(2, &[]), None);
        assert_eq!(agreement(2, &[drift(f64::NAN, 1.0)]), None);
        assert_eq!(agreement(2, &[drift(1.0, f64::INFINITY)]), None);
    }

    #[test]
    fn a_repeated_outer_step_adapts_once() {
        let mut p: AdaptivePeriod = configure(&[]).unwrap();
        let w = Window {
            local_steps: 7,
            windows: 3,
        };
        let s = at(100, 1000);
        assert_eq!(p.plan(&s, &w), StepKind::Average);
        for _ in 0..3 {
            assert_eq!(p.outer_step(&s, &w, &window_of(1.0)), OuterStep::average());
        }
        assert_eq!(p.state.period, 16);
        assert_eq!(p.state.adapted_at, Some(3));
        let next = Window {
            local_steps: 15,
            windows: 4,
        };
        p.outer_step(&at(116, 1000), &next, &window_of(1.0));
        assert_eq!(p.state.period, 32);
    }

    #[test]
    fn one_rank_keeps_its_period() {
        let mut p: AdaptivePeriod = configure(&[]).unwrap();
        let s = State {
            world_size: 1,
            ..at(7, 1000)
        };
        p.outer_step(&s, &Window::default(), &[drift(1.0, 1.0)]);
        assert_eq!(p.state.period, 8);
    }

    #[test]
    fn outer_parameters_reach_the_outer_step() {
        let mut p = with(&[
            ("outer_lr", Value::Float(0.7)),
            ("outer_momentum", Value::Float(0.9)),
            ("nesterov", Value::Boolean(true)),
        ]);
        let o = p.outer_step(&at(7, 100), &Window::default(), &window_of(0.6));
        assert_eq!((o.lr, o.momentum, o.nesterov), (0.7, 0.9, true));
        assert!(o.lr_scale.is_empty());
    }

    #[test]
    fn snapshot_restore_round_trip() {
        let mut p = with(&[("period", Value::Integer(2))]);
        let rho = [0.9, 0.9, 0.3, 0.9, 0.6, 0.9, 0.3];
        let mut pos = (0, Window::default());
        run(&mut p, &mut pos, &rho[..3]);
        let snap = p.snapshot();
        assert_eq!(snap.len(), SNAPSHOT_LEN);
        let resumed_at = pos;
        let rest = run(&mut p, &mut pos, &rho[3..]);

        let mut fresh = with(&[("period", Value::Integer(2))]);
        let saved = AdaptiveState {
            period: 4,
            adapted_at: Some(2),
        };
        assert_ne!(fresh.state, saved);
        fresh.restore(&snap).unwrap();
        assert_eq!(fresh.state, saved);
        assert_eq!(fresh.snapshot(), snap, "snapshot(restore(x)) == x");
        let mut pos = resumed_at;
        assert_eq!(run(&mut fresh, &mut pos, &rho[3..]), rest);
        assert_eq!(fresh.snapshot(), p.snapshot());
    }

    #[test]
    fn restore_refuses_a_bad_snapshot() {
        let mut p: AdaptivePeriod = configure(&[]).unwrap();
        let good = p.snapshot();
        assert_eq!(
            p.restore(&good[..13]).unwrap_err(),
            "adaptive-period snapshot must be 14 bytes, got 13"
        );
        let mut v2 = good.clone();
        v2[0] = 2;
        assert_eq!(
            p.restore(&v2).unwrap_err(),
            "adaptive-period snapshot has version 2, this plugin reads version 1"
        );
        let mut flag = good.clone();
        flag[5] = 7;
        assert_eq!(
            p.restore(&flag).unwrap_err(),
            "adaptive-period snapshot has an invalid flag byte 7"
        );
        let mut big = good.clone();
        big[1..5].copy_from_slice(&128u32.to_le_bytes());
        assert_eq!(
            p.restore(&big).unwrap_err(),
            "adaptive-period snapshot has period 128, outside [min_period, max_period] = [1, \
             64]: it was taken with other parameters"
        );
        let mut zero = good.clone();
        zero[1..5].copy_from_slice(&0u32.to_le_bytes());
        assert!(p.restore(&zero).is_err());
        assert_eq!(p.snapshot(), good, "a refused snapshot changes nothing");
    }

    #[test]
    fn configure_errors() {
        let err = error::<AdaptivePeriod>;
        let int = Value::Integer;
        assert_eq!(
            err(&[("min_period", int(0))]),
            "min_period must be in [1, 4294967295], got 0"
        );
        assert_eq!(
            err(&[("min_period", int(16)), ("max_period", int(8))]),
            "max_period must be >= min_period (16), got 8"
        );
        assert_eq!(
            err(&[("period", int(128))]),
            "period must be in [min_period, max_period] = [1, 64], got 128"
        );
        assert_eq!(
            err(&[("min_period", int(4)), ("period", int(2))]),
            "period must be in [min_period, max_period] = [4, 64], got 2"
        );
        assert_eq!(
            err(&[("agree", Value::Float(1.5))]),
            "agree must be in [0, 1], got 1.5"
        );
        assert_eq!(
            err(&[("disagree", Value::Float(f64::NAN))]),
            "disagree must be in [0, 1], got NaN"
        );
        assert_eq!(
            err(&[("disagree", Value::Float(0.9))]),
            "disagree must be <= agree (0.8), got 0.9"
        );
        assert_eq!(
            err(&[("outer_momentum", Value::Float(1.0))]),
            "outer_momentum must be in [0, 1), got 1"
        );
        assert_eq!(
            err(&[("outer_lr", Value::Float(f64::INFINITY))]),
            "outer_lr must be >= 0, got inf"
        );
    }
}
