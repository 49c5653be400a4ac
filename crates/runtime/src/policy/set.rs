//! The policies consulted at every step, in the order that makes their inputs well defined:
//! the batch-size policy first (it sees the configured batch), then the schedule and the
//! label-smoothing policy (they see the batch it returned). Every output is range-checked here,
//! so a bad value stops training with an error that names the plugin, the call and the step.
//! The sync policy's `plan` comes last in [`PolicySet::decide`] (it sees the same state and the
//! clock's window); its `outer-step` at a window's end ([`PolicySet::outer_step`]).
//! The layer-rate policy is asked later in the step, once the gradients are summed
//! ([`PolicySet::layer_rates`]), and the codec by the trainer's gradient exchange. The schedule
//! may be several plugins composed ([`Composition`]); each part is a plugin of its own.
//!
//! The rules a plan obeys are the runtime's, so that training, `trace`, `compare` and
//! lsgd-torch apply them alike ([`check_plan`]): `synchronous` only at a window's start, and a
//! `local` answer at the run's last step becomes `average`, so a run ends with one model.

use lsgd_policy::{OuterStep, State, StepKind, TensorDrift, TensorNorms, Window};

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
    /// How the step moves, from the sync policy (contract 0.5) with the final-step rule
    /// applied; `None` without a sync plugin (every step synchronous).
    pub plan: Option<StepKind>,
    /// The synchronisation window the plan saw: the clock's before this step.
    pub window: Window,
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

/// A held output: a policy's value, a schedule's rates, a layer-rate plugin's multipliers, a
/// sync plugin's plan or outer step.
#[derive(Clone)]
enum HeldOutput {
    Value(f64),
    Rates(f64, Option<f64>),
    Multipliers(Vec<f64>),
    Plan(StepKind),
    Outer(OuterStep),
}

