//! SGD with momentum, optional Nesterov and weight decay, in either of the two forms that
//! Goyal et al. (§2.1, Appendix) discuss.
//!
//! With `d = ∇L + λw` (λ = 0 for parameters excluded from decay):
//!
//! - **`pytorch`** (the default; `torch.optim.SGD`): `v ← m·v + d`, `w ← w − η·v`
//!   (Nesterov: `w ← w − η·(d + m·v)`). The LR multiplies the step, not the history, so a
//!   changing LR needs no correction.
//! - **`goyal`** (Goyal's eq. 9, Caffe style): `u ← m·c·u + η·d`, `w ← w − u`
//!   (Nesterov: `w ← w − (m·u + η·d)`). The history already carries past LRs, so when the LR
//!   changes from η_t to η_{t+1} the momentum correction `c = η_{t+1}/η_t` keeps the update
//!   equivalent to the `pytorch` form; `--no-momentum-correction` (c = 1) reproduces the
//!   pitfall Goyal warns about, for study.
//!
//! Weight decay is part of the update (`d`), never folded into the loss, so it is unaffected
//! by the loss scaling the trainer does for gradient accumulation and workers.
//!
//! With `--error-feedback momentum` (Deep Gradient Compression's momentum correction) the
//! exchange has already added λw, accumulated the velocity and summed the ranks' sparse
//! accumulations, so the optimizer only steps along what arrives: `w ← w − η·g`, no history
//! and no decay of its own ([`Sgd::with_momentum_in_exchange`]).

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use tch::Tensor;
use tch::nn::VarStore;

use super::{LrScale, Norms, Optimizer, Param, named_state, restore_state};
use crate::Error;

/// Which update equations to use.
#[derive(ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SgdForm {
    /// `v ← m·v + d; w ← w − η·v` (needs no momentum correction).
    Pytorch,
    /// `u ← m·(η_{t+1}/η_t)·u + η·d; w ← w − u` (Goyal's form, with momentum correction).
    Goyal,
}

/// Optimiser settings.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    /// Momentum m.
    pub momentum: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Weight decay λ.
    pub weight_decay: f64,
    /// Also decay BatchNorm γ/β and biases (all parameters with fewer than two dimensions).
    pub decay_bn_and_bias: bool,
    /// Update equations.
    pub form: SgdForm,
    /// Scale the `goyal` history by η_{t+1}/η_t when the LR changes.
    pub momentum_correction: bool,
}

impl Default for SgdConfig {
    /// Goyal et al.'s ImageNet settings: momentum 0.9, weight decay 1e-4 on every parameter,
    /// no Nesterov, in PyTorch's form.
    fn default() -> Self {
        SgdConfig {
            momentum: 0.9,
            nesterov: false,
            weight_decay: 1e-4,
            decay_bn_and_bias: true,
            form: SgdForm::Pytorch,
            momentum_correction: true,
        }
    }
}

impl SgdConfig {
    /// Refuses settings that are not an optimiser.
    pub fn validate(&self) -> Result<(), Error> {
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(Error::Config(format!(
                "--momentum {} must be in [0, 1)",
                self.momentum
            )));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(Error::Config(format!(
                "--weight-decay {} must be finite and >= 0",
                self.weight_decay
            )));
        }
        if self.nesterov && self.momentum == 0.0 {
            return Err(Error::Config(
                "--nesterov needs a --momentum above 0".into(),
            ));
        }
        Ok(())
    }
}

/// Prefix of the history tensors in [`Sgd`]'s state.
const HISTORY: &str = "optim.history.";

/// SGD with momentum over every trainable variable of a store.
pub struct Sgd {
    config: SgdConfig,
    params: Vec<Param>,
    /// Weight decay of each parameter (0 for those excluded).
    decay: Vec<f64>,
    /// `v` (pytorch form) or `u` (goyal form) of each parameter.
    history: Vec<Tensor>,
    last_lr: Option<f64>,
    /// Each parameter's LR multiplier at the last step: the Goyal form's momentum correction
    /// is the ratio of a parameter's effective rates, η_{t+1}·s_{t+1} / (η_t·s_t).
    last_scale: Vec<f64>,
    /// The exchange applies momentum and decay (`--error-feedback momentum`): step along the
    /// gradient as it is.
    momentum_in_exchange: bool,
    /// `--momentum`, which a schedule's momentum overrides step by step.
    configured_momentum: f64,
}

impl Sgd {
    /// An optimiser for the trainable variables of `vs`, with zero history.
    pub fn new(vs: &VarStore, config: SgdConfig) -> Self {
        let params = Param::trainable(vs);
        let decay = Param::decays(&params, config.weight_decay, config.decay_bn_and_bias);
        let history = Param::zeros(&params);
        Sgd {
            config,
            last_scale: vec![1.0; params.len()],
            params,
            decay,
            history,
            last_lr: None,
            momentum_in_exchange: false,
            configured_momentum: config.momentum,
        }
    }

