//! `lsgd-host run`: the training loop. Each step asks the policies for the global batch, the LR
//! and ε ([`crate::policy::PolicySet`]), takes the next global batch of the sample stream
//! ([`order`]), runs it as micro-batches with gradient accumulation, and applies one SGD update
//! ([`crate::optim`]). BatchNorm sees one micro-batch at a time: statistics are per worker and
//! per micro-batch, as in Goyal et al. (§5.1: the BN batch is a hyper-parameter, kept fixed
//! while the global batch grows). An evaluation on the test split follows every completed
//! epoch; metrics and checkpoints go to the run directory.
//!
//! - [`config`]: the run's settings;
//! - [`tensors`]: the data set on the device;
//! - [`order`]: which samples each step trains on;
//! - [`loss`]: smoothed cross-entropy;
//! - [`eval`]: test loss and accuracy;
//! - [`metrics`]: metrics.jsonl / CSV;
//! - [`parallel`]: this rank's shard, gradient buckets, the cross-rank consistency check;
//! - [`compress`]: the gradient exchange through a codec plugin, with error feedback;
//! - [`checkpoint`]: atomic save and resume;
//! - [`progress`]: the progress bar or log lines.

pub mod checkpoint;
pub mod compress;
pub mod config;
pub mod eval;
pub mod loss;
pub mod metrics;
pub mod order;
pub mod parallel;
pub mod progress;
pub mod tensors;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::collective::{Algorithm, Traffic, World};
use crate::data;
use crate::optim::Sgd;
use crate::plugin::{Plugin, PolicyKind};
use crate::policy::{Clock, PolicySet, RunShape};
use checkpoint::{Meta, PluginRecord};
use compress::{Compressor, Exchanged};
pub use config::{DeviceChoice, TrainConfig};
use eval::Evaluation;
use metrics::{EvalRecord, MetricsWriter, Record, StepRecord};
use order::{SampleOrder, micro_batches};
use progress::Progress;
use tensors::DataTensors;

/// Prefix of model variables in checkpoints.
const MODEL: &str = "model.";

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Steps taken in total (including those before a resume).
    pub steps: u64,
    /// The last evaluation, if any epoch completed.
    pub last_eval: Option<Evaluation>,
    /// The last training loss.
    pub last_loss: Option<f64>,
    /// blake3 of every model variable in name order: equal iff the weights are bit-identical.
    pub weights_blake3: String,
    /// The final checkpoint.
    pub checkpoint: PathBuf,
    /// Mean samples/s over the steps of this process.
    pub samples_per_s: f64,
}

/// Options that change how a run reports, not what it computes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reporting {
    /// No progress bar or log lines.
    pub quiet: bool,
}

/// Resolves `--device`.
pub fn device(choice: DeviceChoice) -> Result<Device> {
    Ok(match choice {
        DeviceChoice::Cpu => Device::Cpu,
        DeviceChoice::Auto => Device::cuda_if_available(),
        DeviceChoice::Cuda if tch::Cuda::is_available() => Device::Cuda(0),
        DeviceChoice::Cuda => bail!(
            "--device cuda: libtorch sees no CUDA device (this binary {} libtorch_cuda; see README)",
            if env!("LSGD_LINKED_CUDA") == "1" {
                "links"
            } else {
                "was built without"
            }
        ),
    })
}

/// Large-block glibc malloc settings: libtorch allocates and frees activation-sized blocks
/// every step, and with the defaults each one is a fresh mmap/munmap pair plus page faults;
/// raised thresholds keep them in the heap for reuse, as PyTorch's allocator does for Python
/// (`bench train` compares the two).
pub fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds; it is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// Trains in this process alone (see [`run_in`]).
pub fn run(
    config: &TrainConfig,
    policies: PolicySet,
    resume: Option<&std::path::Path>,
    reporting: Reporting,
) -> Result<Summary> {
    run_in(&mut World::single(), config, policies, resume, reporting)
}

