//! The policies consulted at every step, in the order that makes their inputs well defined:
//! the batch-size policy first (it sees the configured batch), then the schedule and the
//! label-smoothing policy (they see the batch it returned). Every output is range-checked here,
//! so a bad value stops training with an error that names the plugin, the call and the step.
//! The layer-rate policy is asked later in the step, once the gradients are summed
//! ([`PolicySet::layer_rates`]), and the codec by the trainer's gradient exchange. The schedule
//! may be several plugins composed ([`Composition`]); each part is a plugin of its own.

use lsgd_policy::{State, TensorNorms};

use super::clock::Clock;
use super::compose::Composition;
use crate::plugin::{Fault, Knob, Output, Plugin, PluginError, PolicyKind};
use crate::{Error, Result};

/// What the policies decided for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// The state the schedule and smoothing policies saw.
    pub state: State,
    /// Learning rate.
    pub lr: f64,
    /// Momentum (SGD) or beta1 (AdamW) from the schedule (contract 0.4); `None` keeps the
    /// configured value.
    pub momentum: Option<f64>,
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

/// A held output: a policy's value, a schedule's rates or a layer-rate plugin's multipliers.
#[derive(Clone)]
enum HeldOutput {
    Value(f64),
    Rates(f64, Option<f64>),
    Multipliers(Vec<f64>),
}

/// A plugin's place in a [`PolicySet`]: its kind and, for a composed schedule, its part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The kind.
    pub kind: PolicyKind,
    /// Its index among the parts of a composed schedule; 0 for every other plugin.
    pub part: usize,
}

impl Slot {
    /// The slot's name in checkpoints and messages: the kind, then `.N` for a schedule's
    /// later parts (`schedule`, `schedule.1`), so checkpoints of single plugins read as before.
    pub fn key(&self) -> String {
        match self.part {
            0 => self.kind.to_string(),
            n => format!("{}.{n}", self.kind),
        }
    }
}

/// A policy formula compiled into the host, its output widened to f64 like
/// [`Output::as_f64`]; `lsgd_policy::native` builds the reference policies' twins.
pub use lsgd_policy::NativeFn;

/// The loaded policies of a run; absent ones fall back to constant behaviour (the base LR
/// unscaled, the initial batch, no smoothing, uncompressed gradients, every tensor at the
/// step's LR).
pub struct PolicySet {
    /// The plugin of each kind, by [`PolicyKind::EVERY`] index (a composed schedule's part 0).
    plugins: [Option<Plugin>; 5],
    /// A composed schedule's parts after the first.
    later: Vec<Plugin>,
    /// How the schedule's parts make one.
    composition: Composition,
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
            later: Vec::new(),
            composition: Composition::Single,
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

    /// Makes the schedule a composition of the loaded schedule (part 0) and `later`, checked:
    /// every part a schedule, milestones that fit the parts, and no sequential schedule beside
    /// a batch-size policy (a later part's clock starts at its milestone's samples, which a
    /// changing batch would leave unknown).
    pub fn compose(&mut self, later: Vec<Plugin>, composition: Composition) -> Result<()> {
        let first = self.get(PolicyKind::Schedule).ok_or_else(|| {
            Error::Composition("a composed schedule needs --schedule for its first part".into())
        })?;
        let first = first.label().to_string();
        if let Some(p) = later.iter().find(|p| p.kind() != PolicyKind::Schedule) {
            return Err(Error::Composition(format!(
                "{} is a {} plugin; every part of a composed schedule is a schedule",
                p.label(),
                p.kind()
            )));
        }
        composition
            .check(later.len() + 1)
            .map_err(|m| Error::Composition(format!("schedule {first}: {m}")))?;
        if matches!(composition, Composition::Sequential(_))
            && let Some(b) = self.get(PolicyKind::BatchSize)
        {
            return Err(Error::Composition(format!(
                "a sequential schedule cannot run beside the batch-size policy {}: a later \
                 part's clock starts at its milestone, whose samples a changing batch leaves \
                 unknown (compose with --chain instead, or drop the batch-size policy)",
                b.label()
            )));
        }
        self.later = later;
        self.composition = composition;
        Ok(())
    }