    /// The same optimizer for a run whose exchange keeps the momentum and adds the weight
    /// decay (`--error-feedback momentum`): each step is `w ← w − η·s·g` with the exchanged
    /// `g`, the history stays zero (it is still checkpointed, so the layout is SGD's).
    pub fn with_momentum_in_exchange(mut self) -> Self {
        self.momentum_in_exchange = true;
        self
    }

    /// Names of the parameters weight decay applies to.
    pub fn decayed(&self) -> Vec<&str> {
        self.params
            .iter()
            .zip(&self.decay)
            .filter(|(_, d)| **d != 0.0)
            .map(|(p, _)| p.name.as_str())
            .collect()
    }

    /// The step of one parameter with gradient-plus-decay `d` at rate `lr`, updating its
    /// history; `correction` is the Goyal form's momentum correction.
    fn direction(&self, i: usize, d: Tensor, lr: f64, correction: f64) -> Tensor {
        let SgdConfig {
            momentum: m,
            nesterov,
            form,
            ..
        } = self.config;
        let history = &self.history[i];
        match form {
            SgdForm::Pytorch if m == 0.0 => d * lr,
            SgdForm::Pytorch => {
                let _ = history.shallow_clone().g_mul_scalar_(m).g_add_(&d);
                if nesterov {
                    (&d + history * m) * lr
                } else {
                    history * lr
                }
            }
            SgdForm::Goyal => {
                let scaled = &d * lr;
                if m == 0.0 {
                    return scaled;
                }
                let _ = history
                    .shallow_clone()
                    .g_mul_scalar_(m * correction)
                    .g_add_(&scaled);
                if nesterov {
                    history * m + scaled
                } else {
                    history.shallow_clone()
                }
            }
        }
    }
}

impl Sgd {
    /// The update of parameter `i` at a learning rate of 1 from gradient-plus-decay `d`, in
    /// the `pytorch` form (the `goyal` history is `η·s` times its momentum buffer), without
    /// touching the history.
    fn unit_update(&self, i: usize, d: &Tensor) -> Tensor {
        let m = self.config.momentum;
        if m == 0.0 || self.momentum_in_exchange {
            return d.shallow_clone();
        }
        let history = &self.history[i];
        let v = match (self.config.form, self.last_lr) {
            (SgdForm::Pytorch, _) => history.shallow_clone(),
            (SgdForm::Goyal, Some(prev)) if prev * self.last_scale[i] != 0.0 => {
                history / (prev * self.last_scale[i])
            }
            (SgdForm::Goyal, _) => history.zeros_like(),
        };
        let next = v * m + d;
        if self.config.nesterov {
            d + next * m
        } else {
            next
        }
    }
}

impl Optimizer for Sgd {
    fn params(&self) -> &[Param] {
        &self.params
    }

    fn weight_decays(&self) -> &[f64] {
        &self.decay
    }

    fn norms(&self) -> Vec<Norms> {
        Norms::of(&self.params, |i, w, g| {
            let d = if self.decay[i] != 0.0 && !self.momentum_in_exchange {
                g + w * self.decay[i]
            } else {
                g.shallow_clone()
            };
            self.unit_update(i, &d)
        })
    }

    fn set_momentum(&mut self, momentum: Option<f64>) {
        self.config.momentum = momentum.unwrap_or(self.configured_momentum);
    }

    fn step(&mut self, lr: f64, scale: &LrScale) {
        let _guard = tch::no_grad_guard();
        for i in 0..self.params.len() {
            let s = scale.of(i);
            // Multiplying by a scale of 1 is exact, so unscaled runs keep their bits.
            let rate = if s == 1.0 { lr } else { lr * s };
            let correction = match (
                self.config.form,
                self.config.momentum_correction,
                self.last_lr,
            ) {
                (SgdForm::Goyal, true, Some(prev)) if prev != 0.0 => {
                    if s == self.last_scale[i] {
                        lr / prev
                    } else {
                        rate / (prev * self.last_scale[i])
                    }
                }
                _ => 1.0,
            };
            self.last_scale[i] = s;
            let weight = &self.params[i].tensor;
            let mut d = weight.grad();
            if !d.defined() {
                continue;
            }
            if self.momentum_in_exchange {
                let _ = weight.shallow_clone().g_sub_(&(d * rate));
                continue;
            }
            if self.decay[i] != 0.0 {
                d = &d + weight * self.decay[i];
            }
            let step = self.direction(i, d, rate, correction);
            let _ = weight.shallow_clone().g_sub_(&step);
        }
        self.last_lr = Some(lr);
    }

