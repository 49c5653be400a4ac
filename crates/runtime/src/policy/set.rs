//! The policies consulted at every step, in the order that makes their inputs well defined:
//! the batch-size policy first (it sees the configured batch), then the schedule and the
//! label-smoothing policy (they see the batch it returned). Every output is range-checked here,
//! so a bad value stops training with an error that names the plugin, the call and the step.
//! The layer-rate policy is asked later in the step, once the gradients are summed
//! ([`PolicySet::layer_rates`]), and the codec by the trainer's gradient exchange.

use lsgd_policy::{State, TensorNorms};

use super::clock::Clock;
use crate::plugin::{Fault, Output, Plugin, PluginError, PolicyKind};
use crate::{Error, Result};

/// What the policies decided for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// The state the schedule and smoothing policies saw.
    pub state: State,
    /// Learning rate.
    pub lr: f64,
    /// Global batch.
    pub global_batch: u32,
    /// Label-smoothing epsilon.
    pub label_smoothing: f32,
}

/// Output limits that are the host's to choose.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// Largest global batch a batch-size policy may ask for.
    pub max_batch: u32,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds { max_batch: 1 << 20 }
    }
}

/// A policy formula compiled into the host, its output widened to f64 like
/// [`Output::as_f64`]; `lsgd_policy::native` builds the reference policies' twins.
pub use lsgd_policy::NativeFn;

/// The loaded policies of a run; absent ones fall back to constant behaviour (the base LR
/// unscaled, the initial batch, no smoothing, uncompressed gradients, every tensor at the
/// step's LR).
pub struct PolicySet {
    /// The plugin of each kind, by [`PolicyKind::EVERY`] index.
    plugins: [Option<Plugin>; 5],
    /// Native twins answering instead of the plugins, by the same index; only `bench train`
    /// sets them, to price the sandbox inside a real training loop.
    native: [Option<NativeFn>; 5],
    bounds: Bounds,
}

/// The index of `kind` in [`PolicyKind::EVERY`].
fn index(kind: PolicyKind) -> usize {
    PolicyKind::EVERY
        .iter()
        .position(|k| *k == kind)
        .expect("every kind is listed")
}

impl PolicySet {
    /// Puts each plugin in its slot; two plugins of one kind are refused
    /// ([`Error::Duplicate`]).
    pub fn new(plugins: Vec<Plugin>, bounds: Bounds) -> Result<Self> {
        let mut set = PolicySet {
            plugins: Default::default(),
            native: Default::default(),
            bounds,
        };
        for p in plugins {
            let kind = p.kind();
            let slot = &mut set.plugins[index(kind)];
            if let Some(old) = slot {
                return Err(Error::Duplicate {
                    kind,
                    first: old.label().to_string(),
                    second: p.label().to_string(),
                });
            }
            *slot = Some(p);
        }
        Ok(set)
    }

    /// The plugin of `kind`, if loaded.
    pub fn get(&self, kind: PolicyKind) -> Option<&Plugin> {
        self.plugins[index(kind)].as_ref()
    }

    /// The plugin of `kind`, if loaded, to call.
    pub fn get_mut(&mut self, kind: PolicyKind) -> Option<&mut Plugin> {
        self.plugins[index(kind)].as_mut()
    }

    /// The gradient codec, if loaded.
    pub fn codec_mut(&mut self) -> Option<&mut Plugin> {
        self.get_mut(PolicyKind::Codec)
    }

    /// The state of every stateful plugin as of the start of `step`, in [`PolicyKind::EVERY`]
    /// order: what a checkpoint stores and the ranks compare.
    pub fn states_at(&mut self, step: u64) -> Result<Vec<(PolicyKind, Vec<u8>)>, PluginError> {
        let mut out = Vec::new();
        for p in self.plugins.iter_mut().flatten() {
            if let Some(bytes) = p.state_at(step)? {
                out.push((p.kind(), bytes));
            }
        }
        Ok(out)
    }

    /// Answers `kind` with `twin` instead of its plugin from now on (the plugin stays, for its
    /// identity). For benchmarks: the twin must compute the plugin's formula.
    pub fn use_native(&mut self, kind: PolicyKind, twin: NativeFn) {
        self.native[index(kind)] = Some(twin);
    }

