//! One loaded plugin: its compiled component, its description, its configured parameters and a
//! live sandboxed instance. After any fault the instance is discarded (wasmtime cannot re-enter
//! an instance that trapped); [`Plugin::reset`] makes a fresh one with the same parameters.
//!
//! A stateful plugin (contract 0.3's `state` interface) is snapshotted before its first call at
//! each step, and a fresh instance is restored from that snapshot, so a fault loses nothing:
//! the retried call sees the state the failed one saw, and a checkpoint taken after a fault
//! holds the state from before the failed step. A step's first call is whichever comes first
//! (a sync plugin's `plan`, then its `outer-step` later in the same step).
//!
//! Every call runs on a [`Budget`]: fuel, counted in WebAssembly instructions and so the same on
//! every rank, and a wall-clock backstop (the epoch deadline). A codec call that finishes but
//! uses more than half of either gets one warning per plugin and call name ([`SLOW_SHARE`]).

use std::time::Instant;

use lsgd_codec::{Meta, Properties};
use lsgd_policy::{Info, OuterStep, State, StepKind, TensorDrift, TensorNorms, Value, Window};
use wasmtime::component::InstancePre;
use wasmtime::{Engine, Store, Trap, WasmBacktrace};

use super::binding::{Bound, Indices};
use super::cache::Origin;
use super::contract::{Binding, Contract, PolicyKind};
use super::error::{Fault, PluginError, wasm_msg};
use super::params;
use super::runtime::Metering;
use super::sandbox::{Limits, Sandbox, TICK};
use super::types::Output;
use super::words::{Knob, Words};

/// A codec call that uses more than this share of its fuel or of its wall-clock backstop is
/// reported (once per plugin and call name): it is a slower rank or a bigger bucket away from
/// being stopped.
pub const SLOW_SHARE: f64 = 0.5;

/// A codec's payload may be at most this many times its bucket's binary32 bytes ...
pub const PAYLOAD_FACTOR: u64 = 8;
/// ... plus this many bytes (headers, indices of a tiny bucket).
pub const PAYLOAD_SLACK: u64 = 64 << 10;

/// What one call may spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Budget {
    /// A policy call: `--plugin-fuel`, `--plugin-deadline-ms`.
    Policy,
    /// Instantiation, describe, configure, snapshot, restore, properties: a language runtime
    /// may initialise there.
    Setup,
    /// A codec call handling this many floats (bucket plus input payloads).
    Codec(u64),
}

/// Static facts about a plugin file, for `inspect`.
#[derive(Debug, Clone)]
pub struct Facts {
    /// Size of the component in bytes.
    pub size: usize,
    /// Whether it was compiled now or loaded from the cache, and how long that took.
    pub origin: Origin,
    /// The names of everything it imports (WASI interfaces, if its toolchain needs them).
    pub imports: Vec<String>,
    /// blake3 of the component bytes, hex: the plugin's identity in checkpoints and
    /// consistency checks, independent of its file name.
    pub blake3: String,
    /// Whether its code was compiled with canonical NaNs (policies always; codecs with
    /// `--codec-canonical-nans`).
    pub canonical_nans: bool,
    /// What its engine's compiled code counts: fuel and the deadline in training.
    pub metering: Metering,
}

/// How a plugin is identified when a resume compares plugins: `schedule warmup (blake3
/// 1a2b3c4d5e6f…, params [("warmup_epochs", "5")])`. The host's checkpoints and `lsgd-torch`'s
/// `state_dict`s refuse a mismatch with these lines, so both say it in the same words.
pub fn identity(kind: &str, name: &str, blake3: &str, params: &[(String, String)]) -> String {
    format!(
        "{kind} {name} (blake3 {}…, params {params:?})",
        &blake3[..12.min(blake3.len())]
    )
}