/// Trains as `config` says on this rank of `world`, asking `policies` at every step; resumes
/// from `resume` if given. Every rank runs the same loop on its shard of each global batch
/// and evaluates the whole test split (identical weights give identical results, which the
/// policies read as `last-metric`); rank 0 alone reports, writes metrics and checkpoints.
pub fn run_in(
    world: &mut World,
    config: &TrainConfig,
    mut policies: PolicySet,
    resume: Option<&std::path::Path>,
    reporting: Reporting,
) -> Result<Summary> {
    config.validate().map_err(anyhow::Error::msg)?;
    tune_malloc();
    tch::set_num_threads(config.threads as i32);
    let device = device(config.device)?;
    let dataset = data::load_dir(&config.data)?;
    let data = DataTensors::new(&dataset, config.train_subset, config.test_subset, device)
        .map_err(anyhow::Error::msg)?;
    drop(dataset);

    tch::manual_seed(config.seed as i64);
    let vs = VarStore::new(device);
    let model = config.model.build(&vs.root(), data.image, data.classes);
    let mut opt = Sgd::new(&vs, config.sgd);
    let mut compressor = match policies.codec_mut() {
        Some(codec) => {
            let shapes: Vec<(String, Vec<i64>)> = opt
                .weights()
                .map(|(n, t)| (n.to_string(), t.size()))
                .collect();
            let cap = (config.bucket_mb * (1 << 20) as f64 / 4.0) as usize;
            Some(Compressor::new(
                codec,
                &shapes,
                cap,
                config.error_feedback,
                config.seed,
            )?)
        }
        None if config.error_feedback => {
            bail!("--error-feedback keeps a codec's compression error: it needs --codec")
        }
        None => None,
    };
    let mut clock = Clock::new(RunShape {
        epochs: config.epochs,
        samples_per_epoch: data.train.len as u64,
        initial_batch: config.global_batch,
        world_size: world.size() as u32,
        base_lr: config.base_lr,
        reference_batch: config.reference_batch,
    })
    .map_err(anyhow::Error::msg)?;
    let plugins = plugin_records(&policies);
    let mut epochs_evaluated = 0;

    let root = world.is_root();
    if root {
        std::fs::create_dir_all(&config.out)
            .with_context(|| format!("cannot create --out {}", config.out.display()))?;
    }
    let resumed_at = match resume {
        Some(path) => {
            let (meta, tensors) = checkpoint::load(path)?;
            check_resumable(config, &meta, &plugins, data.train.len, path)?;
            restore(&vs, &mut opt, &tensors, meta.last_lr)
                .with_context(|| format!("cannot restore {}", path.display()))?;
            if let Some(c) = &mut compressor {
                c.restore(&tensors, world.rank())
                    .with_context(|| format!("cannot restore {}", path.display()))?;
            }
            clock = Clock::resume(
                *clock.shape(),
                meta.step,
                meta.samples_seen,
                meta.last_loss,
                meta.last_metric,
            );
            epochs_evaluated = meta.epochs_evaluated;
            Some(meta.step)
        }
        None => None,
    };
    let mut metrics = Metrics(if root {
        Some(MetricsWriter::open(&config.out, config.csv, resumed_at)?)
    } else {
        None
    });
    let mut order = SampleOrder::new(config.seed, data.train.len);
    let mut progress = Progress::new(clock.state().total_steps, reporting.quiet || !root);
    let numels: Vec<usize> = opt.weights().map(|(_, t)| t.numel()).collect();
    let buckets = parallel::Buckets::new(&numels, (config.bucket_mb * (1 << 20) as f64) as usize);
    progress.line(&format!(
        "training {} ({} parameters) on {} samples, device {:?}, {} epochs from step {}, {} rank(s){}",
        config.model.arch,
        numels.iter().sum::<usize>(),
        data.train.len,
        device,
        config.epochs,
        clock.step(),
        world.size(),
        match (&compressor, policies.get(PolicyKind::Codec)) {
            (Some(c), Some(p)) => format!(
                ", codec {} ({:?}, {} round(s), {} bucket(s){})",
                p.info().name,
                c.properties().combine,
                c.properties().rounds,
                c.len(),
                if config.error_feedback {
                    ", error feedback"
                } else {
                    ""
                }
            ),
            _ if world.size() > 1 => format!(
                ", {} all-reduce over {} bucket(s)",
                config.allreduce,
                buckets.len()
            ),
            _ => String::new(),
        }
    ));
    let params = numels.iter().sum::<usize>() as u64;

    let ctx = Ctx {
        config,
        vs: &vs,
        opt: &mut opt,
        plugins: &plugins,
        train_len: data.train.len,
    };
    let started = Instant::now();
    let (mut samples, mut last_eval) = (0u64, None);
    let stop_at = config.stop_after_steps.unwrap_or(u64::MAX);
    let mut last_decision = None;
    while !clock.finished() && clock.step() < stop_at {
        let t0 = Instant::now();
        let decision = match policies.decide(&clock) {
            Ok(d) => d,
            Err(e) => {
                // Policies are deterministic, so every rank meets the same fault here.
                let at = (&ctx, &clock, epochs_evaluated);
                return Err(stop(
                    e,
                    at,
                    world,
                    &compressor,
                    &mut metrics,
                    &mut progress,
                )?);
            }
        };
        let t_policy = t0.elapsed().as_secs_f64();
        let state = decision.state;
        let batch = decision.global_batch as usize;
        let micro = micro_batches(batch / world.size(), config.max_micro_batch as usize);
        let global_indices = order.take(state.samples_seen, batch);
        let indices = parallel::shard(&global_indices, world.rank(), world.size());

        let t1 = Instant::now();
        ctx.opt.zero_grad();
        let mut loss_sum = Tensor::zeros([], (Kind::Double, device));
        let mut offset = 0;
        for &m in &micro {
            let idx = Tensor::from_slice(&indices[offset..offset + m]).to_device(device);
            offset += m;
            let x = data.train.images.index_select(0, &idx);
            let y = data.train.labels.index_select(0, &idx);
            let loss = loss::smoothed_cross_entropy(
                &model.forward_t(&x, true),
                &y,
                f64::from(decision.label_smoothing),
            );
            // Scaled by micro/global, not micro/worker: the gradients are pre-divided by the
            // world size, and the collective's sum is the mean over the global batch.
            (&loss * (m as f64 / batch as f64)).backward();
            loss_sum += loss.detach().to_kind(Kind::Double) * m as f64;
        }
        let mut t_compute = t1.elapsed().as_secs_f64();
        let weights: Vec<&Tensor> = ctx.opt.weights().map(|(_, t)| t).collect();
        let uncompressed = |traffic| Exchanged {
            traffic,
            payload_bytes: 4 * params,
            floats: params,
        };
        let exchanged = match (&mut compressor, policies.codec_mut()) {
            (Some(c), Some(codec)) => {
                match c.exchange(world, config.allreduce, codec, &weights, state.step) {
                    Ok(x) => x,
                    Err(e) => {
                        // Every rank gets here (the exchange agrees on faults), with weights
                        // and residuals still those before this step.
                        let at = (&ctx, &clock, epochs_evaluated);
                        return Err(stop(
                            e,
                            at,
                            world,
                            &compressor,
                            &mut metrics,
                            &mut progress,
                        )?);
                    }
                }
            }
            _ if world.size() > 1 => {
                uncompressed(buckets.all_reduce(world, config.allreduce, &weights)?)
            }
            _ => uncompressed(Traffic::default()),
        };
        drop(weights);
        let mut traffic = exchanged.traffic;
        let loss = if world.size() > 1 {
            // Every rank must see the same loss: policies read it as `last-loss`.
            let mut l = [loss_sum.double_value(&[]) as f32];
            let t = world.all_reduce_sum(Algorithm::Mpi, &mut l)?;
            traffic.bytes_sent += t.bytes_sent;
            traffic.seconds += t.seconds;
            f64::from(l[0]) / batch as f64
        } else {
            loss_sum.double_value(&[]) / batch as f64
        };
        let t2 = Instant::now();
        ctx.opt.step(decision.lr);
        t_compute += t2.elapsed().as_secs_f64();
        if !loss.is_finite() {
            metrics.flush()?;
            progress.finish();
            bail!(
                "training diverged at step {}: loss {loss} (lr {}, batch {batch}); the last checkpoint is in {}",
                state.step,
                decision.lr,
                config.out.display()
            );
        }

        clock.advance(decision.global_batch, Some(loss));
        samples += batch as u64;
        let wall = t0.elapsed().as_secs_f64();
        metrics.write(&Record::Step(StepRecord {
            step: state.step,
            epoch: state.epoch_fraction,
            lr: decision.lr,
            global_batch: decision.global_batch,
            micro_batches: micro.len() as u32,
            label_smoothing: decision.label_smoothing,
            loss,
            samples_per_s: batch as f64 / wall,
            compute_s: t_compute,
            communication_s: traffic.seconds,
            bytes_sent: traffic.bytes_sent,
            payload_bytes: exchanged.payload_bytes,
            compression_ratio: exchanged.compression_ratio(),
            policy_s: t_policy,
        }))?;
        let after = clock.state();
        progress.step(
            clock.step(),
            after.total_steps,
            after.epoch_fraction,
            loss,
            decision.lr,
            batch as f64 / wall,
        );

        let completed = after.epoch.min(config.epochs);
        if completed > epochs_evaluated {
            epochs_evaluated = completed;
            let e = eval::evaluate(model.as_ref(), &data.test);
            clock.set_metric(e.accuracy);
            metrics.write(&Record::Eval(EvalRecord {
                step: clock.step(),
                epoch: completed,
                test_loss: e.loss,
                test_acc: e.accuracy,
                elapsed_s: started.elapsed().as_secs_f64(),
            }))?;
            metrics.flush()?;
            progress.line(&format!(
                "epoch {completed}/{}: test loss {:.4}, test accuracy {:.2}%",
                config.epochs,
                e.loss,
                100.0 * e.accuracy
            ));
            last_eval = Some(e);
        }
        if config.consistency_every > 0 && clock.step().is_multiple_of(config.consistency_every) {
            consistency(world, clock.step(), &decision, ctx.opt)?;
        }
        if config.checkpoint_every > 0
            && clock.step().is_multiple_of(config.checkpoint_every)
            && !clock.finished()
        {
            metrics.flush()?;
            save(
                &ctx,
                world,
                &compressor,
                &clock,
                epochs_evaluated,
                "periodic",
            )?;
        }
        last_decision = Some(decision);
    }
    metrics.flush()?;
    if world.size() > 1 {
        if let Some(d) = &last_decision {
            consistency(world, clock.step(), d, ctx.opt)?;
        }
        progress.line(&format!(
            "consistency: weights and policy outputs bit-identical on all {} ranks at step {}",
            world.size(),
            clock.step()
        ));
    }
    let reason = if clock.finished() { "final" } else { "stopped" };
    let checkpoint = save(&ctx, world, &compressor, &clock, epochs_evaluated, reason)?;
    progress.finish();
    let elapsed = started.elapsed().as_secs_f64();
    Ok(Summary {
        steps: clock.step(),
        last_eval,
        last_loss: clock.state().last_loss,
        weights_blake3: weights_blake3(&vs),
        checkpoint,
        samples_per_s: if elapsed > 0.0 {
            samples as f64 / elapsed
        } else {
            0.0
        },
    })
}

