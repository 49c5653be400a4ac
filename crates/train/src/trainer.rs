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
//! [`save`](Trainer::save) writes a checkpoint, and [`stop`](Trainer::stop) is the one way out on
//! a plugin fault: it saves the state before the failed step and names the fault.
//!
//! [`asynchronous`] is the other loop (`--mode async`): the same phases split between a
//! parameter server (decide, update, observe) and workers (forward and backward).

use std::path::{Path, PathBuf};
use std::time::Instant;

use lsgd_collective::{Algorithm, Traffic, World};
use lsgd_policy::{Role, TensorNorms};
use lsgd_runtime::plugin::PolicyKind;
use lsgd_runtime::policy::{Clock, Decision, PolicySet, RunShape};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

mod asynchronous;
mod identity;
mod resume;

use identity::{plugin_records, same_plugins};

use crate::checkpoint::{self, Meta, PluginRecord};
use crate::config::{Mode, TrainConfig};
use crate::eval::{self, Evaluation};
use crate::exchange::{Exchanged, GradientExchange, Local};
use crate::metrics::{EvalRecord, MetricsWriter, Record, StepRecord};
use crate::model::Model;
use crate::optim::{self, LrScale, Optimizer, Param};
use crate::order::{SampleOrder, micro_batches};
use crate::precision::{Autocast, LossScaler};
use crate::progress::Progress;
use crate::tensors::{DataSettings, DataTensors};
use crate::{Error, Reporting, Result, Summary, data, device, loss, parallel, rundir, tune_malloc};

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
    /// The mean loss over the global batch (equal on every rank).
    pub loss: f64,
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
}

/// Where a run starts: afresh, or from a checkpoint and with what leave.
#[derive(Debug, Clone, Copy, Default)]
pub struct Start<'a> {
    /// The checkpoint (or run directory) to continue (`--resume`).
    pub resume: Option<&'a Path>,
    /// `--allow-policy-change`: the checkpoint may be continued with other policy plugins,
    /// parameters or `--epochs`, which start at its step (weights, optimizer state and step
    /// carry over), so a run stopped by a plugin fault can go on with the fixed plugin.
    pub allow_policy_change: bool,
}

impl<'w> Trainer<'w> {
    /// Sets up the run `config` describes on this rank of `world`: data, model, optimizer,
    /// gradient exchange and clock, resumed from `resume` if given.
    pub fn new(
        world: &'w mut World,
        config: &TrainConfig,
        policies: PolicySet,
        resume: Option<&Path>,
        reporting: Reporting,
    ) -> Result<Self> {
        let start = Start {
            resume,
            allow_policy_change: false,
        };
        Self::start(world, config, policies, start, reporting)
    }

