//! The [`Trainer`]: one run on one rank, its step cut into the phases the papers write:
//!
//! 1. [`decide`](Trainer::decide): the policies give the global batch, the LR and ε;
//! 2. [`batch`](Trainer::batch): the next global batch of the sample stream, this rank's shard
//!    of it, and its micro-batches;
//! 3. [`forward_backward`](Trainer::forward_backward): one pass per micro-batch (the forward
//!    under autocast with `--precision bf16|fp16`), gradients accumulated and pre-divided by
//!    the global batch, and with fp16 unscaled and checked for overflow;
//! 4. [`agree`](Trainer::agree) and [`exchange`](Trainer::exchange): the ranks agree on the
//!    mean loss and on whether any rank's fp16 gradients overflowed (then the step is skipped
//!    everywhere), and the gradients are summed over the ranks (plain or through a codec);
//! 5. [`layer_rates`](Trainer::layer_rates) and [`update`](Trainer::update): a layer-wise rate
//!    policy's multiplier per tensor (LARS, LAMB), then the optimizer's step;
//! 6. [`observe`](Trainer::observe): metrics, the evaluation at each epoch's end, the
//!    cross-rank consistency check and the periodic checkpoint.
//!
//! Beside the phases: `start` (trainer/start.rs) sets a run up ([`Trainer::new`]) and opens it;
//! `stop` (trainer/stop.rs) ends it, after the last step or on a fault:
//! [`save`](Trainer::save) writes a checkpoint, and [`stop`](Trainer::stop) is the one way out
//! on a plugin fault, agreed between the ranks, which saves the state before the failed step
//! and names the fault. `resume` continues a checkpoint, and `identity` is what a checkpoint
//! records of each plugin.
//!
//! With `--overlap` (the default where the settings allow) phases 3 and 4 run together: the
//! exchange moves each bucket while the backward pass computes the rest (trainer/overlap.rs).
//!
//! [`asynchronous`] is the other loop (`--mode async`): the same phases split between a
//! parameter server (decide, update, observe) and workers (forward and backward).

use std::path::PathBuf;
use std::time::Instant;

use lsgd_collective::{Algorithm, Traffic, World};
use lsgd_policy::{Role, StepKind, TensorNorms};
use lsgd_runtime::plugin::PolicyKind;
use lsgd_runtime::policy::{Clock, Decision, PolicySet};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

mod asynchronous;
mod identity;
mod overlap;
mod resume;
mod start;
mod stop;
mod survive;
mod windows;

pub use start::Start;
pub use windows::WindowMeta;

use crate::checkpoint::PluginRecord;
use crate::config::{Mode, TrainConfig};
use crate::eval::{self, Evaluation};
use crate::exchange::{Exchanged, GradientExchange};
use crate::metrics::{EvalRecord, MetricsWriter, Record, StepRecord};
use crate::model::Model;
use crate::optim::{LrScale, Optimizer};
use crate::order::{SampleOrder, micro_batches};
use crate::precision::{Autocast, LossScaler};
use crate::progress::Progress;
use crate::tensors::DataTensors;
use crate::{Error, Result, Summary, loss, parallel};

/// Prefix of model variables in checkpoints.
const MODEL: &str = "model.";

/// This rank's part of one step's global batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Sample indices of this rank's shard, in order.
    pub indices: Vec<i64>,
    /// The sizes of the shard's micro-batches.
    pub micro: Vec<usize>,
    /// The global batch.
    pub global: usize,
    /// The samples the loss is a mean over: the global batch when the gradients are summed
    /// over the ranks (pre-divided by the world size), this rank's shard in a sync policy's
    /// local step, whose gradient is its own.
    pub mean_over: usize,
    /// Stream position of the shard's first sample (samples drawn before it in the run): the
    /// augmentation of each sample derives from its position.
    pub first: u64,
}