/// A loaded, sandboxed policy plugin.
pub struct Plugin {
    label: String,
    engine: Engine,
    pre: InstancePre<Sandbox>,
    contract: Contract,
    indices: Indices,
    facts: Facts,
    limits: Limits,
    /// The caller's names for the limits a fault tells the user to raise.
    words: &'static Words,
    info: Info,
    /// `None` until the parameters resolve: a plugin with a required parameter stays
    /// unconfigured until the user gives it.
    params: Option<Vec<(String, Value)>>,
    live: Option<Live>,
    /// A stateful plugin's state before its first call at a step, with that step: what a
    /// fresh instance is restored to.
    snapshot: Option<Snapshot>,
    /// The fuel the last call that returned used, when its engine counts fuel.
    last_fuel: Option<u64>,
    /// The most fuel one setup call of the last fresh instance used.
    setup_fuel: Option<u64>,
    /// The slow-call warnings given so far: at most one per call name.
    warnings: Vec<(&'static str, String)>,
}

/// A stateful plugin's state before its calls at `step`.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    step: u64,
    bytes: Vec<u8>,
}

struct Live {
    store: Store<Sandbox>,
    bound: Bound,
    configured: bool,
    /// The most fuel one of its setup calls used so far.
    setup_fuel: Option<u64>,
}

impl Plugin {
    pub(super) fn new(
        label: String,
        engine: Engine,
        pre: InstancePre<Sandbox>,
        contract: Contract,
        facts: Facts,
        limits: Limits,
        words: &'static Words,
    ) -> Result<Self, PluginError> {
        let indices = Indices::new(&pre, contract.binding, contract.kind, contract.stateful)
            .map_err(|e| mismatch(&label, &contract, &e))?;
        let mut plugin = Plugin {
            label,
            engine,
            pre,
            contract,
            indices,
            facts,
            limits,
            words,
            info: Info {
                name: String::new(),
                version: String::new(),
                summary: String::new(),
                params: Vec::new(),
            },
            params: None,
            live: None,
            snapshot: None,
            last_fuel: None,
            setup_fuel: None,
            warnings: Vec::new(),
        };
        let mut live = plugin.instantiate()?;
        plugin.arm(&mut live.store, Budget::Setup);
        let info = live
            .bound
            .describe(&mut live.store)
            .map_err(|e| plugin.fault("describe", &live.store, e, Budget::Setup))?;
        live.setup_fuel = live
            .setup_fuel
            .max(plugin.spent(&live.store, Budget::Setup));
        plugin.setup_fuel = live.setup_fuel;
        params::check_specs(&info.params).map_err(|e| {
            PluginError::new(plugin.label.clone(), "describe", Fault::Load(e.to_string()))
        })?;
        plugin.params = params::resolve(&info.params, &[]).ok();
        plugin.info = info;
        plugin.live = Some(live);
        Ok(plugin)
    }

