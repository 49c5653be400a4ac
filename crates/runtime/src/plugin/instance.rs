//! One loaded plugin: its compiled component, its description, its configured parameters and a
//! live sandboxed instance. After any fault the instance is discarded (wasmtime cannot re-enter
//! an instance that trapped); [`Plugin::reset`] makes a fresh one with the same parameters.
//!
//! A stateful plugin (contract 0.3's `state` interface) is snapshotted before its first call at
//! each step, and a fresh instance is restored from that snapshot, so a fault loses nothing:
//! the retried call sees the state the failed one saw, and a checkpoint taken after a fault
//! holds the state from before the failed step.

use lsgd_codec::{Meta, Properties};
use lsgd_policy::{Info, State, TensorNorms, Value};
use wasmtime::component::InstancePre;
use wasmtime::{Engine, Store, Trap};

use super::binding::{Bound, Indices};
use super::cache::Origin;
use super::contract::{Contract, PolicyKind};
use super::error::{Fault, PluginError, wasm_msg};
use super::params;
use super::sandbox::{Limits, Sandbox, TICK};
use super::types::Output;

/// Setup calls (instantiation, describe, configure) may initialise a language runtime, and
/// codec calls process up to ~1M floats, so they get this many times the per-call deadline,
/// and at least [`SETUP_MIN_MS`].
const SETUP_DEADLINE_FACTOR: u64 = 100;
const SETUP_MIN_MS: u64 = 1_000;

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
    info: Info,
    /// `None` until the parameters resolve: a plugin with a required parameter stays
    /// unconfigured until the user gives it.
    params: Option<Vec<(String, Value)>>,
    live: Option<Live>,
    /// A stateful plugin's state before its first call at a step, with that step: what a
    /// fresh instance is restored to.
    snapshot: Option<Snapshot>,
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
}