/// What a step produced, for [`Trainer::observe`].
pub struct Stepped {
    /// The policies' decision.
    pub decision: Decision,
    /// The layer-rate policy's multiplier per tensor (empty without one).
    pub scales: Vec<f64>,
    /// The batch it trained on.
    pub batch: Batch,
    /// The mean loss over the global batch (equal on every rank); NaN for a sync policy's
    /// local step until its window's end agrees it.
    pub loss: f64,
    /// With a sync policy, in a local or `average` step: this rank's sum of per-sample losses,
    /// which the window's end gathers.
    pub own_loss_sum: Option<f64>,
    /// The fp16 loss scale of the step's backward pass (`None` unless fp16).
    pub loss_scale: Option<f64>,
    /// `--mode async`: the worker whose gradient was applied and its staleness in steps.
    pub applied: Option<(u32, u64)>,
    /// The gradients overflowed in fp16 on some rank: no exchange, no update.
    pub skipped: bool,
    /// What the exchange moved (the loss's all-reduce included).
    pub exchanged: Exchanged,
    /// When the step began.
    pub started: Instant,
    /// Seconds in the policies.
    pub policy_s: f64,
    /// Seconds in forward, backward and update.
    pub compute_s: f64,
    /// Seconds of communication the step waited for (all of it unless it overlapped).
    pub exposed_s: f64,
    /// Of `compute_s`, the seconds of the last micro-batch's backward pass.
    pub backward_s: f64,
}

/// What phase 3 produced on this rank.
pub struct Pass {
    /// The sum of this rank's per-sample losses.
    pub loss_sum: Tensor,
    /// fp16: whether the unscaled gradients hold an inf or NaN.
    pub overflow: bool,
    /// Seconds of the last micro-batch's backward pass.
    pub backward_s: f64,
}

/// One training run on this rank of a world.
pub struct Trainer<'w> {
    world: &'w mut World,
    config: TrainConfig,
    policies: PolicySet,
    data: DataTensors,
    device: Device,
    vs: VarStore,
    model: Model,
    opt: Box<dyn Optimizer>,
    gradients: GradientExchange,
    /// The kind the forward pass autocasts to (`None`: fp32).
    autocast: Option<Kind>,
    /// fp16's dynamic loss scaling.
    scaler: Option<LossScaler>,
    clock: Clock,
    order: SampleOrder,
    metrics: Metrics,
    progress: Progress,
    plugins: Vec<PluginRecord>,
    epochs_evaluated: u32,
    /// Since the first step of this process.
    started: Instant,
    /// Samples trained on by this process.
    samples: u64,
    last_eval: Option<Evaluation>,
    /// The last step's decision and layer-rate multipliers, for the final consistency check.
    last_decision: Option<(Decision, Vec<f64>)>,
    /// `--mode async` on the server: how many applied gradients had each staleness.
    staleness: std::collections::BTreeMap<u64, u64>,
    /// Each trainable tensor's name, shape and role, in the optimizer's order: what a
    /// layer-rate policy is told besides the norms.
    tensors: Vec<(String, Vec<u32>, Role)>,
    /// The newest checkpoint of this run (written, or resumed from) and its step: what a
    /// divergence points to.
    last_checkpoint: Option<(PathBuf, u64)>,
    /// What `--fault-tolerance` keeps between the attempts of a step.
    survival: survive::Survival,
    /// The gradient-ready hooks, when the step overlaps its exchange with the backward pass.
    overlap: Option<overlap::Overlap>,
    /// θ_global and the outer momentum, with a sync policy (`--sync`).
    windows: Option<windows::Windows>,
}