    /// The file the plugin was loaded from, as the user gave it.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The caller's words its messages use.
    pub fn words(&self) -> &'static Words {
        self.words
    }

    /// Its kind (world).
    pub fn kind(&self) -> PolicyKind {
        self.contract.kind
    }

    /// The contract it was built against.
    pub fn contract(&self) -> &Contract {
        &self.contract
    }

    /// Whether it keeps state between calls (exports `state`: snapshot/restore).
    pub fn stateful(&self) -> bool {
        self.contract.stateful
    }

    /// What `describe()` returned.
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// Size, compile origin and imports.
    pub fn facts(&self) -> &Facts {
        &self.facts
    }

    /// The limits its instances run under.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The fuel the last successful call used (its budget minus what was left); `None` before
    /// any call or when its engine does not count fuel. Deterministic: the same inputs cost
    /// the same fuel on every rank.
    pub fn last_fuel(&self) -> Option<u64> {
        self.last_fuel
    }

    /// The most fuel one setup call (instantiation, describe, configure, restore) of the last
    /// fresh instance used; `None` when its engine does not count fuel.
    pub fn setup_fuel(&self) -> Option<u64> {
        self.setup_fuel
    }

    /// The slow-call warnings printed so far (at most one per call name), oldest first.
    pub fn slow_warnings(&self) -> impl Iterator<Item = &str> {
        self.warnings.iter().map(|(_, w)| w.as_str())
    }

    /// The parameter values in force, rendered as text (as checkpoints record them).
    pub fn rendered_params(&self) -> Vec<(String, String)> {
        self.params()
            .iter()
            .map(|(k, v)| (k.clone(), params::render(v)))
            .collect()
    }

    /// Its [`identity`] line.
    pub fn identity(&self) -> String {
        identity(
            &self.kind().to_string(),
            &self.info.name,
            &self.facts.blake3,
            &self.rendered_params(),
        )
    }

    /// The parameter values in force (defaults until [`Plugin::configure`] is called; empty
    /// while a required parameter is missing).
    pub fn params(&self) -> &[(String, Value)] {
        self.params.as_deref().unwrap_or_default()
    }

    /// Type-checks `settings` against `describe()`, then configures a fresh instance with them
    /// (defaults filled in). The plugin's own rejection comes back as [`Fault::Configure`].
    pub fn configure(&mut self, settings: &[(String, String)]) -> Result<(), PluginError> {
        let params = params::resolve(&self.info.params, settings).map_err(|e| {
            PluginError::new(self.label.clone(), "configure", Fault::Param(e.to_string()))
        })?;
        self.params = Some(params);
        // New parameters start a new state.
        self.snapshot = None;
        self.reset()
    }

    /// Replaces the instance with a fresh one configured with the parameters in force. This is
    /// how the host recovers after a fault: policies are pure, so nothing is lost.
    pub fn reset(&mut self) -> Result<(), PluginError> {
        let Some(params) = &self.params else {
            // Resolving again reports the missing required parameter.
            return self.configure(&[]);
        };
        let mut live = match self.live.take() {
            Some(live) if !live.configured => live,
            _ => self.instantiate()?,
        };
        self.arm(&mut live.store, Budget::Setup);
        match live.bound.configure(&mut live.store, params) {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => {
                return Err(PluginError::new(
                    self.label.clone(),
                    "configure",
                    Fault::Configure(msg),
                ));
            }
            Err(e) => return Err(self.fault("configure", &live.store, e, Budget::Setup)),
        }
        live.setup_fuel = live.setup_fuel.max(self.spent(&live.store, Budget::Setup));
        if let Some(snap) = &self.snapshot {
            // Configure's fuel is spent; restore gets a budget of its own.
            self.arm(&mut live.store, Budget::Setup);
            match live.bound.restore(&mut live.store, &snap.bytes) {
                Ok(Ok(())) => {}
                Ok(Err(msg)) => {
                    let e = PluginError::new(self.label.clone(), "restore", Fault::Refused(msg));
                    return Err(e.at_step(snap.step));
                }
                Err(e) => return Err(self.fault("restore", &live.store, e, Budget::Setup)),
            }
            live.setup_fuel = live.setup_fuel.max(self.spent(&live.store, Budget::Setup));
        }
        self.setup_fuel = live.setup_fuel;
        live.configured = true;
        self.live = Some(live);
        Ok(())
    }

    /// A stateful plugin's state as of the start of `step` (before its calls at that step),
    /// for a checkpoint or the cross-rank check; `None` for a plugin without state.
    pub fn state_at(&mut self, step: u64) -> Result<Option<Vec<u8>>, PluginError> {
        if !self.stateful() {
            return Ok(None);
        }
        match &self.snapshot {
            Some(s) if s.step == step => Ok(Some(s.bytes.clone())),
            // Not called yet at `step`: its state now is its state at the start of it.
            _ => self.take_snapshot(step).map(Some),
        }
    }

    /// Puts a stateful plugin into the state `bytes` (from [`Plugin::state_at`]) for its
    /// calls from `step` on: a resume. The plugin's refusal is [`Fault::Refused`].
    pub fn restore(&mut self, step: u64, bytes: Vec<u8>) -> Result<(), PluginError> {
        if !self.stateful() {
            let msg = "a snapshot for a plugin that does not export state".to_string();
            return Err(PluginError::new(
                self.label.clone(),
                "restore",
                Fault::Load(msg),
            ));
        }
        self.snapshot = Some(Snapshot { step, bytes });
        // A fresh instance: reset restores the snapshot into it.
        self.live = None;
        self.reset()
    }

    /// Before a stateful plugin's first call at `step`, keeps its state for [`Plugin::reset`]
    /// and [`Plugin::state_at`].
    fn before_call(&mut self, step: u64) -> Result<(), PluginError> {
        if !self.stateful() || self.snapshot.as_ref().is_some_and(|s| s.step == step) {
            return Ok(());
        }
        let bytes = self.take_snapshot(step)?;
        self.snapshot = Some(Snapshot { step, bytes });
        Ok(())
    }

    /// Calls `snapshot` on the live instance, under the long deadline: a missed one has no
    /// retry.
    fn take_snapshot(&mut self, step: u64) -> Result<Vec<u8>, PluginError> {
        self.invoke("snapshot", Some(step), Budget::Setup, |b, store| {
            b.snapshot(store)
        })
    }

    /// Calls the policy function of this plugin's kind for `state`. Raw output: range checks
    /// belong to the caller, which knows the limits (see `policy::PolicySet`).
    pub fn call(&mut self, state: &State) -> Result<Output, PluginError> {
        self.before_call(state.step)?;
        let name = self.call_name();
        self.invoke(name, Some(state.step), Budget::Policy, |b, store| {
            b.call(store, state)
        })
    }

    /// Calls a schedule's `momentum` for `state` (contract 0.4; `None` from older schedules
    /// without a call), unchecked like [`Plugin::call`].
    pub fn momentum(&mut self, state: &State) -> Result<Option<f64>, PluginError> {
        if self.contract.binding < Binding::V0_4 {
            return Ok(None);
        }
        self.before_call(state.step)?;
        self.invoke("momentum", Some(state.step), Budget::Policy, |b, store| {
            b.momentum(store, state)
        })
    }

    /// Calls a layer-rate plugin's `multipliers` for the tensors of one step. Raw output: the
    /// contract's checks (count, finite, >= 0) belong to the caller, like [`Plugin::call`]'s.
    pub fn multipliers(
        &mut self,
        state: &State,
        tensors: &[TensorNorms],
    ) -> Result<Vec<f64>, PluginError> {
        self.before_call(state.step)?;
        self.invoke(
            "multipliers",
            Some(state.step),
            Budget::Policy,
            |b, store| b.multipliers(store, state, tensors),
        )
    }

    /// Calls a sync plugin's `plan` for `state` at `window` (contract 0.5). Raw output: which
    /// kinds the window allows, and the run's last step, are the caller's to apply.
    pub fn plan(&mut self, state: &State, window: &Window) -> Result<StepKind, PluginError> {
        self.before_call(state.step)?;
        self.invoke("plan", Some(state.step), Budget::Policy, |b, store| {
            b.plan(store, state, window)
        })
    }

    /// Calls a sync plugin's `outer-step` for the window `state.step` ended (`window` as
    /// `plan` saw it). Raw output: the contract's ranges are the caller's to check, like
    /// [`Plugin::multipliers`]'.
    pub fn outer_step(
        &mut self,
        state: &State,
        window: &Window,
        tensors: &[TensorDrift],
    ) -> Result<OuterStep, PluginError> {
        self.before_call(state.step)?;
        self.invoke(
            "outer-step",
            Some(state.step),
            Budget::Policy,
            |b, store| b.outer_step(store, state, window, tensors),
        )
    }

    /// Calls a codec's `properties`.
    pub fn properties(&mut self) -> Result<Properties, PluginError> {
        self.invoke("properties", None, Budget::Setup, |b, store| {
            b.properties(store)
        })
    }

    /// Calls a codec's `encode`; its own error becomes [`Fault::Refused`], and a payload over
    /// [`PAYLOAD_FACTOR`] times the bucket's bytes plus [`PAYLOAD_SLACK`] [`Fault::BadOutput`]
    /// (it would be sent to every rank).
    pub fn encode(
        &mut self,
        meta: &Meta,
        data: &[f32],
        agreed: &[Vec<u8>],
    ) -> Result<Vec<u8>, PluginError> {
        let floats = data.len() as u64 + payload_floats(agreed) + meta.state.len() as u64 / 4;
        let out = self
            .invoke(
                "encode",
                Some(meta.step),
                Budget::Codec(floats),
                |b, store| b.encode(store, meta, data, agreed),
            )?
            .map_err(|m| self.refused("encode", meta.step, m))?;
        let bucket_bytes = u64::from(meta.len) * 4;
        let bound = bucket_bytes
            .saturating_mul(PAYLOAD_FACTOR)
            .saturating_add(PAYLOAD_SLACK);
        if out.len() as u64 <= bound {
            return Ok(out);
        }
        let msg = format!(
            "a payload of {} bytes for bucket {} of {} floats ({bucket_bytes} bytes): over the \
             bound of {PAYLOAD_FACTOR} x the bucket's bytes + {} KiB = {bound} bytes",
            out.len(),
            meta.bucket,
            meta.len,
            PAYLOAD_SLACK >> 10
        );
        Err(
            PluginError::new(self.label.clone(), "encode", Fault::BadOutput(msg))
                .at_step(meta.step),
        )
    }

    /// Calls a codec's `decode`; its own error becomes [`Fault::Refused`], and a result other
    /// than the contract's `meta.len` floats [`Fault::BadOutput`].
    pub fn decode(&mut self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, PluginError> {
        let floats = u64::from(meta.len) + payload_floats(payloads) + meta.state.len() as u64 / 4;
        // The lifted list can be no larger than the instance's capped memory, so a huge one
        // costs the host at most --plugin-memory-mb before it is refused here.
        let out = self
            .invoke(
                "decode",
                Some(meta.step),
                Budget::Codec(floats),
                |b, store| b.decode(store, meta, payloads),
            )?
            .map_err(|m| self.refused("decode", meta.step, m))?;
        if out.len() == meta.len as usize {
            return Ok(out);
        }
        let msg = format!(
            "{} floats for bucket {} of {} floats (decode must return exactly the bucket's \
             floats)",
            out.len(),
            meta.bucket,
            meta.len
        );
        Err(
            PluginError::new(self.label.clone(), "decode", Fault::BadOutput(msg))
                .at_step(meta.step),
        )
    }

    /// Calls a stateful codec's `next-state`; its own error becomes [`Fault::Refused`], and a
    /// state over the bound on payloads [`Fault::BadOutput`] (the host keeps and checkpoints it).
    pub fn next_state(&mut self, meta: &Meta, agreed: &[Vec<u8>]) -> Result<Vec<u8>, PluginError> {
        let floats = payload_floats(agreed) + meta.state.len() as u64 / 4;
        let out = self
            .invoke(
                "next-state",
                Some(meta.step),
                Budget::Codec(floats),
                |b, store| b.next_state(store, meta, agreed),
            )?
            .map_err(|m| self.refused("next-state", meta.step, m))?;
        let bound = (u64::from(meta.len) * 4)
            .saturating_mul(PAYLOAD_FACTOR)
            .saturating_add(PAYLOAD_SLACK);
        if out.len() as u64 <= bound {
            return Ok(out);
        }
        let msg = format!(
            "a state of {} bytes for bucket {} of {} floats: over the bound of {bound} bytes",
            out.len(),
            meta.bucket,
            meta.len
        );
        Err(
            PluginError::new(self.label.clone(), "next-state", Fault::BadOutput(msg))
                .at_step(meta.step),
        )
    }

    fn refused(&self, call: &'static str, step: u64, msg: String) -> PluginError {
        PluginError::new(self.label.clone(), call, Fault::Refused(msg)).at_step(step)
    }

    /// Runs `f` on the live instance (configuring a fresh one first if needed) under the
    /// call's budget; a fault drops the instance.
    fn invoke<R>(
        &mut self,
        call: &'static str,
        step: Option<u64>,
        budget: Budget,
        f: impl FnOnce(&Bound, &mut Store<Sandbox>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        let at = |e: PluginError| match step {
            Some(s) => e.at_step(s),
            None => e,
        };
        if !self.live.as_ref().is_some_and(|l| l.configured) {
            self.reset().map_err(at)?;
        }
        let mut live = self.live.take().expect("reset leaves a live instance");
        self.arm(&mut live.store, budget);
        // Only codec calls are long enough for two clock reads to be free.
        let start = matches!(budget, Budget::Codec(_)).then(Instant::now);
        match f(&live.bound, &mut live.store) {
            Ok(out) => {
                self.last_fuel = self.spent(&live.store, budget);
                self.live = Some(live);
                if let Some(start) = start {
                    self.check_slow(call, step, budget, start);
                }
                Ok(out)
            }
            // The instance is dropped: it may be mid-way through a trap.
            Err(e) => Err(at(self.fault(call, &live.store, e, budget))),
        }
    }

    /// Warns, once per call name, about a codec call that used more than [`SLOW_SHARE`] of its
    /// fuel or of its wall-clock backstop but finished.
    fn check_slow(
        &mut self,
        call: &'static str,
        step: Option<u64>,
        budget: Budget,
        start: Instant,
    ) {
        let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
        let deadline_ms = self.limits.deadline_ms(true) as f64;
        let fuel = self.budget_fuel(budget);
        let fuel_share = self.last_fuel.map_or(0.0, |used| used as f64 / fuel as f64);
        let time_share = elapsed_ms / deadline_ms;
        if (fuel_share <= SLOW_SHARE && time_share <= SLOW_SHARE)
            || self.warnings.iter().any(|(c, _)| *c == call)
        {
            return;
        }
        let (used, risk) = match self.last_fuel {
            Some(used) if fuel_share > SLOW_SHARE => (
                format!(
                    "{:.0}% of its fuel ({used} of {fuel} units{})",
                    fuel_share * 100.0,
                    raises(self.words, Knob::CodecFuelPerFloat)
                ),
                "other inputs",
            ),
            _ => (
                format!(
                    "{:.0}% of its wall-clock backstop ({elapsed_ms:.0} of {deadline_ms:.0} ms{})",
                    time_share * 100.0,
                    raises(self.words, Knob::DeadlineMs)
                ),
                "a busier machine",
            ),
        };
        let warning = format!(
            "warning: plugin {}: {call}{} used {used}; it finished, but {risk} may stop it \
             (further slow {call} calls are not reported)",
            self.label,
            step.map(|s| format!(" at step {s}")).unwrap_or_default(),
        );
        eprintln!("{warning}");
        self.warnings.push((call, warning));
    }

    /// The WIT name of this plugin's policy function.
    pub fn call_name(&self) -> &'static str {
        self.contract.kind.function()
    }

    fn instantiate(&self) -> Result<Live, PluginError> {
        let mut store = Store::new(&self.engine, Sandbox::new(&self.limits));
        store.limiter(|s| s.limiter());
        self.arm(&mut store, Budget::Setup);
        let instance = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| self.fault("instantiate", &store, e, Budget::Setup))?;
        let bound = self
            .indices
            .bind(&mut store, &instance)
            .map_err(|e| mismatch(&self.label, &self.contract, &e))?;
        let setup_fuel = self.spent(&store, Budget::Setup);
        Ok(Live {
            store,
            bound,
            configured: false,
            setup_fuel,
        })
    }

    /// The fuel `store` used since it was armed with `budget`.
    fn spent(&self, store: &Store<Sandbox>, budget: Budget) -> Option<u64> {
        let left = store.get_fuel().ok()?;
        Some(self.budget_fuel(budget).saturating_sub(left))
    }

    /// Sets the fuel and the epoch deadline of `budget` before entering the guest.
    fn arm(&self, store: &mut Store<Sandbox>, budget: Budget) {
        store.set_epoch_deadline(self.deadline_ticks(budget));
        if self.facts.metering.fuel() {
            store
                .set_fuel(self.budget_fuel(budget))
                .expect("the engine counts fuel");
        }
    }

    /// The fuel of a call on `budget`.
    fn budget_fuel(&self, budget: Budget) -> u64 {
        match budget {
            Budget::Policy => self.limits.fuel,
            Budget::Setup => self.limits.setup_fuel,
            Budget::Codec(floats) => self.limits.codec_fuel(floats),
        }
    }

    /// The wall-clock backstop of a call on `budget`, in epoch ticks.
    fn deadline_ticks(&self, budget: Budget) -> u64 {
        self.limits
            .deadline_ms(budget != Budget::Policy)
            .div_ceil(TICK.as_millis() as u64)
            .max(1)
    }

    fn fault(
        &self,
        call: &'static str,
        store: &Store<Sandbox>,
        e: wasmtime::Error,
        budget: Budget,
    ) -> PluginError {
        let trap = e.downcast_ref::<Trap>().copied();
        let mut backtrace = None;
        let fault = if let Some(requested) = store.data().memory_cap_hit() {
            Fault::MemoryCap {
                cap: self.limits.memory_bytes,
                requested,
            }
        } else if trap == Some(Trap::Interrupt) {
            Fault::Deadline {
                ms: self.limits.deadline_ms(budget != Budget::Policy),
            }
        } else if trap == Some(Trap::OutOfFuel) {
            Fault::Fuel {
                units: self.budget_fuel(budget),
                remedy: match budget {
                    Budget::Policy => self.words.fuel_remedies[0],
                    // Only a runtime that needs tens of billions of instructions to start hits it.
                    Budget::Setup => "the budget of setup calls is fixed",
                    Budget::Codec(_) => self.words.fuel_remedies[1],
                },
            }
        } else if trap == Some(Trap::StackOverflow) {
            // Without the backtrace, which runs to thousands of identical frames.
            Fault::Trap(
                "stack overflow: the call stack is exhausted (unbounded or too deep recursion)"
                    .into(),
            )
        } else if trap == Some(Trap::MemoryOutOfBounds) && below_address_zero(&wasm_msg(&e)) {
            // Rust and C guests keep their frames' arrays on a stack in linear memory that
            // grows down from 1 MiB; past address 0 it wraps to the top of the 4 GiB space.
            Fault::Trap(
                "stack overflow: the call stack is exhausted (its stack in linear memory ran \
                 below address 0: unbounded or too deep recursion)"
                    .into(),
            )
        } else if let Some(trap) = trap {
            // The frames go after what the guest said (PluginError's Display).
            backtrace = e.downcast_ref::<WasmBacktrace>().map(|b| frames(b).into());
            Fault::Trap(trap.to_string())
        } else {
            Fault::Trap(wasm_msg(&e))
        };
        let mut err = PluginError::new(self.label.clone(), call, fault);
        err.guest_stderr = Some(store.data().stderr())
            .filter(|s| !s.is_empty())
            .map(String::into_boxed_str);
        err.backtrace = backtrace;
        err
    }
}