    /// The output of `kind` for `state`, or `None` without a plugin of that kind.
    fn ask(&mut self, kind: PolicyKind, state: &State) -> Result<Option<f64>, PluginError> {
        let i = index(kind);
        if let Some(twin) = &mut self.native[i] {
            return Ok(Some(twin(state)));
        }
        match &mut self.plugins[i] {
            Some(p) => Ok(Some(check_output(p, state, self.bounds)?.as_f64())),
            None => Ok(None),
        }
    }

    /// The layer-rate policy's multiplier for each of `tensors` at `state`'s step, checked
    /// (one per tensor, finite, >= 0); `None` without a layer-rate plugin.
    pub fn layer_rates(
        &mut self,
        state: &State,
        tensors: &[TensorNorms],
    ) -> Result<Option<Vec<f64>>, PluginError> {
        let Some(plugin) = self.get_mut(PolicyKind::LayerRate) else {
            return Ok(None);
        };
        check_multipliers(plugin, state, tensors).map(Some)
    }

    /// Asks every policy for this step's values.
    pub fn decide(&mut self, clock: &Clock) -> Result<Decision, PluginError> {
        let configured = clock.state();
        let global_batch = match self.ask(PolicyKind::BatchSize, &configured)? {
            Some(b) => b as u32,
            None => configured.global_batch,
        };
        let state = clock.state_with_batch(global_batch);
        let lr = self
            .ask(PolicyKind::Schedule, &state)?
            .unwrap_or(state.base_lr);
        let label_smoothing = self
            .ask(PolicyKind::LabelSmoothing, &state)?
            .map_or(0.0, |e| e as f32);
        Ok(Decision {
            state,
            lr,
            global_batch,
            label_smoothing,
        })
    }
}

/// Calls `plugin` and applies the contract's range checks to what it returns.
pub fn check_output(
    plugin: &mut Plugin,
    state: &State,
    bounds: Bounds,
) -> Result<Output, PluginError> {
    let out = match plugin.call(state) {
        // A missed wall-clock deadline can be the machine's doing (a descheduled thread on a
        // loaded node) rather than the plugin's; policies are pure, so one retry on the fresh
        // instance is safe, and a plugin that really loops fails again.
        Err(e) if matches!(e.fault, Fault::Deadline { .. }) => plugin.call(state)?,
        r => r?,
    };
    let problem = match out {
        Output::LearningRate(lr) if !lr.is_finite() || lr < 0.0 => {
            Some(format!("learning rate {lr}: must be finite and >= 0"))
        }
        Output::GlobalBatch(b) if b == 0 || b > bounds.max_batch => Some(format!(
            "global batch {b}: must be between 1 and --max-batch {}",
            bounds.max_batch
        )),
        Output::GlobalBatch(b) if !b.is_multiple_of(state.world_size) => Some(format!(
            "global batch {b}: not divisible by the world size {}",
            state.world_size
        )),
        Output::Epsilon(e) if !(0.0..1.0).contains(&e) => {
            Some(format!("label-smoothing epsilon {e}: must be in [0, 1)"))
        }
        _ => None,
    };
    match problem {
        Some(m) => Err(
            PluginError::new(plugin.label(), plugin.call_name(), Fault::BadOutput(m))
                .at_step(state.step),
        ),
        None => Ok(out),
    }
}

/// Calls a layer-rate `plugin` for `tensors` and applies the contract's checks to what it
/// returns: one multiplier per tensor, each finite and >= 0.
pub fn check_multipliers(
    plugin: &mut Plugin,
    state: &State,
    tensors: &[TensorNorms],
) -> Result<Vec<f64>, PluginError> {
    let out = match plugin.multipliers(state, tensors) {
        // As in check_output: one retry on a fresh (restored) instance.
        Err(e) if matches!(e.fault, Fault::Deadline { .. }) => {
            plugin.multipliers(state, tensors)?
        }
        r => r?,
    };
    let problem = if out.len() != tensors.len() {
        Some(format!(
            "{} multipliers for {} parameter tensors",
            out.len(),
            tensors.len()
        ))
    } else {
        out.iter()
            .zip(tensors)
            .find(|(m, _)| !(m.is_finite() && **m >= 0.0))
            .map(|(m, t)| format!("multiplier {m} for {}: must be finite and >= 0", t.name))
    };
    match problem {
        Some(m) => Err(
            PluginError::new(plugin.label(), "multipliers", Fault::BadOutput(m))
                .at_step(state.step),
        ),
        None => Ok(out),
    }
}
