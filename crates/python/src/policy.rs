//! `Policy`: one schedule, batch-size, label-smoothing, layer-rate or sync plugin and the
//! training clock that produces the `train-state` it sees, exactly as `lsgd-host run` and
//! `trace` drive it: the same `Clock` (with a sync plugin, its window), the same output checks
//! (`check_output`, `check_multipliers`, `check_plan` with the final-step rule,
//! `check_outer_step`), the same snapshots of stateful plugins. `lsgd_torch.WasmLR` and its
//! siblings wrap one each.

use std::sync::Mutex;

use lsgd_policy::{Role, State, StepKind, TensorDrift, TensorNorms, Window};
use lsgd_runtime::plugin::{Plugin, PolicyKind};
use lsgd_runtime::policy::{
    Bounds, Clock, RunShape, check_momentum, check_multipliers, check_outer_step, check_output,
    check_plan,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::errors::{PYTHON, plugin_to_py, to_py};
use crate::{Budget, load, runtime};

/// A loaded policy plugin and its clock.
#[pyclass(module = "lsgd_torch._native", frozen)]
pub struct Policy {
    inner: Mutex<Inner>,
}

struct Inner {
    plugin: Plugin,
    clock: Clock,
    bounds: Bounds,
    /// A sync plugin's plan for the step about to be taken, once asked: what `advance` moves
    /// the clock's window by, and the state and window its `outer_step` is asked with.
    planned: Option<Planned>,
}

/// A sync plugin's plan for one step, with what it saw.
#[derive(Debug, Clone, Copy)]
struct Planned {
    state: State,
    window: Window,
    kind: StepKind,
}

/// One tensor as Python passes it to `outer_step`: name, shape, role, ‖θ_global‖, ‖Δ‖,
/// sqrt(mean_k ‖Δ_k‖²), ‖m‖, ⟨Δ, m⟩.
type DriftArg = (String, Vec<u32>, String, f64, f64, f64, f64, f64);

/// One tensor as Python passes it to `multipliers`: name, shape, role, ‖w‖, ‖g‖, ‖u‖, weight
/// decay.
type TensorArg = (String, Vec<u32>, String, f64, f64, f64, f64);

/// The policy kinds a `Policy` holds (codecs are `Codec`s).
fn policy_kind(name: &str) -> PyResult<PolicyKind> {
    let name = name.replace('_', "-");
    [
        PolicyKind::Schedule,
        PolicyKind::BatchSize,
        PolicyKind::LabelSmoothing,
        PolicyKind::LayerRate,
        PolicyKind::Sync,
    ]
    .into_iter()
    .find(|k| k.to_string() == name)
    .ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown policy kind `{name}`: schedule, batch-size, label-smoothing, layer-rate or \
             sync"
        ))
    })
}

fn role(name: &str, tensor: &str) -> PyResult<Role> {
    match name {
        "weight" => Ok(Role::Weight),
        "bias" => Ok(Role::Bias),
        "batchnorm" | "batch-norm" => Ok(Role::BatchNorm),
        _ => Err(PyValueError::new_err(format!(
            "tensor {tensor}: unknown role `{name}` (weight, bias or batchnorm)"
        ))),
    }
}