/// What saving a checkpoint needs besides the clock.
struct Ctx<'a> {
    config: &'a TrainConfig,
    vs: &'a VarStore,
    opt: &'a mut Sgd,
    plugins: &'a [PluginRecord],
    train_len: usize,
}

/// After a plugin fault: flushes the metrics, saves the state before the current step and
/// returns the fault with where that state went.
fn stop(
    fault: impl std::error::Error + Send + Sync + 'static,
    (ctx, clock, epochs_evaluated): (&Ctx, &Clock, u32),
    world: &World,
    compressor: &Option<Compressor>,
    metrics: &mut Metrics,
    progress: &mut Progress,
) -> Result<anyhow::Error> {
    metrics.flush()?;
    let saved = save(
        ctx,
        world,
        compressor,
        clock,
        epochs_evaluated,
        "plugin fault",
    )?;
    progress.finish();
    Ok(anyhow::Error::new(fault).context(format!(
        "training stopped; state before step {} saved to {} (resume with --resume)",
        clock.step(),
        saved.display()
    )))
}

/// Saves a checkpoint on rank 0 (every rank takes part: the error-feedback residuals of all
/// ranks go into it); returns its path.
fn save(
    ctx: &Ctx,
    world: &World,
    compressor: &Option<Compressor>,
    clock: &Clock,
    epochs_evaluated: u32,
    reason: &str,
) -> Result<PathBuf> {
    let residuals = match compressor {
        Some(c) => c.checkpoint_tensors(world)?,
        None => Vec::new(),
    };
    if world.is_root() {
        ctx.save(clock, epochs_evaluated, reason, residuals)
    } else {
        Ok(ctx.config.out.join(checkpoint::JSON_NAME))
    }
}