    /// [`Trainer::new`], starting as `start` says.
    pub fn start(
        world: &'w mut World,
        config: &TrainConfig,
        mut policies: PolicySet,
        start: Start<'_>,
        reporting: Reporting,
    ) -> Result<Self> {
        let resume = start.resume;
        config.validate()?;
        if let Some(path) = &config.invocation.save_model {
            // Refused now rather than after the run: a --save-model the model cannot use.
            crate::model::saved_files(&config.run.model, path)?;
        }
        let plugins = plugin_records(&policies);
        same_plugins(world, &plugins)?;
        tune_malloc();
        tch::set_num_threads(config.invocation.threads as i32);
        let (run, device) = (&config.run, device(config.invocation.device)?);
        let data = {
            let dataset = data::load(run.dataset, &config.invocation.data)?;
            let settings = DataSettings {
                train_subset: run.train_subset,
                test_subset: run.test_subset,
                augment: run.augment,
                image_size: run.image_size as usize,
                seed: run.seed,
                loader_threads: config.invocation.loader_threads,
            };
            DataTensors::new(&dataset, &settings, device)?
        };
        tch::manual_seed(run.seed as i64);
        let vs = VarStore::new(device);
        let model = run.model.build(&vs.root(), data.image, data.classes)?;
        let opt = optim::build(&vs, run.sgd, run.adamw, run.error_feedback);
        let tensors = tensor_descriptions(&vs, opt.params());
        let gradients = gradient_exchange(config, opt.as_ref(), &mut policies)?;
        let clock = Clock::new(RunShape {
            epochs: run.epochs,
            samples_per_epoch: data.train.len as u64,
            initial_batch: run.global_batch,
            // An asynchronous update's batch is one worker's, not split over the ranks.
            world_size: match run.mode {
                Mode::Sync => world.size() as u32,
                Mode::Async => 1,
            },
            base_lr: run.base_lr,
            reference_batch: run.reference_batch,
        })?;
        claim_out(world, config, resume)?;
        let mut trainer = Trainer {
            plugins,
            order: SampleOrder::new(run.seed, data.train.len),
            progress: Progress::new(0, true),
            metrics: Metrics(None),
            world,
            config: config.clone(),
            policies,
            data,
            device,
            vs,
            model,
            opt,
            gradients,
            autocast: run.mixed_precision.precision.autocast_kind(),
            scaler: run.mixed_precision.scaler(),
            clock,
            epochs_evaluated: 0,
            started: Instant::now(),
            samples: 0,
            last_eval: None,
            last_decision: None,
            staleness: Default::default(),
            tensors,
            last_checkpoint: None,
        };
        let resumed = resume
            .map(|path| trainer.resume(path, start.allow_policy_change, reporting.quiet))
            .transpose()?;
        let root = trainer.world.is_root();
        if root {
            let inv = &trainer.config.invocation;
            let from = resumed.as_ref().map(|r| &r.metrics);
            trainer.metrics = Metrics(Some(MetricsWriter::open(&inv.out, inv.csv, from)?));
        }
        if let Some(change) = resumed.and_then(|r| r.change) {
            trainer.metrics.write(&Record::PolicyChange(change))?;
            trainer.metrics.flush()?;
        }
        let total = trainer.clock.state().total_steps;
        trainer.progress = Progress::new(total, reporting.quiet || !root);
        Ok(trainer)
    }

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
    /// stops after the agreement: no exchange and no update, the scale halved.
    pub fn step(&mut self) -> Result<()> {
        let started = Instant::now();
        let decision = self.decide()?;
        let policy_s = started.elapsed().as_secs_f64();
        let batch = self.batch(&decision);
        self.straggle();
        let t = Instant::now();
        let loss_scale = self.scaler.as_ref().map(LossScaler::scale);
        let (loss_sum, overflow) = self.model_pass(&batch, decision.label_smoothing)?;
        let mut compute_s = t.elapsed().as_secs_f64();
        let (loss, skipped, traffic) = self.agree(&loss_sum, overflow, batch.global)?;
        let (mut exchanged, mut scales) = (Exchanged::default(), Vec::new());
        if !skipped {
            exchanged = self.exchange(decision.state.step)?;
            let t = Instant::now();
            scales = self.layer_rates(&decision)?;
            self.update(&decision, &scales);
            compute_s += t.elapsed().as_secs_f64();
        }
        exchanged.traffic += traffic;
        if let Some(scaler) = &mut self.scaler {
            scaler.update(skipped);
        }
        self.observe(Stepped {
            decision,
            scales,
            batch,
            loss,
            loss_scale,
            applied: None,
            skipped,
            exchanged,
            started,
            policy_s,
            compute_s,
        })
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
            first,
        }
    }

    /// Phase 3: forward and backward over each micro-batch with label smoothing ε,
    /// accumulating gradients; returns the sum of this rank's per-sample losses and, with
    /// fp16, whether the unscaled gradients hold an inf or NaN. BatchNorm sees one micro-batch
    /// at a time.
    pub fn forward_backward(&mut self, batch: &Batch, epsilon: f32) -> Result<(Tensor, bool)> {
        self.opt.zero_grad();
        let mut loss_sum = Tensor::zeros([], (Kind::Double, self.device));
        let scale = self.scaler.as_ref().map_or(1.0, LossScaler::scale);
        let mut offset = 0;
        for &m in &batch.micro {
            let (x, y) = self.data.train_batch(
                &batch.indices[offset..offset + m],
                batch.first + offset as u64,
            )?;
            offset += m;
            let logits = {
                let _autocast = Autocast::enter(self.device, self.autocast)?;
                self.model.forward(&x, true)?
            };
            // The loss in fp32 whatever the forward's precision, as torch.amp's lists have it.
            let loss =
                loss::smoothed_cross_entropy(&logits.to_kind(Kind::Float), &y, f64::from(epsilon));
            // Scaled by micro/global, not micro/worker: the gradients are pre-divided by the
            // world size, and the collective's sum is the mean over the global batch.
            let weight = m as f64 / batch.global as f64;
            let scaled = if scale == 1.0 {
                &loss * weight
            } else {
                &loss * weight * scale
            };
            scaled
                .f_backward()
                .map_err(|e| self.model.fault("backward", &e.to_string()))?;
            loss_sum += loss.detach().to_kind(Kind::Double) * m as f64;
        }
        let overflow = match &self.scaler {
            Some(scaler) => {
                let grads: Vec<Tensor> =
                    self.opt.params().iter().map(|p| p.tensor.grad()).collect();
                scaler.unscale(&grads)
            }
            None => false,
        };
        Ok((loss_sum, overflow))
    }

    /// Phase 3 as a step runs it. A TorchScript module's forward pass is the user's code: its
    /// fault (an exception, an output training cannot use) stops the run as a plugin's does,
    /// through [`Trainer::stop`], once the ranks agree on it (one flag per step), and with the
    /// module's buffers (BatchNorm's running statistics) put back on every rank, so that the
    /// checkpoint holds the state before the step.
    fn model_pass(&mut self, batch: &Batch, epsilon: f32) -> Result<(Tensor, bool)> {
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
        // A skipped step's weights are untouched; its loss may be inf from an fp16 overflow in
        // the forward pass, which the loss scaler answers, not the divergence check.
        if !s.loss.is_finite() && !s.skipped {
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
            Some(s.loss).filter(|l| l.is_finite()),
        );
        self.samples += s.batch.global as u64;
        self.record(&s)?;
        self.evaluate_at_epoch_end()?;
        let inv = &self.config.invocation;
        let (step, every, ckpt) = (
            self.clock.step(),
            inv.consistency_every,
            inv.checkpoint_every,
        );
        // Asynchronous workers hold other weights than the server by design.
        let sync = self.config.run.mode == Mode::Sync;
        if sync && every > 0 && step.is_multiple_of(every) {
            self.consistency(&s.decision, &s.scales)?;
        }
        if ckpt > 0 && step.is_multiple_of(ckpt) && !self.clock.finished() {
            self.metrics.flush()?;
            self.save("periodic")?;
        }
        self.last_decision = Some((s.decision, s.scales));
        Ok(())
    }

    /// The step's metrics record and progress line.
    fn record(&mut self, s: &Stepped) -> Result<()> {
        let wall = s.started.elapsed().as_secs_f64();
        let d = &s.decision;
        self.metrics.write(&Record::Step(StepRecord {
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
            bytes_sent: s.exchanged.traffic.bytes_sent,
            payload_bytes: s.exchanged.payload_bytes,
            compression_ratio: s.exchanged.compression_ratio(),
            policy_s: s.policy_s,
            loss_scale: s.loss_scale,
            skipped: s.skipped,
            worker: s.applied.map(|(w, _)| w),
            staleness: s.applied.map(|(_, st)| st),
        }))?;
        let after = self.clock.state();
        self.progress.step(
            self.clock.step(),
            after.total_steps,
            after.epoch_fraction,
            s.loss,
            d.lr,
            s.batch.global as f64 / wall,
        );
        Ok(())
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

    /// After the last step: the final consistency check and checkpoint, and the summary.
    fn finish(mut self) -> Result<Summary> {
        self.metrics.flush()?;
        if self.world.size() > 1 && self.config.run.mode == Mode::Sync {
            if let Some((d, scales)) = self.last_decision.take() {
                self.consistency(&d, &scales)?;
            }
            self.progress.line(&format!(
                "consistency: weights and policy outputs bit-identical on all {} ranks at step {}",
                self.world.size(),
                self.clock.step()
            ));
        }
        let reason = if self.clock.finished() {
            "final"
        } else {
            "stopped"
        };
        let checkpoint = self.save(reason)?;
        if let (true, Some(path)) = (self.world.is_root(), &self.config.invocation.save_model) {
            crate::model::save_model(&self.vs, &self.model, path)?;
            self.progress
                .line(&format!("model weights saved to {}", path.display()));
        }
        self.progress.finish();
        let elapsed = self.started.elapsed().as_secs_f64();
        Ok(Summary {
            steps: self.clock.step(),
            last_eval: self.last_eval,
            last_loss: self.clock.state().last_loss,
            weights_blake3: crate::weights_blake3(&self.vs),
            checkpoint,
            loss_scaler: self.scaler.as_ref().map(LossScaler::state),
            staleness: std::mem::take(&mut self.staleness),
            samples_per_s: per_second(self.samples, elapsed),
        })
    }

    /// Saves a checkpoint on rank 0 (every rank takes part: the codec state of all ranks goes
    /// into it); returns its path. In a synchronous run on several ranks, every rank learns
    /// whether rank 0 wrote it, and fails with rank 0's error if not: a rank names only a
    /// checkpoint that was written whole.
    pub fn save(&mut self, reason: &str) -> Result<PathBuf> {
        let codec_state = self.gradients.checkpoint_tensors(self.world)?;
        let written = if self.world.is_root() {
            self.write_checkpoint(reason, codec_state)
        } else {
            Ok(self.config.invocation.out.join(checkpoint::JSON_NAME))
        };
        let saved = if self.agrees() {
            let mine = written.as_ref().err().map(ToString::to_string);
            match (self.world.first_message(mine.as_deref())?, written) {
                (Some((rank, message)), Ok(_)) => Err(Error::OnRank { rank, message }),
                (_, written) => written,
            }
        } else {
            written
        }?;
        self.note_checkpoint(saved.clone(), self.clock.step());
        Ok(saved)
    }

    /// Writes rank 0's checkpoint of the state now, with every rank's `codec_state`.
    fn write_checkpoint(
        &mut self,
        reason: &str,
        codec_state: Vec<(String, Tensor)>,
    ) -> Result<PathBuf> {
        let out = &self.config.invocation.out;
        let mut tensors: Vec<(String, Tensor)> = self
            .vs
            .variables()
            .into_iter()
            .map(|(n, t)| (format!("{MODEL}{n}"), t))
            .collect();
        tensors.extend(self.opt.state());
        tensors.extend(codec_state);
        let state = self.clock.state();
        let policy_state = self
            .policies
            .states_at(state.step)
            .map_err(Error::from)?
            .into_iter()
            .map(|(slot, bytes)| (slot.key(), checkpoint::hex(&bytes)))
            .collect();
        let meta = Meta {
            format: checkpoint::FORMAT.into(),
            reason: reason.into(),
            tensors: String::new(),
            tensors_blake3: String::new(),
            step: state.step,
            samples_seen: state.samples_seen,
            last_loss: state.last_loss,
            last_metric: state.last_metric,
            last_lr: self.opt.last_lr(),
            epochs_evaluated: self.epochs_evaluated,
            train_len: self.data.train.len,
            config: self.config.clone(),
            plugins: self.plugins.clone(),
            policy_state,
            loss_scaler: self.scaler.as_ref().map(LossScaler::state),
        };
        checkpoint::save(out, meta, &tensors)
    }

    /// Records the newest checkpoint: a divergence names it, and so does the collective
    /// watchdog's report (with the directory to resume from).
    fn note_checkpoint(&mut self, json: PathBuf, step: u64) {
        let dir = json
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        lsgd_collective::watchdog::note_checkpoint(step, dir);
        self.last_checkpoint = Some((json, step));
    }

    /// After a plugin fault: flushes the metrics, saves the state before the current step and
    /// returns the fault with where that state went (or the error that prevented saving). With
    /// several ranks every rank must call it (the faults are agreed first): the save is a
    /// collective, and every rank returns the same error, the lowest faulting rank's fault
    /// prefixed by its rank, and rank 0's checkpoint path or save error.
    pub fn stop(&mut self, fault: Error) -> Error {
        // Saved even when the flush failed: the save is a collective the other ranks are in.
        let flushed = self.metrics.flush();
        let saved = self.save("plugin fault");
        let saved = flushed.and(saved);
        self.progress.finish();
        let (fault, saved) = if self.agrees() {
            match self.shared_stop(fault, saved) {
                Ok(shared) => shared,
                Err(e) => return e,
            }
        } else {
            (fault, saved)
        };
        match saved {
            Ok(saved) => Error::Stopped {
                step: self.clock.step(),
                saved,
                fault: Box::new(fault),
            },
            Err(e) => e,
        }
    }

    /// Whether faults must be agreed between ranks: a synchronous run on several ranks (in
    /// `--mode async` only the server calls the policies, and stops the workers itself).
    fn agrees(&self) -> bool {
        self.world.size() > 1 && self.config.run.mode == Mode::Sync
    }

    /// `outcome` of this rank's `what` calls, once the ranks agree: one all-gather of a flag
    /// (none on one rank), and if any rank faulted, every rank stops through [`Trainer::stop`].
    fn agreed<T>(&mut self, what: &str, outcome: Result<T>) -> Result<T> {
        self.report_held();
        if !self.agrees() {
            return outcome.map_err(|fault| self.stop(fault));
        }
        match (self.world.agree_failure(outcome.is_err())?, outcome) {
            (_, Err(fault)) => Err(self.stop(fault)),
            (Some(rank), Ok(_)) => {
                let step = self.clock.step();
                let what = what.to_string();
                Err(self.stop(Error::Elsewhere { rank, what, step }))
            }
            (None, Ok(v)) => Ok(v),
        }
    }

    /// Warns (rank 0) of every fault `--on-plugin-fault hold-last` absorbed since the last
    /// call. Policies are deterministic, so every rank held the same output; the consistency
    /// check catches the case where they did not.
    fn report_held(&mut self) {
        for held in self.policies.take_held() {
            if self.world.is_root() {
                self.progress.warn(&format!(
                    "warning: {}\n  --on-plugin-fault hold-last kept its last good output \
                     ({} fault(s) in a row); a fresh instance answers the next call",
                    held.fault, held.in_a_row
                ));
            }
        }
    }

    /// [`Trainer::stop`]'s agreement: the lowest rank whose fault is its own (not news of
    /// another rank's) gives every rank its message, and rank 0 gives the checkpoint's path or
    /// why it could not be saved. Faults every rank met alike (payload lengths that disagree)
    /// stay as they are.
    fn shared_stop(
        &mut self,
        fault: Error,
        saved: Result<PathBuf>,
    ) -> Result<(Error, Result<PathBuf>)> {
        let own = !matches!(fault, Error::Elsewhere { .. } | Error::Exchange(_));
        let message = own.then(|| fault.to_string());
        let fault = match self.world.first_message(message.as_deref())? {
            Some((rank, message)) => Error::OnRank { rank, message },
            None => fault,
        };
        // `1` and the path, or `0` and the error.
        let mut root = match &saved {
            Ok(path) => [b"1", path.as_os_str().as_encoded_bytes()].concat(),
            Err(e) => [b"0", e.to_string().as_bytes()].concat(),
        };
        self.world.broadcast_bytes(&mut root)?;
        let text = String::from_utf8_lossy(&root[1..]).into_owned();
        let saved = match root.first() {
            Some(b'1') => Ok(PathBuf::from(text)),
            _ => Err(Error::OnRank {
                rank: 0,
                message: format!("cannot save the state after the fault: {text}"),
            }),
        };
        Ok((fault, saved))
    }

    /// The line that opens a run: the model, the data, the ranks and the gradient path.
    fn announce(&mut self) {
        let params: usize = self.opt.params().iter().map(|p| p.tensor.numel()).sum();
        let path = match (
            self.gradients.compressor(),
            self.policies.get(PolicyKind::Codec),
        ) {
            (Some(c), Some(p)) => format!(
                ", codec {} ({:?}, {} round(s), {} bucket(s){})",
                p.info().name,
                c.properties().combine,
                c.properties().rounds,
                self.gradients.len(),
                self.config.run.error_feedback.announce()
            ),
            _ if self.world.size() > 1 => format!(
                ", {} all-reduce over {} bucket(s)",
                self.config.invocation.allreduce,
                self.gradients.len()
            ),
            _ => String::new(),
        };
        let precision = match self.config.run.mixed_precision.precision {
            crate::precision::Precision::Fp32 => String::new(),
            p => format!(" in {p} (autocast, fp32 master weights)"),
        };
        self.progress.line(&format!(
            "training {} ({params} parameters) on {} samples, device {:?}{precision}, {} epochs from step {}, {} rank(s){path}",
            self.config.run.model.arch,
            self.data.train.len,
            self.device,
            self.config.run.epochs,
            self.clock.step(),
            self.world.size(),
        ));
    }
}