impl Policy {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while locked cannot leave the clock half-updated (every update is one
        // assignment), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// The state the plugin sees this step: a batch-size plugin the configured batch, the
    /// others the batch of this step (`batch`, default the configured one).
    fn state(&self, batch: Option<u32>) -> State {
        match (self.plugin.kind(), batch) {
            (PolicyKind::BatchSize, _) | (_, None) => self.clock.state(),
            (_, Some(b)) => self.clock.state_with_batch(b),
        }
    }

    /// The plan already given for the step about to be taken.
    fn planned(&self) -> Option<Planned> {
        self.planned.filter(|p| p.state.step == self.clock.step())
    }

    /// An error unless the plugin is a sync plugin, for `what`.
    fn require_sync(&self, what: &str) -> PyResult<()> {
        match self.plugin.kind() {
            PolicyKind::Sync => Ok(()),
            kind => Err(PyValueError::new_err(format!(
                "plugin {}: a {kind} plugin has no {what}; only a sync plugin answers it",
                self.plugin.label()
            ))),
        }
    }
}

#[pymethods]
impl Policy {
    /// Loads `plugin` (a path, or a name looked up in `plugin_dirs()`), expecting `kind` when
    /// given, configures it with `settings` and starts its clock at step 0.
    #[new]
    #[pyo3(signature = (plugin, kind, settings, *, epochs, samples_per_epoch, global_batch,
        world_size=1, base_lr=0.1, reference_batch=256, fuel=None, deadline_ms=None,
        memory_mb=None, max_batch=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        plugin: &str,
        kind: Option<&str>,
        settings: Vec<(String, String)>,
        epochs: u32,
        samples_per_epoch: u64,
        global_batch: u32,
        world_size: u32,
        base_lr: f64,
        reference_batch: u32,
        fuel: Option<u64>,
        deadline_ms: Option<u64>,
        memory_mb: Option<usize>,
        max_batch: Option<u32>,
    ) -> PyResult<Self> {
        let expect = kind.map(policy_kind).transpose()?;
        let shape = RunShape {
            epochs,
            samples_per_epoch,
            initial_batch: global_batch,
            world_size,
            base_lr,
            reference_batch,
        };
        // Checked in lsgd-torch's words first: `Clock::new`'s own check names the host's flags.
        shape.check(&PYTHON).map_err(to_py)?;
        let clock = Clock::new(shape).map_err(to_py)?;
        let rt = runtime(Budget {
            fuel,
            codec_fuel_per_float: None,
            deadline_ms,
            memory_mb,
            canonical_codec_nans: false,
        })?;
        let plugin = load(py, &rt, plugin, expect, &settings)?;
        if plugin.kind() == PolicyKind::Codec {
            return Err(PyValueError::new_err(format!(
                "plugin {}: is a codec plugin; use lsgd_torch.CodecState for codecs",
                plugin.label()
            )));
        }
        Ok(Policy {
            inner: Mutex::new(Inner {
                plugin,
                clock,
                bounds: Bounds {
                    max_batch: max_batch.unwrap_or(Bounds::default().max_batch),
                },
                planned: None,
            }),
        })
    }

    /// `schedule`, `batch-size`, `label-smoothing`, `layer-rate` or `sync`.
    #[getter]
    fn kind(&self) -> String {
        self.lock().plugin.kind().to_string()
    }

    /// The plugin file as given.
    #[getter]
    fn label(&self) -> String {
        self.lock().plugin.label().to_string()
    }

    /// `describe()`'s name.
    #[getter]
    fn name(&self) -> String {
        self.lock().plugin.info().name.clone()
    }

    /// `describe()`'s version.
    #[getter]
    fn version(&self) -> String {
        self.lock().plugin.info().version.clone()
    }

    /// `describe()`'s summary.
    #[getter]
    fn summary(&self) -> String {
        self.lock().plugin.info().summary.clone()
    }

    /// The contract version the component implements, e.g. `0.3`.
    #[getter]
    fn contract(&self) -> String {
        self.lock().plugin.contract().version.to_string()
    }

    /// blake3 of the component bytes, hex: its identity.
    #[getter]
    fn blake3(&self) -> String {
        self.lock().plugin.facts().blake3.clone()
    }

    /// Whether the plugin keeps state between calls (and so has snapshots).
    #[getter]
    fn stateful(&self) -> bool {
        self.lock().plugin.stateful()
    }

    /// The parameters in force, as text: `[(name, value), …]`.
    #[getter]
    fn params(&self) -> Vec<(String, String)> {
        self.lock().plugin.rendered_params()
    }

    /// The line a checkpoint's identity check prints for this plugin.
    #[getter]
    fn identity(&self) -> String {
        self.lock().plugin.identity()
    }

    /// The fuel the last call used (deterministic), or None before any call.
    #[getter]
    fn last_fuel(&self) -> Option<u64> {
        self.lock().plugin.last_fuel()
    }

    /// The step about to be taken.
    #[getter]
    fn step(&self) -> u64 {
        self.lock().clock.step()
    }

    /// Training samples consumed so far.
    #[getter]
    fn samples_seen(&self) -> u64 {
        self.lock().clock.state().samples_seen
    }

    /// The loss the plugin sees as `last-loss`.
    #[getter]
    fn last_loss(&self) -> Option<f64> {
        self.lock().clock.state().last_loss
    }

    /// The metric the plugin sees as `last-metric`.
    #[getter]
    fn last_metric(&self) -> Option<f64> {
        self.lock().clock.state().last_metric
    }

    /// Whether every epoch's samples have been consumed.
    #[getter]
    fn finished(&self) -> bool {
        self.lock().clock.finished()
    }

