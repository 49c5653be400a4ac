//! AdamW (Loshchilov & Hutter 2019) as `torch.optim.AdamW` computes it, step for step:
//!
//! ```text
//! w ← w·(1 − η·λ)                      decoupled weight decay (λ = 0 for excluded tensors)
//! m ← m + (1 − β1)·(g − m)             (lerp, as torch.optim)
//! v ← β2·v + (1 − β2)·g²
//! w ← w − (η / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + ε)
//! ```
//!
//! The decay is applied to the weights, not added to the gradient, so it is independent of the
//! adaptive scaling; with LAMB a layer-wise policy later multiplies η per tensor ([`LrScale`]).

use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Kind, Tensor};

use super::{LrScale, Norms, Optimizer, Param, named_state, restore_state, state_tensor};
use crate::Error;

/// Prefix of the first-moment tensors in [`AdamW`]'s state.
const EXP_AVG: &str = "optim.exp_avg.";
/// Prefix of the second-moment tensors in [`AdamW`]'s state.
const EXP_AVG_SQ: &str = "optim.exp_avg_sq.";
/// The step count (for the bias corrections), a one-element tensor in [`AdamW`]'s state.
const STEP: &str = "optim.step";

/// AdamW settings.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// β1, the first moment's decay.
    pub beta1: f64,
    /// β2, the second moment's decay.
    pub beta2: f64,
    /// ε, added to the second moment's root.
    pub eps: f64,
    /// Decoupled weight decay λ.
    pub weight_decay: f64,
    /// Also decay BatchNorm γ/β and biases (all parameters with fewer than two dimensions).
    pub decay_bn_and_bias: bool,
}

impl Default for AdamWConfig {
    /// `torch.optim.AdamW`'s defaults.
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decay_bn_and_bias: true,
        }
    }
}

impl AdamWConfig {
    /// Refuses settings that are not an optimiser.
    pub fn validate(&self) -> Result<(), Error> {
        for (flag, b) in [("--adam-beta1", self.beta1), ("--adam-beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(Error::Config(format!("{flag} {b} must be in [0, 1)")));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(Error::Config(format!(
                "--adam-eps {} must be finite and above 0",
                self.eps
            )));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(Error::Config(format!(
                "--weight-decay {} must be finite and >= 0",
                self.weight_decay
            )));
        }
        Ok(())
    }
}

/// AdamW over every trainable variable of a store.
pub struct AdamW {
    config: AdamWConfig,
    params: Vec<Param>,
    /// Weight decay of each parameter (0 for those excluded).
    decay: Vec<f64>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Updates taken (t of the bias corrections).
    steps: u64,
    last_lr: Option<f64>,
    /// `--adam-beta1`, which a schedule's momentum overrides step by step.
    configured_beta1: f64,
}

impl AdamW {
    /// An optimiser for the trainable variables of `vs`, with zero moments.
    pub fn new(vs: &VarStore, config: AdamWConfig) -> Self {
        let params = Param::trainable(vs);
        let decay = Param::decays(&params, config.weight_decay, config.decay_bn_and_bias);
        AdamW {
            config,
            exp_avg: Param::zeros(&params),
            exp_avg_sq: Param::zeros(&params),
            params,
            decay,
            steps: 0,
            last_lr: None,
            configured_beta1: config.beta1,
        }
    }
}

impl AdamW {
    /// The bias corrections 1 − β1ᵗ and √(1 − β2ᵗ) of update number `t`.
    fn corrections(&self, t: u64) -> (f64, f64) {
        // powf, as Python's `beta ** step` in torch.optim (powi rounds differently).
        let t = t as f64;
        (
            1.0 - self.config.beta1.powf(t),
            (1.0 - self.config.beta2.powf(t)).sqrt(),
        )
    }
}

impl Optimizer for AdamW {
    fn params(&self) -> &[Param] {
        &self.params
    }

    fn weight_decays(&self) -> &[f64] {
        &self.decay
    }

    /// ‖u‖ is LAMB's ‖r + λw‖, r = m̂ / (√v̂ + ε) with the moments the next step would have.
    fn norms(&self) -> Vec<Norms> {
        let AdamWConfig {
            beta1, beta2, eps, ..
        } = self.config;
        let (correction1, correction2_sqrt) = self.corrections(self.steps + 1);
        Norms::of(&self.params, |i, w, g| {
            let m = self.exp_avg[i].lerp(g, 1.0 - beta1);
            let v = &self.exp_avg_sq[i] * beta2 + g * g * (1.0 - beta2);
            m / correction1 / (v.sqrt() / correction2_sqrt + eps) + w * self.decay[i]
        })
    }

