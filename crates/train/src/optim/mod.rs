//! Optimizers: the update a step ends with, behind one trait so that the trainer never names a
//! particular rule. An [`Optimizer`] owns the list of trainable tensors (in name order, so every
//! rank and every checkpoint sees the same layout), applies an update from the accumulated
//! gradients at a learning rate the policies chose, optionally scaled per tensor ([`LrScale`]:
//! what a layer-wise rate policy such as LARS produces), and exposes its state as named
//! tensors for checkpoints. A new rule (AdamW, LAMB, …) is a new file here implementing the
//! trait; the training loop does not change.
//!
//! - [`sgd`]: SGD with momentum in PyTorch's and Goyal's forms, or without momentum of its own
//!   when the exchange keeps it (`--error-feedback momentum`, DGC's momentum correction);
//! - [`adamw`]: AdamW as `torch.optim.AdamW` computes it.

pub mod adamw;
pub mod sgd;

use lsgd_policy::Role;
use tch::Tensor;
use tch::nn::VarStore;

pub use adamw::{AdamW, AdamWConfig};
pub use sgd::{Sgd, SgdConfig, SgdForm};

use crate::Error;

/// The update rule (`--optimizer`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OptimizerKind {
    /// SGD with momentum ([`Sgd`]).
    #[default]
    Sgd,
    /// AdamW ([`AdamW`]).
    Adamw,
}

/// The optimizer of a run over the trainable variables of `vs`: AdamW when its settings are
/// given, else SGD, which with `momentum_in_exchange` (`--error-feedback momentum`) leaves
/// momentum and weight decay to the exchange.
pub fn build(
    vs: &VarStore,
    sgd: SgdConfig,
    adamw: Option<AdamWConfig>,
    momentum_in_exchange: bool,
) -> Box<dyn Optimizer> {
    match adamw {
        Some(c) => Box::new(AdamW::new(vs, c)),
        None if momentum_in_exchange => Box::new(Sgd::new(vs, sgd).with_momentum_in_exchange()),
        None => Box::new(Sgd::new(vs, sgd)),
    }
}

/// A trainable tensor and its name in the variable store.
pub struct Param {
    /// The variable's path (`conv1.weight`).
    pub name: String,
    /// The variable; its `grad()` holds the accumulated gradient before an update.
    pub tensor: Tensor,
}

impl Param {
    /// The trainable variables of `vs`, sorted by name.
    pub fn trainable(vs: &VarStore) -> Vec<Param> {
        let mut vars: Vec<Param> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(name, tensor)| Param { name, tensor })
            .collect();
        vars.sort_by(|a, b| a.name.cmp(&b.name));
        vars
    }

    /// The weight decay of each of `params`: `weight_decay`, or 0 for BatchNorm parameters
    /// and biases (fewer than two dimensions) unless `decay_bn_and_bias`.
    pub fn decays(params: &[Param], weight_decay: f64, decay_bn_and_bias: bool) -> Vec<f64> {
        params
            .iter()
            .map(|p| {
                let excluded = !decay_bn_and_bias && p.tensor.dim() < 2;
                if excluded { 0.0 } else { weight_decay }
            })
            .collect()
    }

    /// What each of `params` is, for a layer-wise rate policy: a tensor of a BatchNorm layer
    /// (whose module has a `running_mean` buffer in `vs`) is `BatchNorm`, another tensor of
    /// fewer than two dimensions a `Bias`, the rest `Weight`s.
    pub fn roles(vs: &VarStore, params: &[Param]) -> Vec<Role> {
        let names: std::collections::HashSet<String> = vs.variables().into_keys().collect();
        params
            .iter()
            .map(|p| {
                let module = p.name.rsplit_once('.').map_or("", |(m, _)| m);
                if names.contains(&format!("{module}.running_mean")) {
                    Role::BatchNorm
                } else if p.tensor.dim() < 2 {
                    Role::Bias
                } else {
                    Role::Weight
                }
            })
            .collect()
    }

    /// One zero tensor shaped like each of `params`, outside autograd (optimizer state).
    pub fn zeros(params: &[Param]) -> Vec<Tensor> {
        params
            .iter()
            .map(|p| p.tensor.zeros_like().set_requires_grad(false))
            .collect()
    }
}

/// Per-tensor multipliers of the learning rate, by index in [`Optimizer::params`].
#[derive(Debug, Clone, PartialEq, Default)]
pub enum LrScale {
    /// Every tensor at the step's learning rate.
    #[default]
    Uniform,
    /// Tensor `i` at `lr · scale[i]`.
    PerTensor(Vec<f64>),
}

impl LrScale {
    /// The multiplier of tensor `i`.
    pub fn of(&self, i: usize) -> f64 {
        match self {
            LrScale::Uniform => 1.0,
            LrScale::PerTensor(s) => s[i],
        }
    }
}