    /// The `train-state` the plugin sees at this step (with the step's global batch `batch`),
    /// as a dict of the WIT record's fields.
    #[pyo3(signature = (batch=None))]
    fn state<'py>(&self, py: Python<'py>, batch: Option<u32>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.lock().state(batch);
        let d = PyDict::new(py);
        d.set_item("step", s.step)?;
        d.set_item("epoch", s.epoch)?;
        d.set_item("epoch_fraction", s.epoch_fraction)?;
        d.set_item("steps_per_epoch", s.steps_per_epoch)?;
        d.set_item("total_steps", s.total_steps)?;
        d.set_item("total_epochs", s.total_epochs)?;
        d.set_item("samples_seen", s.samples_seen)?;
        d.set_item("global_batch", s.global_batch)?;
        d.set_item("worker_batch", s.worker_batch)?;
        d.set_item("world_size", s.world_size)?;
        d.set_item("base_lr", s.base_lr)?;
        d.set_item("reference_batch", s.reference_batch)?;
        d.set_item("last_loss", s.last_loss)?;
        d.set_item("last_metric", s.last_metric)?;
        Ok(d)
    }

    /// The plugin's output at this step, range-checked as in training: a learning rate, a
    /// global batch or an epsilon (widened to float exactly). `batch` is the step's global
    /// batch when a batch-size policy chose another one (ignored by a batch-size plugin).
    #[pyo3(signature = (batch=None))]
    fn value(&self, batch: Option<u32>) -> PyResult<f64> {
        let mut g = self.lock();
        if g.plugin.kind() == PolicyKind::LayerRate {
            return Err(PyValueError::new_err(format!(
                "plugin {}: a layer-rate plugin answers multipliers(), not value()",
                g.plugin.label()
            )));
        }
        if g.plugin.kind() == PolicyKind::Sync {
            return Err(PyValueError::new_err(format!(
                "plugin {}: a sync plugin answers plan() and outer_step(), not value()",
                g.plugin.label()
            )));
        }
        let state = g.state(batch);
        let bounds = g.bounds;
        check_output(&mut g.plugin, &state, bounds)
            .map(|o| o.as_f64())
            .map_err(plugin_to_py)
    }

    /// A schedule's momentum at this step (contract 0.4; `None` where the plugin leaves the
    /// optimizer's momentum alone, as older contracts always do), range-checked as in training.
    /// The host asks it right after the rate of the same step; so does `WasmLR`.
    #[pyo3(signature = (batch=None))]
    fn momentum(&self, batch: Option<u32>) -> PyResult<Option<f64>> {
        let mut g = self.lock();
        if g.plugin.kind() != PolicyKind::Schedule {
            return Err(PyValueError::new_err(format!(
                "plugin {}: only a schedule plugin answers momentum()",
                g.plugin.label()
            )));
        }
        let state = g.state(batch);
        check_momentum(&mut g.plugin, &state).map_err(plugin_to_py)
    }

    /// A layer-rate plugin's multiplier for each tensor at this step, checked (one per
    /// tensor, finite, >= 0). Each tensor is `(name, shape, role, weight_norm, grad_norm,
    /// update_norm, weight_decay)`, role `weight`, `bias` or `batchnorm`.
    #[pyo3(signature = (tensors, batch=None))]
    fn multipliers(&self, tensors: Vec<TensorArg>, batch: Option<u32>) -> PyResult<Vec<f64>> {
        let tensors = tensors
            .into_iter()
            .map(|(name, shape, r, w, g, u, wd)| {
                Ok(TensorNorms {
                    role: role(&r, &name)?,
                    name,
                    shape,
                    weight_norm: w,
                    grad_norm: g,
                    update_norm: u,
                    weight_decay: wd,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let mut g = self.lock();
        if g.plugin.kind() != PolicyKind::LayerRate {
            return Err(PyValueError::new_err(format!(
                "plugin {}: a {} plugin has no multipliers()",
                g.plugin.label(),
                g.plugin.kind()
            )));
        }
        let state = g.state(batch);
        check_multipliers(&mut g.plugin, &state, &tensors).map_err(plugin_to_py)
    }

    /// Ends the current step, which consumed `batch` samples (the global batch) and reached
    /// `loss` (None keeps the previous `last-loss`). For a sync plugin the step must have been
    /// planned (`plan()`): the clock's window moves on by its kind, and the loss of a `local`
    /// step is dropped (the ranks agree on losses only where they agree on weights), as in
    /// training and `trace`.
    #[pyo3(signature = (batch, loss=None))]
    fn advance(&self, batch: u32, loss: Option<f64>) -> PyResult<()> {
        if batch == 0 {
            return Err(PyValueError::new_err("a step consumes at least one sample"));
        }
        let mut g = self.lock();
        if g.plugin.kind() != PolicyKind::Sync {
            g.clock.advance(batch, loss);
            return Ok(());
        }
        let planned = g.planned().ok_or_else(|| {
            PyValueError::new_err(format!(
                "plugin {}: step {} ends before its plan() was asked",
                g.plugin.label(),
                g.clock.step()
            ))
        })?;
        g.clock
            .advance(batch, loss.filter(|_| planned.kind.agrees()));
        g.clock.pass(planned.kind);
        g.planned = None;
        Ok(())
    }

    /// A sync plugin's plan for the step about to be taken (`synchronous`, `local` or
    /// `average`) at the clock's window, checked and with the final-step rule applied by the
    /// runtime (`check_plan`); asked of the plugin once per step, later calls at the same step
    /// answer the same. `batch` as for `value`.
    #[pyo3(signature = (batch=None))]
    fn plan(&self, batch: Option<u32>) -> PyResult<&'static str> {
        let mut g = self.lock();
        g.require_sync("plan()")?;
        if let Some(p) = g.planned() {
            return Ok(p.kind.name());
        }
        let state = g.state(batch);
        let window = g.clock.window();
        let kind = check_plan(&mut g.plugin, &state, &window).map_err(plugin_to_py)?;
        g.planned = Some(Planned {
            state,
            window,
            kind,
        });
        Ok(kind.name())
    }

    /// Where the run stands in the sync plugin's windows before the step about to be taken:
    /// `(local_steps, windows)`, what `plan` sees.
    #[getter]
    fn window(&self) -> (u32, u64) {
        let w = self.lock().clock.window();
        (w.local_steps, w.windows)
    }

    /// The outer step of the window this step ends (its plan `average`), for the drift of
    /// `tensors`, each `(name, shape, role, weight_norm, delta_norm, rank_delta_norm,
    /// momentum_norm, delta_dot_momentum)`, role `weight`, `bias` or `batchnorm`; asked with
    /// the state and window the plan saw and checked by the runtime (`check_outer_step`: lr
    /// finite and >= 0, momentum in [0, 1), `lr_scale` empty or one finite value >= 0 per
    /// tensor). Returns `(lr, momentum, nesterov, lr_scale)`.
    fn outer_step(&self, tensors: Vec<DriftArg>) -> PyResult<(f64, f64, bool, Vec<f64>)> {
        let tensors = tensors
            .into_iter()
            .map(|(name, shape, r, w, d, rd, m, dm)| {
                Ok(TensorDrift {
                    role: role(&r, &name)?,
                    name,
                    shape,
                    weight_norm: w,
                    delta_norm: d,
                    rank_delta_norm: rd,
                    momentum_norm: m,
                    delta_dot_momentum: dm,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let mut g = self.lock();
        g.require_sync("outer_step()")?;
        let step = g.clock.step();
        let planned = g.planned().ok_or_else(|| {
            PyValueError::new_err(format!(
                "plugin {}: outer_step() at step {step} before its plan()",
                g.plugin.label()
            ))
        })?;
        if planned.kind != StepKind::Average {
            return Err(PyValueError::new_err(format!(
                "plugin {}: step {step} was planned `{}`; outer_step() belongs to an `average` \
                 step",
                g.plugin.label(),
                planned.kind.name()
            )));
        }
        let o = check_outer_step(&mut g.plugin, &planned.state, &planned.window, &tensors)
            .map_err(plugin_to_py)?;
        Ok((o.lr, o.momentum, o.nesterov, o.lr_scale))
    }

    /// Sets `last-metric` (an evaluation result) from the next call on.
    fn set_metric(&self, metric: f64) {
        self.lock().clock.set_metric(metric);
    }

    /// Moves the clock to `step` with `samples_seen` consumed and the given feedback, and a
    /// sync plugin's clock to `window` (`(local_steps, windows)`, default the first window's
    /// start): a resume.
    #[pyo3(signature = (step, samples_seen, last_loss=None, last_metric=None, window=None))]
    fn seek(
        &self,
        step: u64,
        samples_seen: u64,
        last_loss: Option<f64>,
        last_metric: Option<f64>,
        window: Option<(u32, u64)>,
    ) {
        let mut g = self.lock();
        let shape = *g.clock.shape();
        g.clock = Clock::resume(shape, step, samples_seen, last_loss, last_metric);
        if let Some((local_steps, windows)) = window {
            g.clock.set_window(Window {
                local_steps,
                windows,
            });
        }
        g.planned = None;
    }

    /// A stateful plugin's state as of the start of the current step (before its calls at
    /// it), or None for a plugin without state.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let mut g = self.lock();
        let step = g.clock.step();
        let bytes = g.plugin.state_at(step).map_err(plugin_to_py)?;
        Ok(bytes.map(|b| PyBytes::new(py, &b)))
    }

    /// Puts a stateful plugin into the state `bytes` (from `snapshot`) for its calls from
    /// `step` on.
    fn restore(&self, step: u64, bytes: Vec<u8>) -> PyResult<()> {
        let mut g = self.lock();
        // A plan given before the restore came from the state being replaced.
        g.planned = None;
        g.plugin.restore(step, bytes).map_err(plugin_to_py)
    }
}