impl Trainer<'_> {
    /// Trains to the end of the run (or `--stop-after-steps`), then checks the ranks agree and
    /// saves the final checkpoint.
    pub fn run(mut self) -> Result<Summary> {
        if self.config.run.mode == Mode::Async {
            return self.run_async();
        }
        self.announce();
        self.started = Instant::now();
        let stop_at = self.config.invocation.stop_after_steps.unwrap_or(u64::MAX);
        while !self.clock.finished() && self.clock.step() < stop_at {
            self.step()?;
        }
        self.finish()
    }

    /// One synchronous step: every phase in order. A step whose fp16 gradients overflowed
    /// stops after the agreement: no exchange and no update, the scale halved. With
    /// `--fault-tolerance` the ranks first agree that nothing before the update lost a rank
    /// (trainer/survive.rs).
    pub fn step(&mut self) -> Result<()> {
        if self.world.is_tolerant() {
            return self.step_surviving();
        }
        let attempt = self.attempt()?;
        self.commit(attempt)
    }

    /// Phases 1 to 5a: everything a step does before it changes the weights, the optimizer's
    /// state and the loss scale.
    fn attempt(&mut self) -> Result<Stepped> {
        let started = Instant::now();
        let decision = self.decide()?;
        let policy_s = started.elapsed().as_secs_f64();
        let batch = self.batch(&decision);
        self.straggle();
        let t = Instant::now();
        let loss_scale = self.scaler.as_ref().map(LossScaler::scale);
        let step = decision.state.step;
        let (loss, skipped, mut exchanged, mut compute_s, exposed_s, backward_s);
        let mut own_loss_sum = None;
        if decision.plan.is_some_and(|p| p != StepKind::Synchronous) {
            // A local step: nothing is agreed or exchanged until the window's end.
            let pass = self.model_pass(&batch, decision.label_smoothing)?;
            compute_s = t.elapsed().as_secs_f64();
            backward_s = pass.backward_s;
            own_loss_sum = Some(pass.loss_sum.double_value(&[]));
            (loss, skipped, exchanged, exposed_s) = (f64::NAN, false, Exchanged::default(), 0.0);
        } else if self.overlap.is_some() {
            let passed = self.pass_overlapped(&batch, decision.label_smoothing, step)?;
            let traffic;
            (loss, skipped, traffic) = self.agree(&passed.loss_sum, false, batch.global)?;
            (exchanged, compute_s) = (passed.exchanged, passed.compute_s);
            exposed_s = passed.exposed_s + traffic.seconds;
            backward_s = passed.backward_s;
            exchanged.traffic += traffic;
        } else {
            let pass = self.model_pass(&batch, decision.label_smoothing)?;
            compute_s = t.elapsed().as_secs_f64();
            backward_s = pass.backward_s;
            let traffic;
            (loss, skipped, traffic) = self.agree(&pass.loss_sum, pass.overflow, batch.global)?;
            exchanged = Exchanged::default();
            if !skipped {
                self.lose_on_purpose(step);
                exchanged = self.exchange(step)?;
            }
            exchanged.traffic += traffic;
            exposed_s = exchanged.traffic.seconds;
        }
        let mut scales = Vec::new();
        if !skipped {
            let t = Instant::now();
            scales = self.layer_rates(&decision)?;
            compute_s += t.elapsed().as_secs_f64();
        }
        Ok(Stepped {
            decision,
            scales,
            batch,
            loss,
            own_loss_sum,
            loss_scale,
            applied: None,
            skipped,
            exchanged,
            started,
            policy_s,
            compute_s,
            exposed_s,
            backward_s,
        })
    }

    /// Phases 5b and 6: the update (none for a skipped step), the loss scale's, then what is
    /// observed of the step.
    fn commit(&mut self, mut s: Stepped) -> Result<()> {
        if !s.skipped {
            let t = Instant::now();
            let before = self.rollback_point(&s.decision);
            self.update(&s.decision, &s.scales);
            s.compute_s += t.elapsed().as_secs_f64();
            let own = s.own_loss_sum.unwrap_or(f64::NAN);
            if let Some((loss, moved)) =
                self.after_update(&s.decision, own, s.batch.global, before)?
            {
                s.loss = loss;
                s.exposed_s = moved.traffic.seconds;
                s.exchanged = moved;
            }
        }
        if let Some(scaler) = &mut self.scaler {
            scaler.update(s.skipped);
        }
        self.observe(s)
    }

    /// `--slow-rank`: that rank sleeps before computing its gradient.
    fn straggle(&self) {
        if let Some(slow) = self
            .config
            .invocation
            .slow
            .filter(|s| s.rank == self.world.rank())
        {
            std::thread::sleep(std::time::Duration::from_millis(slow.ms));
        }
    }

    /// Phase 1: the policies' decision for the next step. With several ranks they agree on
    /// whether any rank's policies faulted (a deterministic plugin faults on every rank alike,
    /// but a wall-clock backstop or a memory cap may strike one rank only), and all stop if so.
    pub fn decide(&mut self) -> Result<Decision> {
        let decided = self.policies.decide(&self.clock).map_err(Error::from);
        let d = self.agreed("policies", decided)?;
        if d.momentum.is_some() && self.config.run.error_feedback.moves_momentum() {
            return Err(Error::Config(format!(
                "step {}: the schedule returns a momentum, but --error-feedback momentum keeps \
                 the momentum inside the gradient exchange at --momentum {}",
                d.state.step, self.config.run.sgd.momentum
            )));
        }
        // Before the layer-rate norms too, which describe this step's update.
        self.opt.set_momentum(d.momentum);
        Ok(d)
    }

    /// Phase 2: the global batch `decision` asks for, from the shared sample order, and this
    /// rank's contiguous shard of it cut into micro-batches.
    pub fn batch(&mut self, decision: &Decision) -> Batch {
        let global = decision.global_batch as usize;
        let (rank, size) = (self.world.rank(), self.world.size());
        let micro = micro_batches(global / size, self.config.run.max_micro_batch as usize);
        let seen = decision.state.samples_seen;
        let all = self.order.take(seen, global);
        let first = seen + (rank * (global / size)) as u64;
        let indices = parallel::shard(&all, rank, size).to_vec();
        let local = decision.plan.is_some_and(|p| p != StepKind::Synchronous);
        let mean_over = if local { global / size } else { global };
        // Image files for this step and, guessing the batch stays, the next one start
        // decoding now, while this step computes.
        if self.data.from_files() {
            self.data.prefetch_train(&indices, first);
            let next = self.order.take(seen + global as u64, global);
            let next_first = first + global as u64;
            self.data
                .prefetch_train(parallel::shard(&next, rank, size), next_first);
        }
        Batch {
            indices,
            micro,
            global,
            mean_over,
            first,
        }
    }

    /// Phase 3: forward and backward over each micro-batch with label smoothing ε,
    /// accumulating gradients. BatchNorm sees one micro-batch at a time.
    pub fn forward_backward(&mut self, batch: &Batch, epsilon: f32) -> Result<Pass> {
        self.opt.zero_grad();
        let mut loss_sum = Tensor::zeros([], (Kind::Double, self.device));
        let scale = self.scaler.as_ref().map_or(1.0, LossScaler::scale);
        let (mut offset, mut backward_s) = (0, 0.0);
        for &m in &batch.micro {
            let (scaled, sum) = self.micro_loss(batch, offset, m, epsilon, scale)?;
            offset += m;
            let t = Instant::now();
            self.backward(&scaled)?;
            backward_s = t.elapsed().as_secs_f64();
            loss_sum += sum;
        }
        let overflow = match &self.scaler {
            Some(scaler) => {
                let grads: Vec<Tensor> =
                    self.opt.params().iter().map(|p| p.tensor.grad()).collect();
                scaler.unscale(&grads)
            }
            None => false,
        };
        Ok(Pass {
            loss_sum,
            overflow,
            backward_s,
        })
    }

    /// The forward pass of the micro-batch of `m` samples at `offset` in `batch`: the loss to
    /// differentiate (weighted by micro/global and times the fp16 `scale`) and the sum of its
    /// per-sample losses.
    fn micro_loss(
        &mut self,
        batch: &Batch,
        offset: usize,
        m: usize,
        epsilon: f32,
        scale: f64,
    ) -> Result<(Tensor, Tensor)> {
        let (x, y) = self.data.train_batch(
            &batch.indices[offset..offset + m],
            batch.first + offset as u64,
        )?;
        let logits = {
            let _autocast = Autocast::enter(self.device, self.autocast)?;
            self.model.forward(&x, true)?
        };
        // The loss in fp32 whatever the forward's precision, as torch.amp's lists have it.
        let loss =
            loss::smoothed_cross_entropy(&logits.to_kind(Kind::Float), &y, f64::from(epsilon));
        // Scaled by micro/global, not micro/worker: the gradients are pre-divided by the
        // world size, and the collective's sum is the mean over the global batch (a local
        // step's is this rank's own mean: `mean_over`).
        let weight = m as f64 / batch.mean_over as f64;
        let scaled = if scale == 1.0 {
            &loss * weight
        } else {
            &loss * weight * scale
        };
        Ok((scaled, loss.detach().to_kind(Kind::Double) * m as f64))
    }

    /// The backward pass of `scaled`, accumulating into the gradients.
    fn backward(&self, scaled: &Tensor) -> Result<()> {
        scaled
            .f_backward()
            .map_err(|e| self.model.fault("backward", &e.to_string()))
    }

    /// Phase 3 as a step runs it. A TorchScript module's forward pass is the user's code: its
    /// fault (an exception, an output training cannot use) stops the run as a plugin's does,
    /// through [`Trainer::stop`], once the ranks agree on it (one flag per step), and with the
    /// module's buffers (BatchNorm's running statistics) put back on every rank, so that the
    /// checkpoint holds the state before the step.
    fn model_pass(&mut self, batch: &Batch, epsilon: f32) -> Result<Pass> {
        let Model::Script(script) = &self.model else {
            return self.forward_backward(batch, epsilon);
        };
        let buffers = script.save_buffers();
        let computed = self.forward_backward(batch, epsilon);
        let failed = if self.agrees() {
            self.world.agree_failure(computed.is_err())?.is_some()
        } else {
            computed.is_err()
        };
        if !failed {
            return computed;
        }
        if let Model::Script(script) = &self.model {
            script.restore_buffers(&buffers);
        }
        // The agreement again, now to stop every rank with the faulting rank's message.
        self.agreed("model", computed)
    }

    /// Phase 4: every gradient replaced by its sum over the ranks. A codec fault stops the
    /// run through [`Trainer::stop`]: every rank gets here (the exchange agrees on faults),
    /// with the weights and residuals still those before this step.
    pub fn exchange(&mut self, step: u64) -> Result<Exchanged> {
        let codec = self.policies.codec_mut();
        let has_codec = codec.is_some();
        let weights: Vec<&Tensor> = self.opt.params().iter().map(|p| &p.tensor).collect();
        let result = self.gradients.exchange(self.world, codec, &weights, step);
        self.settle(result, has_codec, step)
    }

    /// What an exchange of `step` ended with, either step's: a success committed codec state
    /// (which a redo under `--fault-tolerance` rolls back); a fault with a codec (`has_codec`)
    /// stops the run through [`Trainer::stop`].
    fn settle(
        &mut self,
        result: Result<Exchanged>,
        has_codec: bool,
        step: u64,
    ) -> Result<Exchanged> {
        if result.is_ok() {
            self.survival.exchanged(step);
        }
        match result {
            Err(fault) if has_codec => Err(self.stop(fault)),
            other => other,
        }
    }

    /// Phase 4a: the mean loss over the global batch, and whether any rank's fp16 gradients
    /// overflowed (the step is then skipped on every rank); with several ranks one small
    /// all-reduce, since every rank's policies must see the same `last-loss` and every rank
    /// must skip the same steps.
    pub fn agree(
        &mut self,
        loss_sum: &Tensor,
        overflow: bool,
        global: usize,
    ) -> Result<(f64, bool, Traffic)> {
        let sum = loss_sum.double_value(&[]);
        if self.world.size() == 1 {
            return Ok((sum / global as f64, overflow, Traffic::default()));
        }
        let mut l = vec![sum as f32];
        if self.scaler.is_some() {
            l.push(f32::from(u8::from(overflow)));
        }
        let traffic = self.world.all_reduce_sum(Algorithm::Mpi, &mut l)?;
        let overflowed = l.get(1).is_some_and(|&ranks| ranks > 0.0);
        Ok((f64::from(l[0]) / global as f64, overflowed, traffic))
    }

    /// Phase 5a: the layer-rate policy's multiplier of each tensor, from the norms of the
    /// weights, the summed gradients and the optimizer's update (empty without a layer-rate
    /// plugin). A fault stops the run through [`Trainer::stop`] with the state before this
    /// step: the exchange's error-feedback residuals are rolled back first. The ranks agree on
    /// a fault as in [`Trainer::decide`].
    pub fn layer_rates(&mut self, decision: &Decision) -> Result<Vec<f64>> {
        if self.policies.get(PolicyKind::LayerRate).is_none() {
            return Ok(Vec::new());
        }
        let norms = self.opt.norms();
        let records: Vec<TensorNorms> = self
            .tensors
            .iter()
            .zip(norms)
            .zip(self.opt.weight_decays())
            .map(|(((name, shape, role), n), &wd)| TensorNorms {
                name: name.clone(),
                shape: shape.clone(),
                role: *role,
                weight_norm: n.weight,
                grad_norm: n.grad,
                update_norm: n.update,
                weight_decay: wd,
            })
            .collect();
        let rates = self
            .policies
            .layer_rates(&decision.state, &records)
            .map(Option::unwrap_or_default)
            .map_err(Error::from);
        let agreed = self.agreed("layer-rate policy", rates);
        if agreed.is_err() {
            self.gradients.rollback();
        }
        agreed
    }

    /// Phase 5b: the optimizer's update at the decided learning rate, each tensor's scaled by
    /// its layer-rate multiplier when there are any.
    pub fn update(&mut self, decision: &Decision, scales: &[f64]) {
        let scale = if scales.is_empty() {
            LrScale::Uniform
        } else {
            LrScale::PerTensor(scales.to_vec())
        };
        self.opt.step(decision.lr, &scale);
    }

    /// Phase 6: records the step, advances the clock, evaluates after a completed epoch,
    /// checks the ranks agree and writes the periodic checkpoint.
    pub fn observe(&mut self, s: Stepped) -> Result<()> {
        if let Some(scaler) = self.scaler.as_ref().filter(|sc| sc.collapsed()) {
            self.metrics.flush()?;
            self.progress.finish();
            return Err(Error::LossScaleCollapsed {
                step: s.decision.state.step,
                skipped: scaler.state().consecutive_skips,
                scale: scaler.scale(),
                checkpoint: self.last_checkpoint.clone(),
            });
        }
        // A sync policy's local step has no agreed loss yet: its window's end checks it.
        let open = s.decision.plan == Some(StepKind::Local);
        // A skipped step's weights are untouched; its loss may be inf from an fp16 overflow in
        // the forward pass, which the loss scaler answers, not the divergence check.
        if !s.loss.is_finite() && !s.skipped && !open {
            self.metrics.flush()?;
            self.progress.finish();
            return Err(Error::Diverged {
                step: s.decision.state.step,
                loss: s.loss,
                lr: s.decision.lr,
                batch: s.batch.global,
                checkpoint: self.last_checkpoint.clone(),
            });
        }
        self.clock.advance(
            s.decision.global_batch,
            Some(s.loss).filter(|l| l.is_finite() && !open),
        );
        if let Some(kind) = s.decision.plan {
            self.clock.pass(kind);
        }
        self.samples += s.batch.global as u64;
        if open {
            let record = self.step_record(&s);
            self.hold(record, s.own_loss_sum.unwrap_or(f64::NAN));
        } else {
            self.record(&s)?;
        }
        // Inside a window the ranks hold models of their own: the evaluation and the
        // consistency check wait for its end.
        let agreed = self.in_agreement();
        if agreed {
            self.evaluate_at_epoch_end()?;
        }
        let inv = &self.config.invocation;
        let (step, every, ckpt) = (
            self.clock.step(),
            inv.consistency_every,
            inv.checkpoint_every,
        );
        // Asynchronous workers hold other weights than the server by design.
        let sync = self.config.run.mode == Mode::Sync;
        if sync && agreed && every > 0 && step.is_multiple_of(every) {
            self.surviving("consistency check", |t| {
                t.consistency(&s.decision, &s.scales)
            })?;
        }
        if ckpt > 0 && step.is_multiple_of(ckpt) && !self.clock.finished() {
            self.metrics.flush()?;
            self.surviving("checkpoint", |t| t.save("periodic"))?;
        }
        self.last_decision = Some((s.decision, s.scales));
        Ok(())
    }

    /// The step's metrics record and progress line.
    fn record(&mut self, s: &Stepped) -> Result<()> {
        let record = self.step_record(s);
        self.metrics.write(&Record::Step(record))?;
        if self.world.is_tolerant() {
            // Rank 0 may be lost: whoever takes over goes on after what reached the disk.
            self.metrics.flush()?;
        }
        let wall = s.started.elapsed().as_secs_f64();
        let after = self.clock.state();
        self.progress.step(
            self.clock.step(),
            after.total_steps,
            after.epoch_fraction,
            s.loss,
            s.decision.lr,
            s.batch.global as f64 / wall,
        );
        Ok(())
    }

    /// The step's metrics record.
    fn step_record(&self, s: &Stepped) -> StepRecord {
        let wall = s.started.elapsed().as_secs_f64();
        let d = &s.decision;
        StepRecord {
            step: d.state.step,
            epoch: d.state.epoch_fraction,
            lr: d.lr,
            momentum: d.momentum,
            global_batch: d.global_batch,
            micro_batches: s.batch.micro.len() as u32,
            label_smoothing: d.label_smoothing,
            loss: s.loss,
            samples_per_s: s.batch.global as f64 / wall,
            compute_s: s.compute_s,
            communication_s: s.exchanged.traffic.seconds,
            exposed_communication_s: s.exposed_s,
            hidden_communication_s: (s.exchanged.traffic.seconds - s.exposed_s).max(0.0),
            backward_s: s.backward_s,
            bytes_sent: s.exchanged.traffic.bytes_sent,
            payload_bytes: s.exchanged.payload_bytes,
            compression_ratio: s.exchanged.compression_ratio(),
            policy_s: s.policy_s,
            loss_scale: s.loss_scale,
            skipped: s.skipped,
            worker: s.applied.map(|(w, _)| w),
            staleness: s.applied.map(|(_, st)| st),
            sync: d.plan.map(|p| p.name().to_string()),
        }
    }

    /// Evaluates on the test split once per completed epoch; the accuracy becomes the
    /// policies' `last-metric`.
    fn evaluate_at_epoch_end(&mut self) -> Result<()> {
        let epochs = self.config.run.epochs;
        let completed = self.clock.state().epoch.min(epochs);
        if completed <= self.epochs_evaluated {
            return Ok(());
        }
        self.epochs_evaluated = completed;
        let e = eval::evaluate(&self.model, &mut self.data, self.autocast)?;
        self.clock.set_metric(e.accuracy);
        self.metrics.write(&Record::Eval(EvalRecord {
            step: self.clock.step(),
            epoch: completed,
            test_loss: e.loss,
            test_acc: e.accuracy,
            elapsed_s: self.started.elapsed().as_secs_f64(),
        }))?;
        self.metrics.flush()?;
        self.progress.line(&format!(
            "epoch {completed}/{epochs}: test loss {:.4}, test accuracy {:.2}%",
            e.loss,
            100.0 * e.accuracy
        ));
        self.last_eval = Some(e);
        Ok(())
    }

    /// The cross-rank check after the current step: the policies' outputs, the state of
    /// stateful policies and of a stateful codec, and the weights.
    fn consistency(&mut self, d: &Decision, scales: &[f64]) -> Result<()> {
        let step = self.clock.step();
        parallel::check_consistent(
            self.world,
            step,
            "policy outputs (lr, batch, ε, layer-rate multipliers)",
            parallel::decision_digest(d, scales),
        )?;
        let states = self.policies.states_at(step).map_err(Error::from)?;
        parallel::check_consistent(
            self.world,
            step,
            "policy state (snapshots of stateful plugins)",
            parallel::bytes_digest(states.iter().map(|(_, b)| b.as_slice())),
        )?;
        if let Some(w) = &self.windows {
            parallel::check_consistent(
                self.world,
                step,
                "outer step (the sync policy's last, and the momentum on θ_global)",
                parallel::outer_digest(w.last_outer(), w.momentum()),
            )?;
        }
        if let Some(buckets) = self.gradients.codec_state() {
            parallel::check_consistent(
                self.world,
                step,
                "codec state (each bucket's, which a stateful codec carries between steps)",
                parallel::bytes_digest(buckets.iter().map(Vec::as_slice)),
            )?;
        }
        parallel::check_consistent(
            self.world,
            step,
            "weights",
            parallel::tensors_digest(self.opt.weights()),
        )
    }
}

/// `count` per second over `seconds` (0 when no time passed).
fn per_second(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

/// The metrics writer on rank 0, nothing elsewhere.
struct Metrics(Option<MetricsWriter>);

impl Metrics {
    fn write(&mut self, record: &Record) -> Result<()> {
        match &mut self.0 {
            Some(w) => w.write(record),
            None => Ok(()),
        }
    }

    fn flush(&mut self) -> Result<()> {
        match &mut self.0 {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }
}