    /// How the schedule's parts make one ([`Composition::Single`] unless composed).
    pub fn composition(&self) -> &Composition {
        &self.composition
    }

    /// Every loaded plugin with its slot, in [`PolicyKind::EVERY`] order, a composed
    /// schedule's parts in order: what identity checks, checkpoints and `inspect` list.
    pub fn plugins(&self) -> Vec<(Slot, &Plugin)> {
        let mut out = Vec::new();
        for (kind, p) in PolicyKind::EVERY.iter().zip(&self.plugins) {
            if let Some(p) = p {
                out.push((
                    Slot {
                        kind: *kind,
                        part: 0,
                    },
                    p,
                ));
            }
            if *kind == PolicyKind::Schedule {
                out.extend(self.later.iter().enumerate().map(|(i, p)| {
                    let slot = Slot {
                        kind: *kind,
                        part: i + 1,
                    };
                    (slot, p)
                }));
            }
        }
        out
    }

    /// How checkpoints and the ranks' comparison name the plugin in `slot`: its key, and for a
    /// composed schedule's later part its place in the composition (`schedule.1 (from step
    /// 30)`, `schedule.1 (chained)`), so a different composition is a different run.
    pub fn slot_label(&self, slot: Slot) -> String {
        self.composition.part_label(slot.key(), slot.part)
    }

    /// [`PolicySet::plugins`], to call.
    pub fn plugins_mut(&mut self) -> Vec<(Slot, &mut Plugin)> {
        let mut later = Some(self.later.iter_mut());
        let mut out = Vec::new();
        for (kind, p) in PolicyKind::EVERY.iter().zip(self.plugins.iter_mut()) {
            if let Some(p) = p {
                out.push((
                    Slot {
                        kind: *kind,
                        part: 0,
                    },
                    p,
                ));
            }
            if *kind == PolicyKind::Schedule {
                let parts = later.take().into_iter().flatten().enumerate();
                out.extend(parts.map(|(i, p)| {
                    let slot = Slot {
                        kind: *kind,
                        part: i + 1,
                    };
                    (slot, p)
                }));
            }
        }
        out
    }

