//! Error feedback (`--error-feedback`): what each rank keeps, per bucket, of what its codec did
//! not send, and adds back before the next encode. Two modes:
//!
//! - **`residual`** (GRACE's residual, EF-SGD): p = g + e; the codec encodes p;
//!   e ← p − D(own), where D(own) is the decode of this rank's own payload. The optimizer's
//!   momentum and weight decay then act on the exchanged sum as on a plain gradient.
//! - **`mean`** (PyTorch `powerSGD_hook`'s residual): p = g + e; e ← p − D(Σ)/k, the rank's
//!   input minus the step's reconstruction averaged over the k ranks. The residuals of all
//!   ranks add up to the same total as in `residual` mode (Σp − D(Σ) for a codec whose decode
//!   is linear); only their split between the ranks differs.
//! - **`momentum`** (Deep Gradient Compression's *momentum correction* and *momentum factor
//!   masking*, Lin et al. 2018): the rank accumulates its velocity, not its gradient.
//!   u ← m·u + g; v ← v + u; the codec encodes v; v ← v − D(own); u_i ← 0 wherever D(own)_i
//!   is nonzero (a NaN counts as nonzero, ±0 does not): an entry the payload carries restarts
//!   its momentum, as the paper's mask of sent entries does. `g` is the rank's gradient with
//!   weight decay already added (λw, as the optimizer would add it), and the optimizer then
//!   applies w ← w − η·Σ_ranks D(payload) with no momentum and no decay of its own.
//!
//! For a sparsifier (top-k, `dgc`, threshold, random-k without rescaling) D(own) is nonzero at
//! exactly the entries sent with a nonzero value, so the mask is the paper's. A dense codec
//! (fp16, int8, …) carries nearly every entry, so in `momentum` mode the velocity restarts
//! every step and the run is error feedback without momentum: use `residual` there.
//!
//! All arithmetic is binary32, element by element in a fixed order (u·m rounded, then + g), so
//! every rank and every resume computes the same bits. The update of a step is staged
//! ([`Staged`]) and committed only once every bucket's exchange succeeded; the state before
//! it is kept for [`Memory::rollback`].

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// How the exchange treats what a codec drops (`--error-feedback [MODE]`).
#[derive(ValueEnum, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ErrorFeedback {
    /// Nothing is kept: what the codec drops is lost.
    #[default]
    Off,
    /// GRACE's residual: p = g + e; e ← p − decode(own payload) (the flag alone).
    Residual,
    /// PyTorch powerSGD_hook's residual: p = g + e; e ← p − decode(sum of payloads) / ranks.
    Mean,
    /// DGC's momentum correction and masking: the velocity u ← m·u + g is accumulated,
    /// v ← v + u is encoded, v ← v − decode(own), and u is zeroed where the payload sent.
    Momentum,
}

impl ErrorFeedback {
    /// Whether the momentum lives in the exchange (and the optimizer must not add its own).
    pub fn moves_momentum(self) -> bool {
        self == ErrorFeedback::Momentum
    }

    /// What a run's opening line says about it (empty when off).
    pub fn announce(self) -> &'static str {
        match self {
            ErrorFeedback::Off => "",
            ErrorFeedback::Residual => ", error feedback",
            ErrorFeedback::Mean => ", error feedback (residual against the ranks' mean)",
            ErrorFeedback::Momentum => ", error feedback with momentum correction (DGC)",
        }
    }
}

/// Checkpoints written before the modes existed hold `true`/`false`: they read as
/// `residual`/`off`, so an old run resumes with `--error-feedback` as it was started.
impl<'de> Deserialize<'de> for ErrorFeedback {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "lowercase")]
        enum Named {
            Off,
            Residual,
            Mean,
            Momentum,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Saved {
            Flag(bool),
            Mode(Named),
        }
        Ok(match Saved::deserialize(d)? {
            Saved::Flag(false) | Saved::Mode(Named::Off) => ErrorFeedback::Off,
            Saved::Flag(true) | Saved::Mode(Named::Residual) => ErrorFeedback::Residual,
            Saved::Mode(Named::Mean) => ErrorFeedback::Mean,
            Saved::Mode(Named::Momentum) => ErrorFeedback::Momentum,
        })
    }
}

/// One bucket's feedback state after an exchange, not yet committed.
#[derive(Debug, Clone, PartialEq)]
pub struct Staged {
    /// The new residual e (`residual`) or accumulation v (`momentum`).
    residual: Vec<f32>,
    /// The new, masked velocity u (`momentum`; empty otherwise).
    velocity: Vec<f32>,
}

