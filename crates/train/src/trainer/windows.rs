//! Synchronising less (a sync policy, `--sync`, contract 0.5): the ranks take local steps,
//! each on its own shard with its own optimizer state, and at the end of a window average their
//! pseudo-gradients Δ_k = θ_global − θ_k and take an outer step on θ_global, the weights they
//! last agreed on (local SGD, Federated Averaging, DiLoCo).
//!
//! Inside a window a rank makes no collective call: the policies see the same inputs on every
//! rank and decide alike without agreeing, the loss of each local step stays this rank's until
//! the window's end gathers them (the metrics records of a window are written then, with the
//! mean loss over the global batch), and the evaluation after an epoch waits for the window's
//! end, the first moment the ranks hold one model. At the end the pseudo-gradients go through
//! the run's gradient exchange (its all-reduce, or its codec with error feedback and codec
//! state): θ_global's tensors are leaves whose `.grad` carries Δ_k / k, laid out in the same
//! buckets as the gradients. The outer step is `torch.optim.SGD`'s with dampening 0, its
//! coefficients the plugin's `outer-step`.
//!
//! A checkpoint holds what a resume needs to go on bit for bit: the outer momentum, every
//! rank's own weights, buffers and optimizer state (rank 0's in the usual places, rank r's
//! under `sync.rank{r}.`: a window averages the weights only, so the optimizer state stays
//! each rank's own), and inside a window θ_global.

use std::io::Cursor;

use lsgd_collective::Traffic;
use lsgd_policy::{OuterStep, StepKind, TensorDrift, Window};
use lsgd_runtime::policy::Decision;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::{MODEL, Trainer};
use crate::exchange::Exchanged;
use crate::metrics::{Record, StepRecord};
use crate::optim::{Param, l2};
use crate::{Error, Result};

/// Prefix of θ_global's tensors in a checkpoint taken inside a window.
const GLOBAL: &str = "sync.global.";
/// Prefix of the outer momentum buffers in a checkpoint.
const MOMENTUM: &str = "sync.momentum.";

/// The prefix of rank `r`'s own state in a checkpoint taken inside a window (r >= 1).
fn rank_prefix(r: usize) -> String {
    format!("sync.rank{r}.")
}

/// Where a checkpoint stands in the sync policy's windows.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowMeta {
    /// Local steps taken since the ranks last agreed on the weights.
    pub local_steps: u32,
    /// Windows ended so far.
    pub windows: u64,
    /// The ranks whose own weights, buffers and optimizer state the checkpoint holds (the
    /// run's ranks).
    pub ranks: usize,
}

/// What a checkpoint adds for a sync policy: its tensors, and where the windows stand.
pub(super) type WindowCheckpoint = (Vec<(String, Tensor)>, Option<WindowMeta>);

/// The weights and optimizer state before an `average` step's update.
pub(super) struct Rollback {
    weights: Vec<Tensor>,
    state: Vec<(String, Tensor)>,
    last_lr: Option<f64>,
}

/// A local step whose metrics record waits for the window's end.
struct Held {
    record: StepRecord,
    /// This rank's sum of per-sample losses of the step.
    loss_sum: f64,
}

/// What a sync policy's run keeps beside the model: θ_global, the outer momentum and the
/// window's records not yet written.
pub(super) struct Windows {
    /// θ_global, one leaf per trainable tensor in the optimizer's order; its `.grad` carries
    /// the pseudo-gradient through the exchange.
    global: Vec<Tensor>,
    /// The outer momentum buffer per tensor, created at the first outer step with momentum
    /// (as torch's SGD creates its buffer).
    momentum: Vec<Option<Tensor>>,
    held: Vec<Held>,
    /// The last outer step taken, for the consistency check.
    last: Option<OuterStep>,
    /// True while a window's end makes its collective calls, so that faults are agreed.
    pub(super) averaging: bool,
}

impl Windows {
    /// θ_global as the weights are now, with no momentum yet.
    pub(super) fn new(params: &[Param]) -> Result<Self> {
        let global = params
            .iter()
            .map(|p| leaf_with_grad(&p.tensor))
            .collect::<Result<Vec<_>>>()?;
        Ok(Windows {
            momentum: global.iter().map(|_| None).collect(),
            global,
            held: Vec::new(),
            last: None,
            averaging: false,
        })
    }

    /// θ_global becomes the weights as they are now (after a synchronous step, or a resume at
    /// a window's end).
    pub(super) fn follow(&mut self, params: &[Param]) {
        let _guard = tch::no_grad_guard();
        for (g, p) in self.global.iter().zip(params) {
            g.shallow_clone().copy_(&p.tensor);
        }
    }