impl Ctx<'_> {
    fn save(
        &self,
        clock: &Clock,
        epochs_evaluated: u32,
        reason: &str,
        extra: Vec<(String, Tensor)>,
    ) -> Result<PathBuf> {
        let state = clock.state();
        let mut tensors: Vec<(String, Tensor)> = self
            .vs
            .variables()
            .into_iter()
            .map(|(n, t)| (format!("{MODEL}{n}"), t))
            .collect();
        tensors.extend(self.opt.state());
        tensors.extend(extra);
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
            epochs_evaluated,
            train_len: self.train_len,
            config: self.config.clone(),
            plugins: self.plugins.to_vec(),
        };
        checkpoint::save(&self.config.out, meta, &tensors)
    }
}

fn plugin_records(policies: &PolicySet) -> Vec<PluginRecord> {
    PolicyKind::EVERY
        .iter()
        .filter_map(|k| policies.get(*k))
        .map(|p: &Plugin| PluginRecord {
            kind: p.kind().to_string(),
            file: p.label().to_string(),
            blake3: p.facts().blake3.clone(),
            name: p.info().name.clone(),
            version: p.info().version.clone(),
            params: p
                .params()
                .iter()
                .map(|(k, v)| (k.clone(), crate::plugin::params::render(v)))
                .collect(),
        })
        .collect()
}