/// Every bucket's residual (the accumulation v, in `momentum` mode) and, in `momentum` mode,
/// velocity (empty otherwise).
#[derive(Debug, Clone, Default, PartialEq)]
struct State {
    residuals: Vec<Vec<f32>>,
    velocities: Vec<Vec<f32>>,
}

/// A rank's error-feedback state, and the one before the last exchange.
#[derive(Debug, Clone)]
pub struct Memory {
    /// m of `u ← m·u + g` (`momentum` mode only).
    momentum: Option<f32>,
    now: State,
    /// The state before the last commit, until the next one.
    previous: Option<State>,
}

impl Memory {
    /// Zero state for buckets of `lens` floats in `mode` (`None` when off); `momentum` is m.
    pub fn new(mode: ErrorFeedback, momentum: f64, lens: &[usize]) -> Option<Memory> {
        let zeros = || lens.iter().map(|&n| vec![0.0f32; n]).collect::<Vec<_>>();
        let momentum = match mode {
            ErrorFeedback::Off => return None,
            ErrorFeedback::Residual | ErrorFeedback::Mean => None,
            ErrorFeedback::Momentum => Some(momentum as f32),
        };
        let now = State {
            residuals: zeros(),
            velocities: if momentum.is_some() {
                zeros()
            } else {
                Vec::new()
            },
        };
        Some(Memory {
            momentum,
            now,
            previous: None,
        })
    }

    /// Turns bucket `b`'s gradient `g` into what the codec encodes (p = g + e, or v + u with
    /// u = m·u + g), in place; returns the new velocity (empty in `residual` mode).
    pub fn compensate(&self, b: usize, g: &mut [f32]) -> Vec<f32> {
        let e = &self.now.residuals[b];
        let Some(m) = self.momentum else {
            for (x, e) in g.iter_mut().zip(e) {
                *x += e;
            }
            return Vec::new();
        };
        let mut u = self.now.velocities[b].clone();
        for ((x, u), v) in g.iter_mut().zip(&mut u).zip(e) {
            *u = *u * m + *x;
            *x = v + *u;
        }
        u
    }

    /// The state of a bucket that sent `p` (what [`Memory::compensate`] returned in place) and
    /// reconstructs its own payload as `own`; `velocity` is what `compensate` returned.
    pub fn settle(&self, p: &[f32], own: &[f32], mut velocity: Vec<f32>) -> Staged {
        let residual = p.iter().zip(own).map(|(p, d)| p - d).collect();
        for (u, d) in velocity.iter_mut().zip(own) {
            if *d != 0.0 {
                *u = 0.0;
            }
        }
        Staged { residual, velocity }
    }

    /// Makes a whole exchange's staged buckets (in bucket order) the state, keeping the old
    /// one for [`Memory::rollback`].
    pub fn commit(&mut self, staged: Vec<Staged>) {
        let (residuals, velocities): (Vec<_>, Vec<_>) =
            staged.into_iter().map(|s| (s.residual, s.velocity)).unzip();
        let next = State {
            residuals,
            velocities: if self.momentum.is_some() {
                velocities
            } else {
                Vec::new()
            },
        };
        self.previous = Some(std::mem::replace(&mut self.now, next));
    }

    /// Puts back the state from before the last commit (once).
    pub fn rollback(&mut self) {
        if let Some(previous) = self.previous.take() {
            self.now = previous;
        }
    }

    /// Each bucket's residual (accumulation in `momentum` mode).
    pub fn residuals(&self) -> &[Vec<f32>] {
        &self.now.residuals
    }

    /// Each bucket's velocity (empty unless `momentum` mode).
    pub fn velocities(&self) -> &[Vec<f32>] {
        &self.now.velocities
    }