    /// The outer momentum buffers, for the consistency check.
    pub(super) fn momentum(&self) -> impl Iterator<Item = &Tensor> {
        self.momentum.iter().flatten()
    }

    /// The last outer step this process took, for the consistency check.
    pub(super) fn last_outer(&self) -> Option<&OuterStep> {
        self.last.as_ref()
    }
}

/// A copy of `t` that is a leaf of autograd with a zero gradient, so that the exchange finds a
/// gradient to sum.
fn leaf_with_grad(t: &Tensor) -> Result<Tensor> {
    let leaf = t.detach().copy().set_requires_grad(true);
    (&leaf * 0.0)
        .sum(Kind::Float)
        .f_backward()
        .map_err(|e| Error::Config(format!("cannot set up θ_global: {e}")))?;
    Ok(leaf)
}

/// The little-endian bytes of `values`.
fn f64_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `bytes` as little-endian f64s.
fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

impl Trainer<'_> {
    /// Whether the ranks hold the same weights now: always without a sync policy; with one,
    /// outside a window (and while a window's end makes its collective calls).
    pub(super) fn in_agreement(&self) -> bool {
        self.clock.window().local_steps == 0 || self.windows.as_ref().is_some_and(|w| w.averaging)
    }

    /// Holds a local step's record until its window ends.
    pub(super) fn hold(&mut self, record: StepRecord, loss_sum: f64) {
        if let Some(w) = &mut self.windows {
            w.held.push(Held { record, loss_sum });
        }
    }

    /// What an `average` step must be able to put back if its window's end faults after the
    /// local update (the codec, the plugin's outer step): every fault stops with the state
    /// before its step. `None` for other steps.
    pub(super) fn rollback_point(&self, d: &Decision) -> Option<Rollback> {
        if d.plan != Some(StepKind::Average) || self.windows.is_none() {
            return None;
        }
        let _guard = tch::no_grad_guard();
        Some(Rollback {
            weights: self.opt.params().iter().map(|p| p.tensor.copy()).collect(),
            state: self
                .opt
                .state()
                .into_iter()
                .map(|(n, t)| (n, t.copy()))
                .collect(),
            last_lr: self.opt.last_lr(),
        })
    }

    /// Puts `before` back: the weights and optimizer state before the step's update.
    fn roll_back(&mut self, before: Rollback) {
        {
            let _guard = tch::no_grad_guard();
            for (p, w) in self.opt.params().iter().zip(&before.weights) {
                p.tensor.shallow_clone().copy_(w);
            }
        }
        // The state was taken from this optimizer a moment ago, so it has every name.
        let _ = self.opt.load_state(&before.state, before.last_lr);
        self.gradients.rollback();
    }

    /// After the update of a step a sync policy planned: a synchronous step's weights become
    /// θ_global; an `average` step ends its window (its losses agreed, the pseudo-gradients
    /// averaged, the outer step taken, every rank set to the new θ_global; `before` is its
    /// [`Trainer::rollback_point`]). Returns, for a window's end, the mean loss of the step and
    /// what it moved.
    pub(super) fn after_update(
        &mut self,
        d: &Decision,
        loss_sum: f64,
        global_batch: usize,
        before: Option<Rollback>,
    ) -> Result<Option<(f64, Exchanged)>> {
        let (Some(plan), Some(windows)) = (d.plan, self.windows.as_mut()) else {
            return Ok(None);
        };
        match (plan, before) {
            (StepKind::Synchronous, _) => {
                windows.follow(self.opt.params());
                Ok(None)
            }
            (StepKind::Average, Some(before)) => {
                windows.averaging = true;
                let ended = self.end_window(d, loss_sum, global_batch, before);
                if let Some(w) = &mut self.windows {
                    w.averaging = false;
                }
                ended.map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The end of a window at the step `d` planned: the losses of its steps agreed and their
    /// records written, Δ averaged through the exchange, the plugin's outer step applied. A
    /// codec or plugin fault puts `before` back and stops.
    fn end_window(
        &mut self,
        d: &Decision,
        loss_sum: f64,
        global_batch: usize,
        before: Rollback,
    ) -> Result<(f64, Exchanged)> {
        let step = d.state.step;
        // One gather agrees the window's losses (the held steps' and this one's) and the
        // ranks' ‖Δ_k‖² per tensor.
        let mut mine = self.held_sums();
        mine.push(loss_sum);
        let steps = mine.len();
        mine.extend(self.load_pseudo_gradients()?);
        let (sums, traffic) = self.gathered_sums(&mine)?;
        let (losses, rank_sq) = sums.split_at(steps);
        self.write_held(losses)?;
        let mean = losses[steps - 1] / global_batch as f64;
        let codec = self.policies.codec_mut();
        let has_codec = codec.is_some();
        let windows = self.windows.as_ref().expect("a sync policy's run");
        let global: Vec<&Tensor> = windows.global.iter().collect();
        let mut exchanged = match self.gradients.exchange(self.world, codec, &global, step) {
            Ok(exchanged) => exchanged,
            Err(fault) if has_codec => {
                self.roll_back(before);
                return Err(self.stop(fault));
            }
            Err(e) => return Err(e),
        };
        exchanged.traffic += traffic;
        let means = self.averaged(has_codec);
        let drifts = self.drifts(rank_sq);
        let outer = self
            .policies
            .outer_step(&d.state, &d.window, &drifts)
            .map(|o| o.unwrap_or_else(OuterStep::average))
            .map_err(Error::from);
        let outer = self.agreed_then("sync policy", outer, |t| t.roll_back(before))?;
        self.outer(&outer, means);
        Ok((mean, exchanged))
    }

    /// Puts into θ_global's `.grad` what the exchange sums into the mean over the k ranks:
    /// with a codec Δ_k / k (Δ_k = θ_global − θ_k: a codec compresses the drift, never the
    /// weights), without one θ_k / k, as PyTorch's `average_parameters` does, so that plain
    /// averaging gives the ranks' mean exactly; returns ‖Δ_k‖² per tensor.
    fn load_pseudo_gradients(&mut self) -> Result<Vec<f64>> {
        let codec = self.policies.codec_mut().is_some();
        let windows = self.windows.as_ref().expect("a sync policy's run");
        let k = self.world.size() as f64;
        let _guard = tch::no_grad_guard();
        let mut squares = Vec::with_capacity(windows.global.len());
        for (g, p) in windows.global.iter().zip(self.opt.params()) {
            let delta = g - &p.tensor;
            squares.push(l2(&delta).powi(2));
            let carried = if codec { delta } else { p.tensor.detach() };
            g.grad().copy_(&(carried / k));
        }
        Ok(squares)
    }

    /// After the exchange: θ_global's `.grad` becomes the averaged Δ; returns the ranks' mean
    /// weights where the exchange summed them (no codec), for plain averaging to take exactly.
    fn averaged(&self, has_codec: bool) -> Option<Vec<Tensor>> {
        if has_codec {
            return None;
        }
        let windows = self.windows.as_ref().expect("a sync policy's run");
        let _guard = tch::no_grad_guard();
        let means = windows
            .global
            .iter()
            .map(|g| {
                let mean = g.grad().copy();
                g.grad().copy_(&(g - &mean));
                mean
            })
            .collect();
        Some(means)
    }

    /// Each tensor's drift as the plugin sees it: `rank_sq` is Σ_k ‖Δ_k‖² per tensor, and
    /// θ_global's `.grad` holds the averaged Δ.
    fn drifts(&self, rank_sq: &[f64]) -> Vec<TensorDrift> {
        let windows = self.windows.as_ref().expect("a sync policy's run");
        let k = self.world.size() as f64;
        let _guard = tch::no_grad_guard();
        self.tensors
            .iter()
            .zip(&windows.global)
            .zip(&windows.momentum)
            .zip(rank_sq)
            .map(|((((name, shape, role), g), m), sq)| {
                let delta = g.grad();
                let (momentum_norm, dot) = match m {
                    Some(m) => (
                        l2(m),
                        delta
                            .to_kind(Kind::Double)
                            .flatten(0, -1)
                            .dot(&m.to_kind(Kind::Double).flatten(0, -1))
                            .double_value(&[]),
                    ),
                    None => (0.0, 0.0),
                };
                TensorDrift {
                    name: name.clone(),
                    shape: shape.clone(),
                    role: *role,
                    weight_norm: l2(g),
                    delta_norm: l2(&delta),
                    rank_delta_norm: (sq / k).sqrt(),
                    momentum_norm,
                    delta_dot_momentum: dot,
                }
            })
            .collect()
    }

    /// Applies `outer` to θ_global (torch's SGD with dampening 0: the buffer is created as Δ at
    /// the first step with momentum, then `m = μ·m + Δ`) and sets every rank's weights to it.
    /// Plain averaging (LR 1, no momentum, no scales) takes the ranks' `means` where the
    /// exchange summed the weights themselves.
    fn outer(&mut self, outer: &OuterStep, means: Option<Vec<Tensor>>) {
        let windows = self.windows.as_mut().expect("a sync policy's run");
        windows.last = Some(outer.clone());
        let _guard = tch::no_grad_guard();
        let plain =
            outer.lr == 1.0 && outer.momentum == 0.0 && outer.lr_scale.iter().all(|&s| s == 1.0);
        if let (true, Some(means)) = (plain, means) {
            for ((g, p), mean) in windows.global.iter().zip(self.opt.params()).zip(means) {
                g.shallow_clone().copy_(&mean);
                p.tensor.shallow_clone().copy_(&mean);
            }
            return;
        }
        for (i, (g, p)) in windows.global.iter().zip(self.opt.params()).enumerate() {
            let delta = g.grad();
            let direction = if outer.momentum == 0.0 {
                delta
            } else {
                let m = match &windows.momentum[i] {
                    Some(m) => {
                        let _ = m
                            .shallow_clone()
                            .g_mul_scalar_(outer.momentum)
                            .g_add_(&delta);
                        m.shallow_clone()
                    }
                    None => {
                        let m = delta.copy();
                        windows.momentum[i] = Some(m.shallow_clone());
                        m
                    }
                };
                if outer.nesterov {
                    &delta + m * outer.momentum
                } else {
                    m
                }
            };
            let rate = outer.lr * outer.lr_scale.get(i).copied().unwrap_or(1.0);
            let _ = g.shallow_clone().g_sub_(&(direction * rate));
            p.tensor.shallow_clone().copy_(g);
        }
    }

    /// This rank's loss sums of the held steps.
    fn held_sums(&self) -> Vec<f64> {
        self.windows
            .as_ref()
            .map(|w| w.held.iter().map(|h| h.loss_sum).collect())
            .unwrap_or_default()
    }

    /// Each of `sums` summed over the ranks in rank order (the same bits on every rank).
    fn gathered_sums(&mut self, sums: &[f64]) -> Result<(Vec<f64>, Traffic)> {
        let (all, traffic) = self.world.all_gather_bytes(&f64_bytes(sums))?;
        let mut total = vec![0.0f64; sums.len()];
        for bytes in &all {
            for (t, v) in total.iter_mut().zip(f64s(bytes)) {
                *t += v;
            }
        }
        Ok((total, traffic))
    }

    /// Writes the held records with the losses the ranks agreed on (`sums`, one per held step
    /// and possibly more), stopping with a divergence at the first non-finite one.
    fn write_held(&mut self, sums: &[f64]) -> Result<()> {
        let held = match &mut self.windows {
            Some(w) => std::mem::take(&mut w.held),
            None => return Ok(()),
        };
        for (h, sum) in held.into_iter().zip(sums) {
            let mut record = h.record;
            record.loss = sum / f64::from(record.global_batch);
            if !record.loss.is_finite() {
                self.metrics.flush()?;
                self.progress.finish();
                return Err(Error::Diverged {
                    step: record.step,
                    loss: record.loss,
                    lr: record.lr,
                    batch: record.global_batch as usize,
                    checkpoint: self.last_checkpoint.clone(),
                });
            }
            self.metrics.write(&Record::Step(record))?;
        }
        Ok(())
    }

    /// What a checkpoint adds for a sync policy, taken on every rank (a collective on several:
    /// every rank's own state goes to rank 0, and inside a window the held records are agreed
    /// and written): the tensors and where the windows stand. Nothing without a sync policy.
    pub(super) fn window_checkpoint(&mut self) -> Result<WindowCheckpoint> {
        let Some(windows) = &self.windows else {
            return Ok((Vec::new(), None));
        };
        let window = self.clock.window();
        let mut tensors: Vec<(String, Tensor)> = self
            .opt
            .params()
            .iter()
            .zip(&windows.momentum)
            .filter_map(|(p, m)| Some((format!("{MOMENTUM}{}", p.name), m.as_ref()?.copy())))
            .collect();
        let mut meta = WindowMeta {
            local_steps: window.local_steps,
            windows: window.windows,
            ranks: 1,
        };
        if window.local_steps > 0 {
            for (p, g) in self.opt.params().iter().zip(&windows.global) {
                tensors.push((format!("{GLOBAL}{}", p.name), g.detach().copy()));
            }
            let sums = self.held_sums();
            let (agreed, _) = self.gathered_sums(&sums)?;
            self.write_held(&agreed)?;
        }
        if self.world.size() == 1 {
            return Ok((tensors, Some(meta)));
        }
        // Each rank's optimizer state is its own from its first local step on, at a window's
        // end too (a window averages the weights only), and so are its BatchNorm statistics.
        let own = self.own_state()?;
        let (all, _) = self.world.all_gather_bytes(&own)?;
        for (r, bytes) in all.iter().enumerate().skip(1) {
            let named = Tensor::load_multi_from_stream(Cursor::new(bytes))
                .map_err(|e| Error::Checkpoint(format!("rank {r}'s own state: {e}")))?;
            let prefix = rank_prefix(r);
            tensors.extend(named.into_iter().map(|(n, t)| (format!("{prefix}{n}"), t)));
        }
        meta.ranks = all.len();
        Ok((tensors, Some(meta)))
    }

    /// This rank's weights, buffers and optimizer state as checkpoints name them, serialised
    /// (empty on rank 0, whose state goes into the checkpoint as usual).
    fn own_state(&self) -> Result<Vec<u8>> {
        if self.world.is_root() {
            return Ok(Vec::new());
        }
        let mut named: Vec<(String, Tensor)> = self
            .vs
            .variables()
            .into_iter()
            .map(|(n, t)| (format!("{MODEL}{n}"), t))
            .collect();
        named.extend(self.opt.state());
        let mut bytes = Vec::new();
        Tensor::save_multi_to_stream(&named, &mut bytes)
            .map_err(|e| Error::Checkpoint(format!("cannot serialise this rank's state: {e}")))?;
        Ok(bytes)
    }

    /// Puts back what [`Trainer::window_checkpoint`] saved, after rank 0's weights and
    /// optimizer state were restored: the window's position, the outer momentum, inside a
    /// window θ_global, and on as many ranks as saved it this rank's own weights, buffers and
    /// optimizer state. A window cannot continue on another number of ranks (each rank's
    /// weights are its own); at a window's end every rank then takes rank 0's state.
    pub(super) fn restore_windows(
        &mut self,
        meta: Option<WindowMeta>,
        tensors: &[(String, Tensor)],
        last_lr: Option<f64>,
        path: &std::path::Path,
    ) -> Result<()> {
        let Some(windows) = &mut self.windows else {
            return match meta.filter(|m| m.local_steps > 0 && m.ranks > 1) {
                Some(m) => Err(Error::Checkpoint(format!(
                    "{} was written {} local step(s) into a sync window, where each of its {} \
                     ranks holds weights of its own; continue it with a sync policy (--sync), \
                     or from a checkpoint at a window's end",
                    path.display(),
                    m.local_steps,
                    m.ranks
                ))),
                None => Ok(()),
            };
        };
        let Some(meta) = meta else {
            // A checkpoint from before the sync policy (`--allow-policy-change`): its weights
            // are every rank's, and the first window starts here.
            windows.follow(self.opt.params());
            return Ok(());
        };
        self.clock.set_window(Window {
            local_steps: meta.local_steps,
            windows: meta.windows,
        });
        let _guard = tch::no_grad_guard();
        let find = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        for ((p, m), g) in self
            .opt
            .params()
            .iter()
            .zip(windows.momentum.iter_mut())
            .zip(&windows.global)
        {
            *m = find(&format!("{MOMENTUM}{}", p.name)).map(|t| t.to_kind(Kind::Float).copy());
            if meta.local_steps > 0 {
                let saved = find(&format!("{GLOBAL}{}", p.name)).ok_or_else(|| {
                    Error::Checkpoint(format!(
                        "{} is inside a sync window but has no θ_global for {}",
                        path.display(),
                        p.name
                    ))
                })?;
                g.shallow_clone().copy_(saved);
            } else {
                g.shallow_clone().copy_(&p.tensor);
            }
        }
        if meta.ranks != self.world.size() && meta.local_steps > 0 {
            return Err(Error::Checkpoint(format!(
                "{} was written {} local step(s) into a sync window on {} rank(s), each with \
                 weights of its own; resume it on {} ranks, or from a checkpoint at a window's \
                 end",
                path.display(),
                meta.local_steps,
                meta.ranks,
                meta.ranks
            )));
        }
        // On another number of ranks at a window's end every rank goes on from rank 0's
        // optimizer state, as after a synchronous run's resume.
        let rank = self.world.rank();
        if rank == 0 || meta.ranks != self.world.size() {
            return Ok(());
        }
        let prefix = rank_prefix(rank);
        let own: Vec<(String, Tensor)> = tensors
            .iter()
            .filter_map(|(n, t)| Some((n.strip_prefix(&prefix)?.to_string(), t.shallow_clone())))
            .collect();
        super::resume::restore_model(&self.vs, &own)?;
        self.opt.load_state(&own, last_lr)
    }
}