/// Refuses a resume that would not continue the same run.
fn check_resumable(
    config: &TrainConfig,
    meta: &Meta,
    plugins: &[PluginRecord],
    train_len: usize,
    path: &std::path::Path,
) -> Result<()> {
    let mut problems = config.resume_mismatches(&meta.config);
    if meta.train_len != train_len {
        problems.push(format!(
            "training set: checkpoint has {} samples, this run has {train_len}",
            meta.train_len
        ));
    }
    let identity = |ps: &[PluginRecord]| -> Vec<String> {
        ps.iter()
            .map(|p| {
                format!(
                    "{} {} (blake3 {}…, params {:?})",
                    p.kind,
                    p.name,
                    &p.blake3[..12.min(p.blake3.len())],
                    p.params
                )
            })
            .collect()
    };
    let (now, then) = (identity(plugins), identity(&meta.plugins));
    if now != then {
        problems.push(format!(
            "policy plugins: checkpoint has [{}], this run has [{}]",
            then.join("; "),
            now.join("; ")
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        bail!(
            "cannot resume from {}: it belongs to a different run:\n  {}",
            path.display(),
            problems.join("\n  ")
        )
    }
}

fn restore(
    vs: &VarStore,
    opt: &mut Sgd,
    tensors: &[(String, Tensor)],
    last_lr: Option<f64>,
) -> Result<()> {
    let _guard = tch::no_grad_guard();
    for (name, mut var) in vs.variables() {
        let key = format!("{MODEL}{name}");
        let saved = tensors
            .iter()
            .find(|(n, _)| *n == key)
            .map(|(_, t)| t)
            .with_context(|| format!("no tensor `{key}`"))?;
        if saved.size() != var.size() {
            bail!(
                "tensor `{key}` has shape {:?}, the model needs {:?}",
                saved.size(),
                var.size()
            );
        }
        var.copy_(&saved.to_device(var.device()));
    }
    opt.load_state(tensors, last_lr).map_err(anyhow::Error::msg)
}

/// blake3 over every variable's name and bytes, in name order.
pub fn weights_blake3(vs: &VarStore) -> String {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    parallel::tensors_hash(vars.iter().map(|(n, t)| (n.as_str(), t)))
        .finalize()
        .to_hex()
        .to_string()
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

/// The cross-rank check after `step`: the policies' outputs and the weights.
fn consistency(world: &World, step: u64, d: &crate::policy::Decision, opt: &Sgd) -> Result<()> {
    parallel::check_consistent(
        world,
        step,
        "policy outputs (lr, batch, ε)",
        parallel::decision_digest(d.lr, d.global_batch, d.label_smoothing),
    )?;
    parallel::check_consistent(
        world,
        step,
        "weights",
        parallel::tensors_digest(opt.weights()),
    )
}