    /// The schedule's part `part` (0: the `--schedule` plugin).
    fn schedule_part(&mut self, part: usize) -> Option<&mut Plugin> {
        match part {
            0 => self.plugins[index(PolicyKind::Schedule)].as_mut(),
            n => self.later.get_mut(n - 1),
        }
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

    /// The state of every stateful plugin as of the start of `step`, in the order of
    /// [`PolicySet::plugins`]: what a checkpoint stores and the ranks compare.
    pub fn states_at(&mut self, step: u64) -> Result<Vec<(Slot, Vec<u8>)>, PluginError> {
        let mut out = Vec::new();
        for (slot, p) in self.plugins_mut() {
            if let Some(bytes) = p.state_at(step)? {
                out.push((slot, bytes));
            }
        }
        Ok(out)
    }

    /// Puts every stateful plugin back into its state at the start of `step`, which it was
    /// called in: a step redone after a lost rank (`--fault-tolerance`) decides again from there.
    pub fn rewind(&mut self, step: u64) -> Result<(), PluginError> {
        for (_, p) in self.plugins_mut() {
            if let Some(bytes) = p.state_at(step)? {
                p.restore(step, bytes)?;
            }
        }
        Ok(())
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
        let result = check_output(p, state, self.bounds)
            .map(|o| HeldOutput::Value(o.as_f64()))
            .map_err(|e| (0, e));
        match self.hold(i, result)? {
            HeldOutput::Value(v) => Ok(Some(v)),
            _ => unreachable!("a policy holds a value"),
        }
    }

    /// The schedule's learning rate and momentum for `state`, its parts composed; `None`
    /// without a schedule. `samples_per_epoch` is the run's (a sequential part's clock).
    fn schedule(
        &mut self,
        state: &State,
        samples_per_epoch: u64,
    ) -> Result<Option<(f64, Option<f64>)>, PluginError> {
        let i = index(PolicyKind::Schedule);
        if let Some(twin) = &mut self.native[i] {
            return Ok(Some((twin(state), None)));
        }
        if self.plugins[i].is_none() {
            return Ok(None);
        }
        let result = self
            .composed_rates(state, samples_per_epoch)
            .map(|(lr, m)| HeldOutput::Rates(lr, m));
        match self.hold(i, result)? {
            HeldOutput::Rates(lr, m) => Ok(Some((lr, m))),
            _ => unreachable!("a schedule holds rates"),
        }
    }

    /// Asks the part(s) the composition names; a fault comes with the index of its part.
    fn composed_rates(
        &mut self,
        state: &State,
        samples_per_epoch: u64,
    ) -> Result<(f64, Option<f64>), (usize, PluginError)> {
        let bounds = self.bounds;
        let composition = self.composition.clone();
        let later = self.later.len();
        let mut rates = |part: usize, state: &State| {
            let p = self
                .schedule_part(part)
                .expect("the composition fits its parts");
            let lr = check_output(p, state, bounds).map_err(|e| (part, e))?;
            let momentum = check_momentum(p, state).map_err(|e| (part, e))?;
            Ok((lr.as_f64(), momentum))
        };
        match composition.active(state.step) {
            Some(part) => rates(part, &composition.view(part, state, samples_per_epoch)),
            None => {
                let (mut lr, mut momentum) = rates(0, state)?;
                let factor_state = Composition::factor_view(state);
                for part in 1..=later {
                    let (factor, m) = rates(part, &factor_state)?;
                    lr *= factor;
                    // As in ChainedScheduler, where each scheduler sets the momentum in turn.
                    momentum = m.or(momentum);
                }
                Ok((lr, momentum))
            }
        }
    }

    /// Applies [`OnFault`] to the outcome of the plugin in slot `i`: a good output becomes the
    /// one to hold; a fault is returned (abort, nothing held yet, or too many in a row) or
    /// answered with the held output after the instance is recreated.
    fn hold(
        &mut self,
        i: usize,
        result: Result<HeldOutput, (usize, PluginError)>,
    ) -> Result<HeldOutput, PluginError> {
        let holding = &mut self.holding[i];
        let (part, fault) = match result {
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
        let faulted = match part {
            0 => self.plugins[i].as_mut(),
            n => self.later.get_mut(n - 1),
        };
        if let Some(p) = faulted {
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
        let result = check_multipliers(plugin, state, tensors)
            .map(HeldOutput::Multipliers)
            .map_err(|e| (0, e));
        match self.hold(i, result)? {
            HeldOutput::Multipliers(m) => Ok(Some(m)),
            _ => unreachable!("a layer-rate plugin holds multipliers"),
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
        let (lr, momentum) = self
            .schedule(&state, clock.shape().samples_per_epoch)?
            .unwrap_or((state.base_lr, None));
        let label_smoothing = self
            .ask(PolicyKind::LabelSmoothing, &state)?
            .map_or(0.0, |e| e as f32);
        Ok(Decision {
            state,
            lr,
            momentum,
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
            "global batch {b}: must be between 1 and {}",
            plugin.words().with_value(Knob::MaxBatch, bounds.max_batch)
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

/// Calls a schedule `plugin`'s `momentum` (contract 0.4) and applies the contract's range
/// check: `None`, or finite and in [0, 1).
pub fn check_momentum(plugin: &mut Plugin, state: &State) -> Result<Option<f64>, PluginError> {
    let out = match plugin.momentum(state) {
        // As in check_output: one retry on a fresh (restored) instance.
        Err(e) if matches!(e.fault, Fault::Deadline { .. }) => plugin.momentum(state)?,
        r => r?,
    };
    match out {
        Some(m) if !(m.is_finite() && (0.0..1.0).contains(&m)) => Err(PluginError::new(
            plugin.label(),
            "momentum",
            Fault::BadOutput(format!("momentum {m}: must be finite and in [0, 1)")),
        )
        .at_step(state.step)),
        m => Ok(m),
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