    fn set_momentum(&mut self, momentum: Option<f64>) {
        self.config.beta1 = momentum.unwrap_or(self.configured_beta1);
    }

    fn step(&mut self, lr: f64, scale: &LrScale) {
        let _guard = tch::no_grad_guard();
        let AdamWConfig {
            beta1, beta2, eps, ..
        } = self.config;
        self.steps += 1;
        let (correction1, correction2_sqrt) = self.corrections(self.steps);
        for i in 0..self.params.len() {
            let s = scale.of(i);
            let rate = if s == 1.0 { lr } else { lr * s };
            let weight = &self.params[i].tensor;
            let g = weight.grad();
            if !g.defined() {
                continue;
            }
            let mut w = weight.shallow_clone();
            if self.decay[i] != 0.0 {
                let _ = w.g_mul_scalar_(1.0 - rate * self.decay[i]);
            }
            let _ = self.exp_avg[i].lerp_(&g, 1.0 - beta1);
            let _ = self.exp_avg_sq[i]
                .g_mul_scalar_(beta2)
                .g_add_(&(&g * &g * (1.0 - beta2)));
            let denom = self.exp_avg_sq[i].sqrt() / correction2_sqrt + eps;
            let _ = w.g_sub_(&(&self.exp_avg[i] / denom * (rate / correction1)));
        }
        self.last_lr = Some(lr);
    }

    fn last_lr(&self) -> Option<f64> {
        self.last_lr
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![(STEP.to_string(), Tensor::from_slice(&[self.steps as i64]))];
        out.extend(named_state(EXP_AVG, &self.params, &self.exp_avg));
        out.extend(named_state(EXP_AVG_SQ, &self.params, &self.exp_avg_sq));
        out
    }

    fn load_state(
        &mut self,
        tensors: &[(String, Tensor)],
        last_lr: Option<f64>,
    ) -> Result<(), Error> {
        let steps = state_tensor(tensors, STEP, &[1])?.to_kind(Kind::Int64);
        self.steps = u64::try_from(steps.int64_value(&[0]))
            .map_err(|_| Error::Checkpoint(format!("optimiser state `{STEP}` is negative")))?;
        restore_state(tensors, EXP_AVG, &self.params, &mut self.exp_avg)?;
        restore_state(tensors, EXP_AVG_SQ, &self.params, &mut self.exp_avg_sq)?;
        self.last_lr = last_lr;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::{Module, OptimizerConfig};
    use tch::{Device, nn};

    /// A small two-layer network and a fixed regression batch.
    fn setup(seed: i64) -> (VarStore, nn::Sequential, Tensor, Tensor) {
        tch::manual_seed(seed);
        let vs = VarStore::new(Device::Cpu);
        let root = vs.root();
        let net = nn::seq()
            .add(nn::linear(&root / "l1", 6, 8, Default::default()))
            .add_fn(|x| x.tanh())
            .add(nn::linear(&root / "l2", 8, 3, Default::default()));
        let x = Tensor::randn([16, 6], (Kind::Float, Device::Cpu));
        let y = Tensor::randn([16, 3], (Kind::Float, Device::Cpu));
        (vs, net, x, y)
    }

    fn loss(net: &nn::Sequential, x: &Tensor, y: &Tensor) -> Tensor {
        (net.forward(x) - y).square().mean(Kind::Float)
    }

    /// The learning rate at step `i`: a changing schedule, so that the bias corrections and
    /// the decay see different rates.
    fn lr(i: usize) -> f64 {
        0.01 * (1.0 + (i % 7) as f64) / 4.0
    }

    #[test]
    fn a_hundred_steps_match_libtorchs_adamw() {
        let config = AdamWConfig {
            weight_decay: 0.05,
            ..AdamWConfig::default()
        };
        let (vs, net, x, y) = setup(3);
        let mut ours = AdamW::new(&vs, config);
        let (vs_ref, net_ref, _, _) = setup(3);
        let mut reference = nn::AdamW {
            beta1: config.beta1,
            beta2: config.beta2,
            wd: config.weight_decay,
            eps: config.eps,
            amsgrad: false,
        }
        .build(&vs_ref, lr(0))
        .unwrap();
        for i in 0..100 {
            ours.zero_grad();
            let a = loss(&net, &x, &y);
            a.backward();
            ours.step(lr(i), &LrScale::Uniform);
            reference.set_lr(lr(i));
            let b = loss(&net_ref, &x, &y);
            reference.backward_step(&b);
            let (a, b) = (a.double_value(&[]), b.double_value(&[]));
            assert!((a - b).abs() <= 1e-5 * b.abs(), "step {i}: loss {a} vs {b}");
        }
        let reference = vs_ref.variables();
        for (name, w) in vs.variables() {
            let diff = (&w - &reference[&name]).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "{name}: weights differ by {diff}");
        }
    }