/// One tensor's norms before an update: what a layer-wise rate policy sees of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Norms {
    /// ‖w‖.
    pub weight: f64,
    /// ‖g‖ of the accumulated (summed) gradient, without weight decay.
    pub grad: f64,
    /// ‖u‖ of the update the step would apply at a learning rate of 1, decay included.
    pub update: f64,
}

impl Norms {
    /// The norms of each of `params` with its update at LR 1 computed by `update(i, w, g)`
    /// (a tensor without a gradient has none), outside autograd.
    pub(crate) fn of(
        params: &[Param],
        update: impl Fn(usize, &Tensor, &Tensor) -> Tensor,
    ) -> Vec<Norms> {
        let _guard = tch::no_grad_guard();
        params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (w, g) = (&p.tensor, p.tensor.grad());
                let (grad, update) = if g.defined() {
                    (l2(&g), l2(&update(i, w, &g)))
                } else {
                    (0.0, 0.0)
                };
                Norms {
                    weight: l2(w),
                    grad,
                    update,
                }
            })
            .collect()
    }
}

/// The Euclidean norm of a tensor, reduced in binary64.
pub(crate) fn l2(t: &Tensor) -> f64 {
    t.to_kind(tch::Kind::Double).norm().double_value(&[])
}

/// An update rule over a fixed list of named parameters.
pub trait Optimizer {
    /// The trainable tensors, in the optimizer's (name) order.
    fn params(&self) -> &[Param];

    /// The weight decay of each tensor (0 where it is excluded), in [`Optimizer::params`] order.
    fn weight_decays(&self) -> &[f64];

    /// Each tensor's [`Norms`] for the update [`Optimizer::step`] would apply now, computed
    /// without changing any state.
    fn norms(&self) -> Vec<Norms>;

    /// Sets the momentum of the coming steps (SGD's momentum, AdamW's β1), from a schedule that
    /// drives it (contract 0.4); `None` restores the configured value. It takes effect for
    /// [`Optimizer::norms`] and [`Optimizer::step`] alike, with torch's semantics: SGD's buffer
    /// decays by the step's momentum, AdamW's bias correction is 1 − β1ᵗ with the step's β1.
    fn set_momentum(&mut self, momentum: Option<f64>);

    /// Applies one update at learning rate `lr` (each tensor's scaled by `scale`) from the
    /// accumulated gradients; tensors without a gradient are left alone.
    fn step(&mut self, lr: f64, scale: &LrScale);

    /// The learning rate of the last update, recorded in checkpoints.
    fn last_lr(&self) -> Option<f64>;

    /// The optimizer's state under stable names, for a checkpoint.
    fn state(&self) -> Vec<(String, Tensor)>;

    /// Restores what [`Optimizer::state`] and [`Optimizer::last_lr`] returned.
    fn load_state(
        &mut self,
        tensors: &[(String, Tensor)],
        last_lr: Option<f64>,
    ) -> Result<(), Error>;

    /// Clears the accumulated gradients before a step's first micro-batch.
    fn zero_grad(&mut self) {
        for p in self.params() {
            p.tensor.shallow_clone().zero_grad();
        }
    }

    /// The trainable tensors with their names, in order.
    fn weights(&self) -> Box<dyn Iterator<Item = (&str, &Tensor)> + '_> {
        Box::new(self.params().iter().map(|p| (p.name.as_str(), &p.tensor)))
    }
}

/// Per-parameter state tensors under `prefix` + the parameter's name, for a checkpoint.
pub(crate) fn named_state(
    prefix: &str,
    params: &[Param],
    state: &[Tensor],
) -> Vec<(String, Tensor)> {
    params
        .iter()
        .zip(state)
        .map(|(p, t)| (format!("{prefix}{}", p.name), t.shallow_clone()))
        .collect()
}

/// Copies what [`named_state`] saved under `prefix` back into `state`, in binary32.
pub(crate) fn restore_state(
    tensors: &[(String, Tensor)],
    prefix: &str,
    params: &[Param],
    state: &mut [Tensor],
) -> Result<(), Error> {
    let _guard = tch::no_grad_guard();
    for (p, t) in params.iter().zip(state) {
        let saved = state_tensor(tensors, &format!("{prefix}{}", p.name), &t.size())?;
        t.copy_(&saved.to_kind(tch::Kind::Float).to_device(t.device()));
    }
    Ok(())
}

/// The state tensor `key` of `tensors`, checked to have shape `shape`.
pub(crate) fn state_tensor(
    tensors: &[(String, Tensor)],
    key: &str,
    shape: &[i64],
) -> Result<Tensor, Error> {
    let t = tensors
        .iter()
        .find(|(n, _)| n == key)
        .map(|(_, t)| t)
        .ok_or_else(|| Error::Checkpoint(format!("no optimiser state `{key}`")))?;
    if t.size() != shape {
        return Err(Error::Checkpoint(format!(
            "optimiser state `{key}` has shape {:?}, the model needs {shape:?}",
            t.size()
        )));
    }
    Ok(t.shallow_clone())
}
