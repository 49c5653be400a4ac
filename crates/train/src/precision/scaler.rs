//! Dynamic loss scaling for fp16, with `torch.amp.GradScaler`'s rules (its
//! `_amp_update_scale_` kernel, which the tests run against): the backward pass sees the loss
//! times `scale`; the gradients are then multiplied by `1/scale` (in fp32, as GradScaler's
//! `inv_scale`). If any is inf or NaN the step is skipped, the scale multiplied by 0.5 and the
//! run of good steps reset; after `growth_interval` good steps in a row the scale doubles,
//! unless the double is no longer a finite fp32 number.

use serde::{Deserialize, Serialize};
use tch::Tensor;

/// Below this a scale cannot bring any gradient into fp16's range (2^-24 is its smallest
/// subnormal): a run that halves its scale past it keeps overflowing whatever the scale (its
/// forward pass overflows, or it diverged).
pub const MIN_SCALE: f64 = 1.0 / 16_777_216.0;
const GROWTH: f64 = 2.0;
const BACKOFF: f64 = 0.5;

/// The scaler's state: what a checkpoint keeps, so that a resumed run scales as the straight
/// run would.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct ScalerState {
    /// The current loss scale.
    pub scale: f64,
    /// Good steps since the last skip or growth (GradScaler's `growth_tracker`).
    pub growth_tracker: u32,
    /// Steps skipped since the run began.
    pub skipped: u64,
    /// Steps skipped in a row up to now.
    pub consecutive_skips: u32,
}

/// The loss scaler of an fp16 run.
#[derive(Debug, Clone, PartialEq)]
pub struct LossScaler {
    state: ScalerState,
    growth_interval: u32,
}

impl LossScaler {
    /// A scaler starting at `scale`, growing after `growth_interval` good steps.
    pub fn new(scale: f64, growth_interval: u32) -> Self {
        LossScaler {
            state: ScalerState {
                scale,
                growth_tracker: 0,
                skipped: 0,
                consecutive_skips: 0,
            },
            growth_interval,
        }
    }

    /// The scale the next backward pass multiplies the loss by.
    pub fn scale(&self) -> f64 {
        self.state.scale
    }

    /// The state, for checkpoints and metrics.
    pub fn state(&self) -> ScalerState {
        self.state
    }

    /// Continues from a checkpoint's state.
    pub fn restore(&mut self, state: ScalerState) {
        self.state = state;
    }

    /// Divides each defined gradient of `grads` by the scale, in place and in fp32; returns
    /// whether any element is now inf or NaN.
    pub fn unscale(&self, grads: &[Tensor]) -> bool {
        let _guard = tch::no_grad_guard();
        let inv = f64::from((1.0 / self.state.scale) as f32);
        let mut non_finite = false;
        for g in grads.iter().filter(|g| g.defined()) {
            let _ = g.shallow_clone().g_mul_scalar_(inv);
            non_finite |= g.isfinite().all().int64_value(&[]) == 0;
        }
        non_finite
    }

    /// Ends a step: `overflow` (agreed by every rank) skips it and halves the scale, else the
    /// run of good steps grows (and the scale with it every `growth_interval`). Returns whether
    /// the step was skipped.
    pub fn update(&mut self, overflow: bool) -> bool {
        let s = &mut self.state;
        if overflow {
            s.scale *= BACKOFF;
            s.growth_tracker = 0;
            s.skipped += 1;
            s.consecutive_skips += 1;
        } else {
            s.consecutive_skips = 0;
            s.growth_tracker += 1;
            if s.growth_tracker == self.growth_interval {
                let grown = s.scale * GROWTH;
                if (grown as f32).is_finite() {
                    s.scale = grown;
                }
                s.growth_tracker = 0;
            }
        }
        overflow
    }

    /// Whether the scale has fallen below [`MIN_SCALE`]: no scale helps this run.
    pub fn collapsed(&self) -> bool {
        self.state.scale < MIN_SCALE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// The same overflow pattern through libtorch's `_amp_update_scale_`, which GradScaler
    /// calls: (scale, growth tracker) after each step.
    fn torch_trajectory(init: f64, interval: i64, overflows: &[bool]) -> Vec<(f64, i64)> {
        let mut scale = Tensor::from_slice(&[init as f32]);
        let tracker = Tensor::zeros([1], (Kind::Int, Device::Cpu));
        overflows
            .iter()
            .map(|&o| {
                let found = Tensor::from_slice(&[if o { 1.0f32 } else { 0.0 }]);
                let _ =
                    scale.internal_amp_update_scale_(&tracker, &found, GROWTH, BACKOFF, interval);
                (scale.double_value(&[0]), tracker.int64_value(&[0]))
            })
            .collect()
    }

    #[test]
    fn the_scale_follows_gradscalers_kernel_step_by_step() {
        // A pseudo-random pattern with runs long enough to grow, and a start near fp32's top
        // so that growth is refused there as libtorch refuses it.
        let mut x = 12345u32;
        let overflows: Vec<bool> = (0..400)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                (x >> 16).is_multiple_of(9)
            })
            .collect();
        for (init, interval) in [(65536.0, 3), (2f64.powi(126), 2), (1.0, 1), (1024.0, 2000)] {
            let mut s = LossScaler::new(init, interval);
            let want = torch_trajectory(init, i64::from(interval), &overflows);
            for (i, (&o, (scale, tracker))) in overflows.iter().zip(want).enumerate() {
                assert_eq!(s.update(o), o);
                assert_eq!(
                    (s.scale(), i64::from(s.state().growth_tracker)),
                    (scale, tracker),
                    "init {init}, interval {interval}, step {i}"
                );
            }
            assert_eq!(
                s.state().skipped,
                overflows.iter().filter(|&&o| o).count() as u64
            );
        }
    }

    #[test]
    fn unscale_divides_in_fp32_and_finds_inf_and_nan_in_any_tensor() {
        let s = LossScaler::new(1024.0, 2000);
        let a = Tensor::from_slice(&[2048.0f32, -512.0]);
        let b = Tensor::from_slice(&[1.0f32, 3.0, 5.0]);
        assert!(!s.unscale(&[a.shallow_clone(), Tensor::new(), b.shallow_clone()]));
        assert_eq!(Vec::<f32>::try_from(&a).unwrap(), [2.0, -0.5]);
        assert_eq!(
            Vec::<f32>::try_from(&b).unwrap(),
            [1.0 / 1024.0, 3.0 / 1024.0, 5.0 / 1024.0]
        );
        for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            let c = Tensor::from_slice(&[1.0f32, bad]);
            assert!(s.unscale(&[a.shallow_clone(), c]), "{bad}");
        }
    }

    #[test]
    fn halving_past_the_smallest_fp16_subnormal_collapses() {
        let mut s = LossScaler::new(2.0, 2000);
        let mut halvings = 0;
        while !s.collapsed() {
            s.update(true);
            halvings += 1;
        }
        assert_eq!(halvings, 26);
        assert_eq!(s.state().consecutive_skips, 26);
        s.update(false);
        assert_eq!(s.state().consecutive_skips, 0);
    }
}
