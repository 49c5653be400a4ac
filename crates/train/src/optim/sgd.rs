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

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Kind, Tensor};

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
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(format!("--momentum {} must be in [0, 1)", self.momentum));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(format!(
                "--weight-decay {} must be finite and >= 0",
                self.weight_decay
            ));
        }
        if self.nesterov && self.momentum == 0.0 {
            return Err("--nesterov needs a --momentum above 0".into());
        }
        Ok(())
    }
}

struct Param {
    name: String,
    weight: Tensor,
    decay: f64,
    /// `v` (pytorch form) or `u` (goyal form).
    history: Tensor,
}

/// The optimiser over every trainable variable of a store, in name order so its state has
/// the same layout in every process and checkpoint.
pub struct Sgd {
    config: SgdConfig,
    params: Vec<Param>,
    last_lr: Option<f64>,
}

/// Prefix of the history tensors in [`Sgd::state`].
const HISTORY: &str = "optim.history.";

impl Sgd {
    /// An optimiser for the trainable variables of `vs`, with zero history.
    pub fn new(vs: &VarStore, config: SgdConfig) -> Self {
        let mut vars: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let params = vars
            .into_iter()
            .map(|(name, weight)| {
                let excluded = !config.decay_bn_and_bias && weight.dim() < 2;
                let history = weight.zeros_like().set_requires_grad(false);
                Param {
                    name,
                    decay: if excluded { 0.0 } else { config.weight_decay },
                    weight,
                    history,
                }
            })
            .collect();
        Sgd {
            config,
            params,
            last_lr: None,
        }
    }

    /// Names of the parameters weight decay applies to.
    pub fn decayed(&self) -> Vec<&str> {
        self.params
            .iter()
            .filter(|p| p.decay != 0.0)
            .map(|p| p.name.as_str())
            .collect()
    }

    /// The trainable tensors, in the optimiser's (name) order.
    pub fn weights(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.params.iter().map(|p| (p.name.as_str(), &p.weight))
    }

    /// Clears the accumulated gradients before a step's first micro-batch.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.weight.zero_grad();
        }
    }

    /// Applies one update at learning rate `lr` from the accumulated gradients.
    pub fn step(&mut self, lr: f64) {
        let _guard = tch::no_grad_guard();
        let SgdConfig {
            momentum: m,
            nesterov,
            form,
            ..
        } = self.config;
        let correction = match (form, self.config.momentum_correction, self.last_lr) {
            (SgdForm::Goyal, true, Some(prev)) if prev != 0.0 => lr / prev,
            _ => 1.0,
        };
        for p in &mut self.params {
            let mut d = p.weight.grad();
            if !d.defined() {
                continue;
            }
            if p.decay != 0.0 {
                d = &d + &p.weight * p.decay;
            }
            let step = match form {
                SgdForm::Pytorch => {
                    if m == 0.0 {
                        d * lr
                    } else {
                        let _ = p.history.g_mul_scalar_(m).g_add_(&d);
                        if nesterov {
                            (&d + &p.history * m) * lr
                        } else {
                            &p.history * lr
                        }
                    }
                }
                SgdForm::Goyal => {
                    let scaled = &d * lr;
                    if m == 0.0 {
                        scaled
                    } else {
                        let _ = p.history.g_mul_scalar_(m * correction).g_add_(&scaled);
                        if nesterov {
                            &p.history * m + scaled
                        } else {
                            p.history.shallow_clone()
                        }
                    }
                }
            };
            let _ = p.weight.g_sub_(&step);
        }
        self.last_lr = Some(lr);
    }

    /// The LR of the last step (the denominator of the next momentum correction).
    pub fn last_lr(&self) -> Option<f64> {
        self.last_lr
    }

    /// The history tensors under stable names, for a checkpoint.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        self.params
            .iter()
            .map(|p| (format!("{HISTORY}{}", p.name), p.history.shallow_clone()))
            .collect()
    }

    /// Restores the history and last LR saved by [`Sgd::state`] / [`Sgd::last_lr`].
    pub fn load_state(
        &mut self,
        tensors: &[(String, Tensor)],
        last_lr: Option<f64>,
    ) -> Result<(), String> {
        let _guard = tch::no_grad_guard();
        for p in &mut self.params {
            let key = format!("{HISTORY}{}", p.name);
            let t = tensors
                .iter()
                .find(|(n, _)| *n == key)
                .map(|(_, t)| t)
                .ok_or_else(|| format!("no optimiser state `{key}`"))?;
            if t.size() != p.history.size() {
                return Err(format!(
                    "optimiser state `{key}` has shape {:?}, the model needs {:?}",
                    t.size(),
                    p.history.size()
                ));
            }
            p.history
                .copy_(&t.to_kind(Kind::Float).to_device(p.history.device()));
        }
        self.last_lr = last_lr;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

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
        let vs = VarStore::new(Device::Cpu);
        let w = vs
            .root()
            .var_copy("w", &Tensor::from_slice(&[1.0f32, -2.0]));
        let c = Tensor::from_slice(&[0.5f32, 1.0]);
        let mut opt = Sgd::new(&vs, cfg);
        for &lr in lrs {
            opt.zero_grad();
            (&w * &c).sum(Kind::Float).backward();
            opt.step(lr);
        }
        Vec::try_from(&w).unwrap()
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
        opt.step(0.5);
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
        assert!(other.load_state(&bad, None).unwrap_err().contains("shape"));
    }
}