    /// Mutable state for a restore: residuals and velocities.
    pub fn state_mut(&mut self) -> (&mut [Vec<f32>], &mut [Vec<f32>]) {
        (&mut self.now.residuals, &mut self.now.velocities)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in codec: keeps the largest magnitude (lower index on ties), zeroes the rest.
    fn top1(p: &[f32]) -> Vec<f32> {
        let mut best = 0;
        for (i, x) in p.iter().enumerate() {
            if x.abs() > p[best].abs() {
                best = i;
            }
        }
        (0..p.len())
            .map(|i| if i == best { p[i] } else { 0.0 })
            .collect()
    }

    /// Three steps of one bucket through `mode`, returning what was sent each step.
    fn run(mode: ErrorFeedback, grads: &[[f32; 3]]) -> (Vec<Vec<f32>>, Memory) {
        let mut mem = Memory::new(mode, 0.5, &[3]).unwrap();
        let mut sent = Vec::new();
        for g in grads {
            let mut p = g.to_vec();
            let u = mem.compensate(0, &mut p);
            let own = top1(&p);
            let staged = mem.settle(&p, &own, u);
            mem.commit(vec![staged]);
            sent.push(own);
        }
        (sent, mem)
    }

    const GRADS: [[f32; 3]; 3] = [[1.0, 0.5, -0.25], [0.5, 1.0, 0.25], [0.25, 0.25, 1.0]];

    #[test]
    fn momentum_mode_accumulates_the_velocity_and_masks_what_was_sent() {
        // By hand, m = 0.5:
        // step 0: u = g = [1, .5, -.25]; v = u; send [1, 0, 0]; v = [0, .5, -.25];
        //         u masked at 0 = [0, .5, -.25]
        // step 1: u = .5·u + g = [.5, 1.25, .125]; v = [.5, 1.75, -.125]; send [0, 1.75, 0];
        //         v = [.5, 0, -.125]; u = [.5, 0, .125]
        // step 2: u = [.5, .25, 1.0625]; v = [1, .25, .9375]; send [1, 0, 0];
        //         v = [0, .25, .9375]; u = [0, .25, 1.0625]
        let (sent, mem) = run(ErrorFeedback::Momentum, &GRADS);
        assert_eq!(
            sent,
            [[1.0, 0.0, 0.0], [0.0, 1.75, 0.0], [1.0, 0.0, 0.0]].map(Vec::from)
        );
        assert_eq!(mem.residuals(), [vec![0.0, 0.25, 0.9375]]);
        assert_eq!(mem.velocities(), [vec![0.0, 0.25, 1.0625]]);
    }

    #[test]
    fn residual_mode_is_grace_and_keeps_no_velocity() {
        // step 0: p = g; send [1, 0, 0]; e = [0, .5, -.25]
        // step 1: p = [.5, 1.5, 0]; send [0, 1.5, 0]; e = [.5, 0, 0]
        // step 2: p = [.75, .25, 1]; send [0, 0, 1]; e = [.75, .25, 0]
        let (sent, mem) = run(ErrorFeedback::Residual, &GRADS);
        assert_eq!(
            sent,
            [[1.0, 0.0, 0.0], [0.0, 1.5, 0.0], [0.0, 0.0, 1.0]].map(Vec::from)
        );
        assert_eq!(mem.residuals(), [vec![0.75, 0.25, 0.0]]);
        assert!(mem.velocities().is_empty());
        assert!(Memory::new(ErrorFeedback::Off, 0.5, &[3]).is_none());
    }

    #[test]
    fn a_rollback_restores_residual_and_velocity_once() {
        let (_, mut mem) = run(ErrorFeedback::Momentum, &GRADS[..2]);
        let before = (mem.residuals().to_vec(), mem.velocities().to_vec());
        let mut p = GRADS[2].to_vec();
        let u = mem.compensate(0, &mut p);
        let staged = mem.settle(&p, &top1(&p), u);
        mem.commit(vec![staged]);
        assert_ne!(mem.velocities(), &before.1[..]);
        mem.rollback();
        assert_eq!(
            (mem.residuals(), mem.velocities()),
            (&before.0[..], &before.1[..])
        );
        mem.rollback(); // nothing left to undo
        assert_eq!(mem.residuals(), &before.0[..]);
    }

    #[test]
    fn old_checkpoints_flags_read_as_modes() {
        let read = |s: &str| serde_json::from_str::<ErrorFeedback>(s).unwrap();
        assert_eq!(read("false"), ErrorFeedback::Off);
        assert_eq!(read("true"), ErrorFeedback::Residual);
        assert_eq!(read("\"momentum\""), ErrorFeedback::Momentum);
        assert_eq!(read("\"residual\""), ErrorFeedback::Residual);
        assert_eq!(read("\"mean\""), ErrorFeedback::Mean);
        assert!(serde_json::from_str::<ErrorFeedback>("\"dgc\"").is_err());
        assert_eq!(
            serde_json::to_string(&ErrorFeedback::Momentum).unwrap(),
            "\"momentum\""
        );
    }
}
