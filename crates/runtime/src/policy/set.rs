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

/// What a run does when a policy plugin faults (traps, runs out of budget, returns an invalid
/// value): `--on-plugin-fault`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFault {
    /// Stop the run (after a checkpoint): the default, because a fault usually means a bug.
    #[default]
    Abort,
    /// Keep the plugin's last good output for the step, recreate its instance and go on;
    /// stop after `max_in_a_row` consecutive faults of one plugin.
    HoldLast {
        /// Consecutive faulted calls of one plugin after which the run stops anyway.
        max_in_a_row: u32,
    },
}

/// A fault that [`OnFault::HoldLast`] absorbed: the step went on with the held output.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// The fault, naming plugin, call and step.
    pub fault: PluginError,
    /// Consecutive faults of this plugin so far, this one included.
    pub in_a_row: u32,
}

/// The last good output of each kind and the faults in a row since, for [`OnFault::HoldLast`].
#[derive(Default)]
struct Holding {
    last: Option<HeldOutput>,
    in_a_row: u32,
}

/// A held output: a policy's value or a layer-rate plugin's multipliers.
#[derive(Clone)]
enum HeldOutput {
    Value(f64),
    Multipliers(Vec<f64>),
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
    on_fault: OnFault,
    /// By the same index.
    holding: [Holding; 5],
    /// Faults absorbed since the last [`PolicySet::take_held`].
    held: Vec<Held>,
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
            on_fault: OnFault::Abort,
            holding: Default::default(),
            held: Vec::new(),
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

    /// Sets what a plugin fault does from now on.
    pub fn set_on_fault(&mut self, on_fault: OnFault) {
        self.on_fault = on_fault;
    }

    /// What a plugin fault does.
    pub fn on_fault(&self) -> OnFault {
        self.on_fault
    }

    /// The faults [`OnFault::HoldLast`] absorbed since the last call, oldest first: the
    /// caller reports them (they are warnings, and a run's record of what it did).
    pub fn take_held(&mut self) -> Vec<Held> {
        std::mem::take(&mut self.held)
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
        let Some(p) = &mut self.plugins[i] else {
            return Ok(None);
        };
        let result = check_output(p, state, self.bounds).map(|o| HeldOutput::Value(o.as_f64()));
        match self.hold(i, result)? {
            HeldOutput::Value(v) => Ok(Some(v)),
            HeldOutput::Multipliers(_) => unreachable!("a policy holds a value"),
        }
    }

    /// Applies [`OnFault`] to the outcome of the plugin in slot `i`: a good output becomes the
    /// one to hold; a fault is returned (abort, nothing held yet, or too many in a row) or
    /// answered with the held output after the instance is recreated.
    fn hold(
        &mut self,
        i: usize,
        result: Result<HeldOutput, PluginError>,
    ) -> Result<HeldOutput, PluginError> {
        let holding = &mut self.holding[i];
        let fault = match result {
            Ok(out) => {
                holding.last = Some(out.clone());
                holding.in_a_row = 0;
                return Ok(out);
            }
            Err(fault) => fault,
        };
        let OnFault::HoldLast { max_in_a_row } = self.on_fault else {
            return Err(fault);
        };
        let Some(last) = holding.last.clone() else {
            // Nothing good was ever returned: there is no value to hold.
            return Err(fault);
        };
        holding.in_a_row += 1;
        if holding.in_a_row >= max_in_a_row {
            let mut fault = fault;
            fault.fault = Fault::GaveUp {
                faults: holding.in_a_row,
                last: Box::new(fault.fault.clone()),
            };
            return Err(fault);
        }
        let in_a_row = holding.in_a_row;
        if let Some(p) = &mut self.plugins[i] {
            // The faulted instance is gone; a fresh one answers the next step. One that cannot
            // even be recreated stops the run.
            p.reset().map_err(|e| match fault.step {
                Some(s) => e.at_step(s),
                None => e,
            })?;
        }
        self.held.push(Held { fault, in_a_row });
        Ok(last)
    }

    /// The layer-rate policy's multiplier for each of `tensors` at `state`'s step, checked
    /// (one per tensor, finite, >= 0); `None` without a layer-rate plugin.
    pub fn layer_rates(
        &mut self,
        state: &State,
        tensors: &[TensorNorms],
    ) -> Result<Option<Vec<f64>>, PluginError> {
        let i = index(PolicyKind::LayerRate);
        let Some(plugin) = &mut self.plugins[i] else {
            return Ok(None);
        };
        let result = check_multipliers(plugin, state, tensors).map(HeldOutput::Multipliers);
        match self.hold(i, result)? {
            HeldOutput::Multipliers(m) => Ok(Some(m)),
            HeldOutput::Value(_) => unreachable!("a layer-rate plugin holds multipliers"),
        }
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