    fn last_lr(&self) -> Option<f64> {
        self.last_lr
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        named_state(HISTORY, &self.params, &self.history)
    }

    fn load_state(
        &mut self,
        tensors: &[(String, Tensor)],
        last_lr: Option<f64>,
    ) -> Result<(), Error> {
        restore_state(tensors, HISTORY, &self.params, &mut self.history)?;
        self.last_lr = last_lr;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn config(form: SgdForm, nesterov: bool, correction: bool) -> SgdConfig {
        SgdConfig {
            momentum: 0.5,
            nesterov,
            weight_decay: 0.25,
            decay_bn_and_bias: true,
            form,
            momentum_correction: correction,
        }
    }

    /// Runs SGD on `w0 = [1, −2]` with the loss `Σ c·w` (gradient `c = [0.5, 1]`) at the given
    /// LRs. Every intermediate value is a short binary fraction, so f32 is exact and the
    /// hand-computed results below compare with `==`.
    fn run(cfg: SgdConfig, lrs: &[f64]) -> Vec<f32> {
        run_scaled(cfg, lrs, None)
    }

    /// Like [`run`], with per-tensor LR multipliers (one tensor here) when `scales` is given.
    fn run_scaled(cfg: SgdConfig, lrs: &[f64], scales: Option<&[f64]>) -> Vec<f32> {
        let vs = VarStore::new(Device::Cpu);
        let w = vs
            .root()
            .var_copy("w", &Tensor::from_slice(&[1.0f32, -2.0]));
        let c = Tensor::from_slice(&[0.5f32, 1.0]);
        let mut opt = Sgd::new(&vs, cfg);
        for (i, &lr) in lrs.iter().enumerate() {
            opt.zero_grad();
            (&w * &c).sum(Kind::Float).backward();
            let scale = scales.map_or(LrScale::Uniform, |s| LrScale::PerTensor(vec![s[i]]));
            opt.step(lr, &scale);
        }
        Vec::try_from(&w).unwrap()
    }

    #[test]
    fn a_per_tensor_scale_multiplies_that_tensors_rate() {
        let cfg = config(SgdForm::Pytorch, false, true);
        // Scales of 1 are the unscaled optimizer, bit for bit.
        assert_eq!(
            run_scaled(cfg, &[0.5, 0.25], Some(&[1.0, 1.0])),
            run(cfg, &[0.5, 0.25])
        );
        // A scale s at rate η is the rate s·η.
        assert_eq!(run_scaled(cfg, &[0.25], Some(&[2.0])), run(cfg, &[0.5]));
        // Goyal's momentum correction follows each tensor's effective rate.
        let goyal = config(SgdForm::Goyal, false, true);
        assert_eq!(
            run_scaled(goyal, &[0.25, 0.25], Some(&[2.0, 1.0])),
            run(cfg, &[0.5, 0.25])
        );
    }

    #[test]
    fn norms_are_those_of_the_weights_the_gradient_and_the_next_step_at_lr_1() {
        for form in [SgdForm::Pytorch, SgdForm::Goyal] {
            let vs = VarStore::new(Device::Cpu);
            let w = vs
                .root()
                .var_copy("w", &Tensor::from_slice(&[1.0f32, -2.0]));
            let c = Tensor::from_slice(&[0.5f32, 1.0]);
            let mut opt = Sgd::new(&vs, config(form, false, true));
            (&w * &c).sum(Kind::Float).backward();
            // No history yet: u = d = c + λw = [0.75, 0.5].
            let n = opt.norms()[0];
            assert_eq!((n.weight, n.grad), (5f64.sqrt(), 1.25f64.sqrt()));
            assert_eq!(n.update, 0.8125f64.sqrt());
            opt.step(0.5, &LrScale::Uniform);
            opt.zero_grad();
            (&w * &c).sum(Kind::Float).backward();
            // w = [0.625, −2.25]; d = [0.65625, 0.4375]; u = m·v + d = [1.03125, 0.6875] in
            // both forms (Goyal's history is η·v).
            let n = opt.norms()[0];
            assert_eq!(
                n.update,
                (1.03125f64.powi(2) + 0.6875f64.powi(2)).sqrt(),
                "{form:?}"
            );
        }
    }

    #[test]
    fn pytorch_form_matches_the_hand_computation() {
        // d = c + λw = [0.75, 0.5]; v = d; w = w − 0.5·v
        assert_eq!(
            run(config(SgdForm::Pytorch, false, true), &[0.5]),
            [0.625, -2.25]
        );
        // d = c + λw = [0.65625, 0.4375]; v = 0.5·v + d = [1.03125, 0.6875]; w −= 0.25·v
        assert_eq!(
            run(config(SgdForm::Pytorch, false, true), &[0.5, 0.25]),
            [0.3671875, -2.421875]
        );
    }

    #[test]
    fn nesterov_steps_along_gradient_plus_momentum() {
        // v = d = [0.75, 0.5]; step = d + m·v = [1.125, 0.75]; w −= 0.5·step
        assert_eq!(
            run(config(SgdForm::Pytorch, true, true), &[0.5]),
            [0.4375, -2.375]
        );
        // Goyal's form gives the same first step: u = η·d; w −= m·u + η·d.
        assert_eq!(
            run(config(SgdForm::Goyal, true, true), &[0.5]),
            [0.4375, -2.375]
        );
    }

    #[test]
    fn momentum_correction_makes_goyal_equal_pytorch_when_the_lr_changes() {
        let lrs = [0.5, 0.25];
        let torch = run(config(SgdForm::Pytorch, false, true), &lrs);
        // u = 0.5·(0.25/0.5)·[0.375, 0.25] + 0.25·d = [0.2578125, 0.171875] = 0.25·v
        assert_eq!(run(config(SgdForm::Goyal, false, true), &lrs), torch);
        // Without it: u = 0.5·[0.375, 0.25] + 0.25·d = [0.3515625, 0.234375].
        assert_eq!(
            run(config(SgdForm::Goyal, false, false), &lrs),
            [0.2734375, -2.484375]
        );
        // At a constant LR the correction is 1 and both forms agree.
        assert_eq!(
            run(config(SgdForm::Goyal, false, false), &[0.5, 0.5]),
            run(config(SgdForm::Pytorch, false, true), &[0.5, 0.5])
        );
    }

    #[test]
    fn with_momentum_in_the_exchange_it_steps_along_the_gradient_alone() {
        // No decay, no history: w = [1, −2] − 0.5·[0.5, 1], then − 0.25·[0.5, 1].
        let vs = VarStore::new(Device::Cpu);
        let w = vs
            .root()
            .var_copy("w", &Tensor::from_slice(&[1.0f32, -2.0]));
        let c = Tensor::from_slice(&[0.5f32, 1.0]);
        let mut opt =
            Sgd::new(&vs, config(SgdForm::Pytorch, false, true)).with_momentum_in_exchange();
        for lr in [0.5, 0.25] {
            opt.zero_grad();
            (&w * &c).sum(Kind::Float).backward();
            opt.step(lr, &LrScale::Uniform);
        }
        assert_eq!(Vec::<f32>::try_from(&w).unwrap(), [0.625, -2.75]);
        assert_eq!(Vec::<f32>::try_from(&opt.state()[0].1).unwrap(), [0.0, 0.0]);
        assert_eq!(opt.norms()[0].update, 1.25f64.sqrt());
    }

    #[test]
    fn bn_and_bias_exclusion_leaves_vectors_undecayed() {
        let vs = VarStore::new(Device::Cpu);
        let fc = vs.root() / "fc";
        let _w = fc.var_copy("weight", &Tensor::from_slice(&[1.0f32]).view([1, 1]));
        let _b = fc.var_copy("bias", &Tensor::from_slice(&[1.0f32]));
        let mut cfg = config(SgdForm::Pytorch, false, true);
        cfg.decay_bn_and_bias = false;
        assert_eq!(Sgd::new(&vs, cfg).decayed(), ["fc.weight"]);
        cfg.decay_bn_and_bias = true;
        assert_eq!(Sgd::new(&vs, cfg).decayed(), ["fc.bias", "fc.weight"]);
    }

    #[test]
    fn state_round_trips_and_refuses_a_wrong_shape() {
        let cfg = config(SgdForm::Goyal, false, true);
        let vs = VarStore::new(Device::Cpu);
        let w = vs
            .root()
            .var_copy("w", &Tensor::from_slice(&[1.0f32, -2.0]));
        let mut opt = Sgd::new(&vs, cfg);
        (&w * 2.0).sum(Kind::Float).backward();
        opt.step(0.5, &LrScale::Uniform);
        let saved = opt.state();
        let mut other = Sgd::new(&vs, cfg);
        other.load_state(&saved, opt.last_lr()).unwrap();
        assert_eq!(
            Vec::<f32>::try_from(&other.state()[0].1).unwrap(),
            Vec::<f32>::try_from(&saved[0].1).unwrap()
        );
        let bad = vec![(
            saved[0].0.clone(),
            Tensor::zeros([3], (Kind::Float, Device::Cpu)),
        )];
        assert!(
            other
                .load_state(&bad, None)
                .unwrap_err()
                .to_string()
                .contains("shape")
        );
    }
}