/// `; --plugin-deadline-ms raises it` in the caller's words, or nothing for a limit its users
/// cannot set.
fn raises(words: &Words, knob: Knob) -> String {
    words
        .raises(knob)
        .map(|r| format!("; {r}"))
        .unwrap_or_default()
}

/// A wasm backtrace's frames, one a line, without wasmtime's heading.
fn frames(backtrace: &WasmBacktrace) -> String {
    let text = backtrace.to_string();
    let text = text.trim_start();
    text.strip_prefix("error while executing at wasm backtrace:")
        .unwrap_or(text)
        .trim_start_matches('\n')
        .to_string()
}

/// Whether a memory fault's message names an address in the top MiB of the 32-bit space or
/// beyond, where no capped memory reaches: a stack pointer that went below 0. (wasmtime does
/// not export the fault's address as a type.)
fn below_address_zero(msg: &str) -> bool {
    let Some(at) = msg.find("memory fault at wasm address 0x") else {
        return false;
    };
    let hex: String = msg[at + "memory fault at wasm address 0x".len()..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    u64::from_str_radix(&hex, 16).is_ok_and(|a| a >= 0xfff0_0000)
}

/// The floats' worth of `payloads`: what a codec call handles besides its bucket.
fn payload_floats(payloads: &[Vec<u8>]) -> u64 {
    payloads.iter().map(|p| p.len() as u64).sum::<u64>() / 4
}

/// The component's exports have the right names but not the types of its world.
fn mismatch(label: &str, contract: &Contract, e: &wasmtime::Error) -> PluginError {
    PluginError::new(
        label,
        "load",
        Fault::Load(format!(
            "does not match world {} of lsgd:policy@{}: {}",
            contract.kind.world(),
            contract.version,
            wasm_msg(e)
        )),
    )
}