    /// `scripts/torch-adamw-reference.py`'s problem: the gradient of Σ c·w is c, with c and w
    /// exact binary fractions, so both sides start every step from the same numbers.
    fn torch_problem(name: &str, n: usize, t: usize) -> (Vec<f32>, Vec<f32>) {
        let (w_off, g_off) = if name == "a" { (3, 1) } else { (11, 4) };
        let w = (0..n)
            .map(|j| ((j * 5 + w_off) % 32) as f32 / 16.0 - 1.0)
            .collect();
        let g = (0..n)
            .map(|j| ((j * 7 + t * 13 + g_off) % 17) as f32 / 8.0 - 1.0)
            .collect();
        (w, g)
    }

    #[test]
    fn a_hundred_steps_match_torch_optim() {
        let reference: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/data/adamw-torch.json")).unwrap();
        let c = &reference["config"];
        let config = AdamWConfig {
            beta1: c["beta1"].as_f64().unwrap(),
            beta2: c["beta2"].as_f64().unwrap(),
            eps: c["eps"].as_f64().unwrap(),
            weight_decay: c["weight_decay"].as_f64().unwrap(),
            decay_bn_and_bias: true,
        };
        let vs = VarStore::new(Device::Cpu);
        let shapes = [("a", vec![3i64, 4]), ("b", vec![4])];
        let vars: Vec<Tensor> = shapes
            .iter()
            .map(|(name, shape)| {
                let n = shape.iter().product::<i64>() as usize;
                let w = Tensor::from_slice(&torch_problem(name, n, 0).0).view(shape.as_slice());
                vs.root().var_copy(name, &w)
            })
            .collect();
        let mut opt = AdamW::new(&vs, config);
        let mut worst = 0.0f64;
        for (t, want) in reference["weights"].as_array().unwrap().iter().enumerate() {
            opt.zero_grad();
            let mut loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
            for ((name, _), w) in shapes.iter().zip(&vars) {
                let g = Tensor::from_slice(&torch_problem(name, w.numel(), t).1)
                    .view(w.size().as_slice());
                loss += (&g * w).sum(Kind::Float);
            }
            loss.backward();
            opt.step(lr(t), &LrScale::Uniform);
            for ((name, _), w) in shapes.iter().zip(&vars) {
                let ours = Vec::<f32>::try_from(w.reshape([-1])).unwrap();
                for (x, y) in ours.iter().zip(want[name].as_array().unwrap()) {
                    let y = y.as_f64().unwrap();
                    worst = worst.max((f64::from(*x) - y).abs() / y.abs().max(1e-3));
                }
            }
        }
        assert_eq!(reference["weights"].as_array().unwrap().len(), 100);
        assert!(
            worst <= 1e-6,
            "relative difference to torch.optim.AdamW up to {worst:e}"
        );
    }

    #[test]
    fn state_round_trips_bit_for_bit_and_refuses_a_wrong_shape() {
        let (vs, net, x, y) = setup(5);
        let mut a = AdamW::new(&vs, AdamWConfig::default());
        for i in 0..3 {
            a.zero_grad();
            loss(&net, &x, &y).backward();
            a.step(lr(i), &LrScale::Uniform);
        }
        let mut b = AdamW::new(&vs, AdamWConfig::default());
        b.load_state(&a.state(), a.last_lr()).unwrap();
        assert_eq!(b.steps, 3);
        for ((n, s), (_, t)) in a.state().iter().zip(b.state().iter()) {
            assert!(s.equal(t), "{n} differs after a round trip");
        }
        let mut bad = a.state();
        bad[1].1 = Tensor::zeros([2], (Kind::Float, Device::Cpu));
        let e = b.load_state(&bad, None).unwrap_err().to_string();
        assert!(e.contains("shape"), "{e}");
    }

    #[test]
    fn excluded_tensors_are_not_decayed_and_settings_are_checked() {
        let (vs, _, _, _) = setup(1);
        let mut c = AdamWConfig {
            decay_bn_and_bias: false,
            ..AdamWConfig::default()
        };
        let opt = AdamW::new(&vs, c);
        let decayed: Vec<&str> = opt
            .params
            .iter()
            .zip(&opt.decay)
            .filter(|(_, d)| **d != 0.0)
            .map(|(p, _)| p.name.as_str())
            .collect();
        assert_eq!(decayed, ["l1.weight", "l2.weight"]);
        c.beta2 = 1.0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("--adam-beta2")
        );
        c.beta2 = 0.999;
        c.eps = 0.0;
        assert!(c.validate().unwrap_err().to_string().contains("--adam-eps"));
    }
}