/// The number of policy kinds: the size of every array indexed by kind.
const KINDS: usize = PolicyKind::EVERY.len();

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
    plugins: [Option<Plugin>; KINDS],
    /// A composed schedule's parts after the first.
    later: Vec<Plugin>,
    /// How the schedule's parts make one.
    composition: Composition,
    /// Native twins answering instead of the plugins, by the same index; only `bench train`
    /// sets them, to price the sandbox inside a real training loop.
    native: [Option<NativeFn>; KINDS],
    bounds: Bounds,
    on_fault: OnFault,
    /// By the same index (a sync plugin's plan in its kind's entry).
    holding: [Holding; KINDS],
    /// A sync plugin's outer step: a second output of one plugin, held apart from its plan
    /// because the two are asked at different points of a step.
    holding_outer: Holding,
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
            holding_outer: Holding::default(),
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
        self.hold_in(i, false, result)
    }

    /// [`PolicySet::hold`] for the plugin in slot `i`, keeping the output in its kind's entry
    /// or, with `outer`, in the sync plugin's outer-step entry.
    fn hold_in(
        &mut self,
        i: usize,
        outer: bool,
        result: Result<HeldOutput, (usize, PluginError)>,
    ) -> Result<HeldOutput, PluginError> {
        let holding = match outer {
            true => &mut self.holding_outer,
            false => &mut self.holding[i],
        };
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

    /// The sync policy's plan for `state` at `window` (checked, the final-step rule applied);
    /// `None` without a sync plugin. A held plan obeys the rules of the step it is held for.
    fn plan(&mut self, state: &State, window: &Window) -> Result<Option<StepKind>, PluginError> {
        let i = index(PolicyKind::Sync);
        let Some(p) = &mut self.plugins[i] else {
            return Ok(None);
        };
        let result = check_plan(p, state, window)
            .map(HeldOutput::Plan)
            .map_err(|e| (0, e));
        let fresh = result.is_ok();
        let kind = match self.hold(i, result)? {
            HeldOutput::Plan(k) => k,
            _ => unreachable!("a sync plugin holds a plan"),
        };
        if fresh {
            return Ok(Some(kind));
        }
        let label = self.plugins[i].as_ref().map_or("", |p| p.label());
        plan_rules(label, state, window, kind, true).map(Some)
    }

    /// The outer step of the window `state.step` ended, `window` being the window its plan saw
    /// ([`Decision::window`]), for the drift of `tensors`, checked ([`check_outer_step`]);
    /// `None` without a sync plugin. Called after a step whose plan was `average`.
    pub fn outer_step(
        &mut self,
        state: &State,
        window: &Window,
        tensors: &[TensorDrift],
    ) -> Result<Option<OuterStep>, PluginError> {
        let i = index(PolicyKind::Sync);
        let Some(p) = &mut self.plugins[i] else {
            return Ok(None);
        };
        let result = check_outer_step(p, state, window, tensors)
            .map(HeldOutput::Outer)
            .map_err(|e| (0, e));
        match self.hold_in(i, true, result)? {
            HeldOutput::Outer(o) => Ok(Some(o)),
            _ => unreachable!("a sync plugin holds an outer step"),
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
        let window = clock.window();
        let plan = self.plan(&state, &window)?;
        Ok(Decision {
            state,
            lr,
            momentum,
            global_batch,
            label_smoothing,
            plan,
            window,
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

/// Calls a sync `plugin`'s `plan` and applies the contract's rules ([`plan_rules`]): a
/// `synchronous` answer inside a window is refused, and a `local` one at the run's last step
/// becomes `average`.
pub fn check_plan(
    plugin: &mut Plugin,
    state: &State,
    window: &Window,
) -> Result<StepKind, PluginError> {
    let kind = match plugin.plan(state, window) {
        // As in check_output: one retry on a fresh (restored) instance.
        Err(e) if matches!(e.fault, Fault::Deadline { .. }) => plugin.plan(state, window)?,
        r => r?,
    };
    plan_rules(plugin.label(), state, window, kind, false)
}

/// The rules a plan obeys at `state`'s step and `window`, for the plan `kind` of `plugin`
/// (`held`: an output held from an earlier step after a fault): `synchronous` only at a
/// window's start, since the ranks' weights differ once a window has begun and only
/// `average` brings them together; at the run's last step (`total-steps` = `step` + 1) `local`
/// becomes `average`, so a run ends with one model.
pub fn plan_rules(
    plugin: &str,
    state: &State,
    window: &Window,
    kind: StepKind,
    held: bool,
) -> Result<StepKind, PluginError> {
    if kind == StepKind::Synchronous && window.local_steps > 0 {
        let what = match held {
            true => "synchronous (held from an earlier step after a fault)",
            false => "synchronous",
        };
        let m = format!(
            "{what} after {} local steps; end the window with average first",
            window.local_steps
        );
        return Err(PluginError::new(plugin, "plan", Fault::BadOutput(m)).at_step(state.step));
    }
    let last = state.total_steps == state.step + 1;
    Ok(match kind {
        StepKind::Local if last => StepKind::Average,
        kind => kind,
    })
}

/// Calls a sync `plugin`'s `outer-step` for `tensors` and applies the contract's checks
/// ([`outer_step_problem`]).
pub fn check_outer_step(
    plugin: &mut Plugin,
    state: &State,
    window: &Window,
    tensors: &[TensorDrift],
) -> Result<OuterStep, PluginError> {
    let out = match plugin.outer_step(state, window, tensors) {
        // As in check_output: one retry on a fresh (restored) instance.
        Err(e) if matches!(e.fault, Fault::Deadline { .. }) => {
            plugin.outer_step(state, window, tensors)?
        }
        r => r?,
    };
    match outer_step_problem(&out, tensors) {
        Some(m) => Err(
            PluginError::new(plugin.label(), "outer-step", Fault::BadOutput(m)).at_step(state.step),
        ),
        None => Ok(out),
    }
}

/// What is wrong with an outer step for `tensors`, naming the tensor where one is concerned;
/// `None` when it is within the contract: lr finite and >= 0, momentum finite and in [0, 1),
/// `lr-scale` empty or one finite value >= 0 per tensor.
pub fn outer_step_problem(o: &OuterStep, tensors: &[TensorDrift]) -> Option<String> {
    if !(o.lr.is_finite() && o.lr >= 0.0) {
        return Some(format!("outer lr {}: must be finite and >= 0", o.lr));
    }
    if !(o.momentum.is_finite() && (0.0..1.0).contains(&o.momentum)) {
        return Some(format!(
            "outer momentum {}: must be finite and in [0, 1)",
            o.momentum
        ));
    }
    if !o.lr_scale.is_empty() && o.lr_scale.len() != tensors.len() {
        return Some(format!(
            "{} lr-scale entries for {} parameter tensors (empty, or one per tensor)",
            o.lr_scale.len(),
            tensors.len()
        ));
    }
    o.lr_scale
        .iter()
        .zip(tensors)
        .find(|(m, _)| !(m.is_finite() && **m >= 0.0))
        .map(|(m, t)| format!("lr-scale {m} for {}: must be finite and >= 0", t.name))
}

#[cfg(test)]
mod tests {
    use lsgd_policy::Role;

    use super::*;

    /// The state of `step` in a run of `total` steps.
    fn state(step: u64, total: u64) -> State {
        State {
            step,
            total_steps: total,
            ..State::default()
        }
    }

    fn window(local_steps: u32) -> Window {
        Window {
            local_steps,
            windows: 3,
        }
    }

    #[test]
    fn a_local_plan_at_the_last_step_becomes_average() {
        let rule = |step, kind| plan_rules("s.wasm", &state(step, 10), &window(2), kind, false);
        assert_eq!(rule(8, StepKind::Local).unwrap(), StepKind::Local);
        assert_eq!(rule(9, StepKind::Local).unwrap(), StepKind::Average);
        assert_eq!(rule(9, StepKind::Average).unwrap(), StepKind::Average);
        let first = plan_rules(
            "s.wasm",
            &state(9, 10),
            &window(0),
            StepKind::Synchronous,
            false,
        );
        assert_eq!(first.unwrap(), StepKind::Synchronous);
    }

    #[test]
    fn synchronous_inside_a_window_is_refused_naming_plugin_call_and_step() {
        let e = plan_rules(
            "s.wasm",
            &state(5, 10),
            &window(2),
            StepKind::Synchronous,
            false,
        )
        .unwrap_err();
        assert!(matches!(e.fault, Fault::BadOutput(_)));
        assert_eq!(
            e.to_string(),
            "plugin s.wasm: plan at step 5: returned an invalid value: synchronous after 2 local \
             steps; end the window with average first"
        );
        // A plan held after a fault obeys the same rule, and says it was held.
        let e = plan_rules(
            "s.wasm",
            &state(5, 10),
            &window(1),
            StepKind::Synchronous,
            true,
        )
        .unwrap_err();
        assert!(e.to_string().contains("held from an earlier step"), "{e}");
        let held = plan_rules("s.wasm", &state(9, 10), &window(1), StepKind::Local, true);
        assert_eq!(held.unwrap(), StepKind::Average);
    }

    fn drift(name: &str) -> TensorDrift {
        TensorDrift {
            name: name.into(),
            shape: vec![4],
            role: Role::Bias,
            weight_norm: 1.0,
            delta_norm: 0.5,
            rank_delta_norm: 0.5,
            momentum_norm: 0.0,
            delta_dot_momentum: 0.0,
        }
    }

    #[test]
    fn outer_steps_outside_the_contract_are_named_with_their_tensor() {
        let tensors = [drift("fc.weight"), drift("fc.bias")];
        let diloco = OuterStep {
            lr: 0.7,
            momentum: 0.9,
            nesterov: true,
            lr_scale: Vec::new(),
        };
        let problem = |o: OuterStep| outer_step_problem(&o, &tensors);
        assert_eq!(problem(diloco.clone()), None);
        assert_eq!(problem(OuterStep::average()), None);
        let zero = OuterStep {
            lr: 0.0,
            momentum: 0.0,
            lr_scale: vec![0.0, 3.0],
            ..diloco.clone()
        };
        assert_eq!(problem(zero), None);
        let cases = [
            (
                OuterStep {
                    lr: f64::NAN,
                    ..diloco.clone()
                },
                "outer lr NaN: must be finite and >= 0",
            ),
            (
                OuterStep {
                    lr: -0.1,
                    ..diloco.clone()
                },
                "outer lr -0.1: must be finite and >= 0",
            ),
            (
                OuterStep {
                    momentum: 1.0,
                    ..diloco.clone()
                },
                "outer momentum 1: must be finite and in [0, 1)",
            ),
            (
                OuterStep {
                    momentum: f64::INFINITY,
                    ..diloco.clone()
                },
                "outer momentum inf: must be finite and in [0, 1)",
            ),
            (
                OuterStep {
                    lr_scale: vec![1.0],
                    ..diloco.clone()
                },
                "1 lr-scale entries for 2 parameter tensors (empty, or one per tensor)",
            ),
            (
                OuterStep {
                    lr_scale: vec![1.0, -2.0],
                    ..diloco.clone()
                },
                "lr-scale -2 for fc.bias: must be finite and >= 0",
            ),
            (
                OuterStep {
                    lr_scale: vec![f64::NAN, 1.0],
                    ..diloco
                },
                "lr-scale NaN for fc.weight: must be finite and >= 0",
            ),
        ];
        for (o, want) in cases {
            assert_eq!(problem(o).as_deref(), Some(want));
        }
    }

    #[test]
    fn a_set_without_a_sync_plugin_plans_nothing() {
        let mut set = PolicySet::new(Vec::new(), Bounds::default()).unwrap();
        let clock = Clock::new(super::super::RunShape {
            epochs: 1,
            samples_per_epoch: 1024,
            initial_batch: 256,
            world_size: 4,
            base_lr: 0.1,
            reference_batch: 256,
        })
        .unwrap();
        let d = set.decide(&clock).unwrap();
        assert_eq!((d.plan, d.window), (None, Window::default()));
        let o = set.outer_step(&d.state, &d.window, &[drift("w")]).unwrap();
        assert_eq!(o, None);
        assert!(set.get(PolicyKind::Sync).is_none());
    }
}