impl Plugin {
    pub(super) fn new(
        label: String,
        engine: Engine,
        pre: InstancePre<Sandbox>,
        contract: Contract,
        facts: Facts,
        limits: Limits,
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
            info: Info {
                name: String::new(),
                version: String::new(),
                summary: String::new(),
                params: Vec::new(),
            },
            params: None,
            live: None,
            snapshot: None,
        };
        let mut live = plugin.instantiate()?;
        plugin.arm(&mut live.store, true);
        let info = live
            .bound
            .describe(&mut live.store)
            .map_err(|e| plugin.fault("describe", &live.store, e, true))?;
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
        self.arm(&mut live.store, true);
        match live.bound.configure(&mut live.store, params) {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => {
                return Err(PluginError::new(
                    self.label.clone(),
                    "configure",
                    Fault::Configure(msg),
                ));
            }
            Err(e) => return Err(self.fault("configure", &live.store, e, true)),
        }
        if let Some(snap) = &self.snapshot {
            match live.bound.restore(&mut live.store, &snap.bytes) {
                Ok(Ok(())) => {}
                Ok(Err(msg)) => {
                    let e = PluginError::new(self.label.clone(), "restore", Fault::Refused(msg));
                    return Err(e.at_step(snap.step));
                }
                Err(e) => return Err(self.fault("restore", &live.store, e, true)),
            }
        }
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
        self.invoke("snapshot", Some(step), true, |b, store| b.snapshot(store))
    }

    /// Calls the policy function of this plugin's kind for `state`. Raw output: range checks
    /// belong to the caller, which knows the limits (see `policy::PolicySet`).
    pub fn call(&mut self, state: &State) -> Result<Output, PluginError> {
        self.before_call(state.step)?;
        let name = self.call_name();
        self.invoke(name, Some(state.step), false, |b, store| {
            b.call(store, state)
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
        self.invoke("multipliers", Some(state.step), false, |b, store| {
            b.multipliers(store, state, tensors)
        })
    }

    /// Calls a codec's `properties`.
    pub fn properties(&mut self) -> Result<Properties, PluginError> {
        self.invoke("properties", None, true, |b, store| b.properties(store))
    }

    /// Calls a codec's `encode`; its own error becomes [`Fault::Refused`].
    pub fn encode(
        &mut self,
        meta: &Meta,
        data: &[f32],
        agreed: &[Vec<u8>],
    ) -> Result<Vec<u8>, PluginError> {
        self.invoke("encode", Some(meta.step), true, |b, store| {
            b.encode(store, meta, data, agreed)
        })?
        .map_err(|m| self.refused("encode", meta.step, m))
    }

    /// Calls a codec's `decode`; its own error becomes [`Fault::Refused`], and a result other
    /// than the contract's `meta.len` floats [`Fault::BadOutput`].
    pub fn decode(&mut self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, PluginError> {
        let out = self
            .invoke("decode", Some(meta.step), true, |b, store| {
                b.decode(store, meta, payloads)
            })?
            .map_err(|m| self.refused("decode", meta.step, m))?;
        if out.len() == meta.len as usize {
            return Ok(out);
        }
        let msg = format!(
            "{} floats for bucket {} of {} floats",
            out.len(),
            meta.bucket,
            meta.len
        );
        Err(
            PluginError::new(self.label.clone(), "decode", Fault::BadOutput(msg))
                .at_step(meta.step),
        )
    }

    fn refused(&self, call: &'static str, step: u64, msg: String) -> PluginError {
        PluginError::new(self.label.clone(), call, Fault::Refused(msg)).at_step(step)
    }

    /// Runs `f` on the live instance (configuring a fresh one first if needed) under the
    /// per-call deadline, or the long one for codec calls; a fault drops the instance.
    fn invoke<R>(
        &mut self,
        call: &'static str,
        step: Option<u64>,
        long: bool,
        f: impl FnOnce(&Bound, &mut Store<Sandbox>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        let at = |e: PluginError| match step {
            Some(s) => e.at_step(s),
            None => e,
        };
        if !self.live.as_ref().is_some_and(|l| l.configured) {
            self.reset().map_err(at)?;
        }
        let ticks = self.deadline_ticks(long);
        let live = self.live.as_mut().expect("reset leaves a live instance");
        live.store.set_epoch_deadline(ticks);
        match f(&live.bound, &mut live.store) {
            Ok(out) => Ok(out),
            Err(e) => {
                // The instance is dropped: it may be mid-way through a trap.
                let live = self.live.take().expect("still live");
                Err(at(self.fault(call, &live.store, e, long)))
            }
        }
    }

    /// The WIT name of this plugin's policy function.
    pub fn call_name(&self) -> &'static str {
        self.contract.kind.function()
    }

    fn instantiate(&self) -> Result<Live, PluginError> {
        let mut store = Store::new(&self.engine, Sandbox::new(&self.limits));
        store.limiter(|s| s.limiter());
        self.arm(&mut store, true);
        let instance = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| self.fault("instantiate", &store, e, true))?;
        let bound = self
            .indices
            .bind(&mut store, &instance)
            .map_err(|e| mismatch(&self.label, &self.contract, &e))?;
        Ok(Live {
            store,
            bound,
            configured: false,
        })
    }

    /// Sets the epoch deadline before entering the guest.
    fn arm(&self, store: &mut Store<Sandbox>, setup: bool) {
        store.set_epoch_deadline(self.deadline_ticks(setup));
    }

    /// The deadline of a policy call, or of a setup or codec call (`long`), in ms.
    fn deadline_ms(&self, long: bool) -> u64 {
        if long {
            (self.limits.deadline_ms * SETUP_DEADLINE_FACTOR).max(SETUP_MIN_MS)
        } else {
            self.limits.deadline_ms
        }
    }

    /// The same deadline in epoch ticks.
    fn deadline_ticks(&self, long: bool) -> u64 {
        self.deadline_ms(long)
            .div_ceil(TICK.as_millis() as u64)
            .max(1)
    }

    fn fault(
        &self,
        call: &'static str,
        store: &Store<Sandbox>,
        e: wasmtime::Error,
        long: bool,
    ) -> PluginError {
        let fault = if let Some(requested) = store.data().memory_cap_hit() {
            Fault::MemoryCap {
                cap: self.limits.memory_bytes,
                requested,
            }
        } else if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
            Fault::Deadline {
                ms: self.deadline_ms(long),
            }
        } else {
            Fault::Trap(wasm_msg(&e))
        };
        let mut err = PluginError::new(self.label.clone(), call, fault);
        err.guest_stderr = Some(store.data().stderr()).filter(|s| !s.is_empty());
        err
    }
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