/// Makes `--out` this run's (rank 0 checks and creates it, see [`rundir::claim`]); every rank
/// stops alike, with rank 0's message, when it refuses.
fn claim_out(world: &World, config: &TrainConfig, resume: Option<&Path>) -> Result<()> {
    let inv = &config.invocation;
    let claimed = if world.is_root() {
        rundir::claim(&inv.out, resume, inv.overwrite).and_then(|removed| {
            if !removed.is_empty() {
                eprintln!(
                    "--overwrite: removed the previous run's {} file(s) from {}",
                    removed.len(),
                    inv.out.display()
                );
            }
            std::fs::create_dir_all(&inv.out).map_err(Error::io(format!(
                "cannot create --out {}",
                inv.out.display()
            )))
        })
    } else {
        Ok(())
    };
    if world.size() == 1 {
        return claimed;
    }
    let message = claimed.as_ref().err().map(ToString::to_string);
    match world.first_message(message.as_deref())? {
        Some((rank, message)) if claimed.is_ok() => Err(Error::OnRank { rank, message }),
        _ => claimed,
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

/// The gradient exchange of `opt`'s parameters (bucket size, all-reduce, codec, error
/// feedback and local clipping as `config` says).
fn gradient_exchange(
    config: &TrainConfig,
    opt: &dyn Optimizer,
    policies: &mut PolicySet,
) -> Result<GradientExchange> {
    let run = &config.run;
    let shapes: Vec<(String, Vec<i64>)> = opt
        .params()
        .iter()
        .map(|p| (p.name.clone(), p.tensor.size()))
        .collect();
    let local = Local {
        error_feedback: run.error_feedback,
        momentum: run.sgd.momentum,
        weight_decays: opt.weight_decays().to_vec(),
        clip_norm: run.local_clip_norm,
        find_unused: run.model.arch == crate::model::Arch::Script,
    };
    local.check(run, policies.get(PolicyKind::LayerRate).is_some())?;
    GradientExchange::new(
        &shapes,
        (run.bucket_mb * (1 << 20) as f64 / 4.0) as usize,
        config.invocation.allreduce,
        policies.codec_mut(),
        local,
        run.seed,
    )
}

/// Each trainable tensor's name, shape and role, in the optimizer's order.
fn tensor_descriptions(vs: &VarStore, params: &[Param]) -> Vec<(String, Vec<u32>, Role)> {
    params
        .iter()
        .zip(Param::roles(vs, params))
        .map(|(p, role)| {
            let shape = p.tensor.size().iter().map(|&d| d as u32).collect();
            (p.name.clone(), shape, role)
        })
        .collect()
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
