//! Starting a run: the checks that need no data (settings, `--save-model`, the same plugins on
//! every rank), then data, model, optimizer, gradient exchange and clock, `--out` claimed for
//! this run, the checkpoint resumed if one is given, the metrics opened, and the line that
//! opens the run.

use std::path::Path;
use std::time::Instant;

use lsgd_collective::World;
use lsgd_policy::Role;
use lsgd_runtime::plugin::PolicyKind;
use lsgd_runtime::policy::{Clock, PolicySet, RunShape};
use tch::Device;
use tch::nn::VarStore;

use super::identity::{plugin_records, same_plugins};
use super::overlap::Overlap;
use super::resume::Resumed;
use super::windows::Windows;
use super::{Metrics, Trainer};
use crate::checkpoint::PluginRecord;
use crate::config::{Mode, RunConfig, TrainConfig};
use crate::exchange::{GradientExchange, Local};
use crate::metrics::{MetricsWriter, Record};
use crate::model::Model;
use crate::optim::{self, Optimizer, Param};
use crate::order::SampleOrder;
use crate::overlap::order;
use crate::progress::Progress;
use crate::tensors::{DataSettings, DataTensors};
use crate::{Error, Reporting, Result, data, device, rundir, tune_malloc};

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
        let plugins = settings_and_plugins(world, config, &policies)?;
        tune_malloc();
        tch::set_num_threads(config.invocation.threads as i32);
        let (run, device) = (&config.run, device(config.invocation.device)?);
        let mut data = load_data(config, device)?;
        tch::manual_seed(run.seed as i64);
        let vs = VarStore::new(device);
        let model = run.model.build(&vs.root(), data.image, data.classes)?;
        let opt = optim::build(&vs, run.sgd, run.adamw, run.error_feedback.moves_momentum());
        let tensors = tensor_descriptions(&vs, opt.params());
        let codec = policies.codec_mut().is_some();
        let sync = policies.get(PolicyKind::Sync).is_some();
        let (order, overlap) =
            readiness(world, config, &model, &mut data, opt.params(), codec, sync)?;
        let gradients = gradient_exchange(config, opt.as_ref(), &order, &mut policies)?;
        let clock = run_clock(run, data.train.len, world.size())?;
        let windows = sync.then(|| Windows::new(opt.params())).transpose()?;
        let (world_rank, world_size) = (world.rank(), world.size());
        // A replacement joins a run that claimed its directory long ago.
        if !world.joined() {
            claim_out(world, config, resume)?;
        }
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
            survival: super::survive::Survival::new(world_rank, world_size, reporting.quiet),
            overlap,
            windows,
        };
        if trainer.world.joined() {
            trainer.join()?;
            trainer.open_metrics(None, reporting)?;
            return Ok(trainer);
        }
        let resumed = resume
            .map(|path| trainer.resume(path, start.allow_policy_change, reporting.quiet))
            .transpose()?;
        trainer.open_metrics(resumed, reporting)?;
        Ok(trainer)
    }

    /// Opens the metrics (rank 0), from the checkpoint `resumed` continues if any, with the
    /// record of how a resume changed the policies, and the progress bar (rank 0 unless
    /// quiet).
    fn open_metrics(&mut self, resumed: Option<Resumed>, reporting: Reporting) -> Result<()> {
        let root = self.world.is_root();
        if root {
            let inv = &self.config.invocation;
            let from = resumed.as_ref().map(|r| &r.metrics);
            self.metrics = Metrics(Some(MetricsWriter::open(&inv.out, inv.csv, from)?));
        }
        if let Some(change) = resumed.and_then(|r| r.change) {
            self.metrics.write(&Record::PolicyChange(change))?;
            self.metrics.flush()?;
        }
        let total = self.clock.state().total_steps;
        self.progress = Progress::new(total, reporting.quiet || !root);
        Ok(())
    }

    /// The line that opens a run: the model, the data, the ranks and the gradient path.
    pub(super) fn announce(&mut self) {
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
        let path = match (&self.overlap, path.is_empty()) {
            (_, true) => path,
            (Some(_), false) => format!("{path}, overlapped with the backward pass"),
            (None, false) => format!("{path}, after the backward pass"),
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

/// The checks a run can make before it loads anything: the settings, a `--save-model` the
/// model cannot use (refused now rather than after the run), and that every rank loaded the
/// same plugins; returns what a checkpoint records of the plugins.
fn settings_and_plugins(
    world: &World,
    config: &TrainConfig,
    policies: &PolicySet,
) -> Result<Vec<PluginRecord>> {
    config.validate()?;
    if policies.get(PolicyKind::Sync).is_some() {
        config.validate_sync(policies.get(PolicyKind::LayerRate).is_some())?;
    }
    if let Some(path) = &config.invocation.save_model {
        crate::model::saved_files(&config.run.model, path)?;
    }
    let plugins = plugin_records(policies);
    same_plugins(world, &plugins)?;
    Ok(plugins)
}

/// The data set `config` names, as the tensors batches are made from on `device`.
fn load_data(config: &TrainConfig, device: Device) -> Result<DataTensors> {
    let run = &config.run;
    let dataset = data::load(run.dataset, &config.invocation.data)?;
    let settings = DataSettings {
        train_subset: run.train_subset,
        test_subset: run.test_subset,
        augment: run.augment,
        image_size: run.image_size as usize,
        seed: run.seed,
        loader_threads: config.invocation.loader_threads,
    };
    DataTensors::new(&dataset, &settings, device)
}

/// The clock of `run` over a training set of `samples` on `ranks` ranks.
fn run_clock(run: &RunConfig, samples: usize, ranks: usize) -> Result<Clock> {
    Ok(Clock::new(RunShape {
        epochs: run.epochs,
        samples_per_epoch: samples as u64,
        initial_batch: run.global_batch,
        // An asynchronous update's batch is one worker's, not split over the ranks.
        world_size: match run.mode {
            Mode::Sync => ranks as u32,
            Mode::Async => 1,
        },
        base_lr: run.base_lr,
        reference_batch: run.reference_batch,
    })?)
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

/// The order the gradients become ready in, the same on every rank, and the hooks when the
/// step overlaps its exchange with the backward pass: a synchronous run records the order once
/// (the bucket layout follows it with or without overlap, so both end with the same bits);
/// `--mode async` keeps the optimizer's order. A single process without a codec has nothing to
/// exchange, so nothing to overlap, and a sync policy's run exchanges after the update
/// (`sync`).
fn readiness(
    world: &World,
    config: &TrainConfig,
    model: &Model,
    data: &mut DataTensors,
    params: &[Param],
    codec: bool,
    sync: bool,
) -> Result<(Vec<usize>, Option<Overlap>)> {
    if config.run.mode == Mode::Async {
        return Ok(((0..params.len()).collect(), None));
    }
    let overlaps = config.overlaps() && (world.size() > 1 || codec) && !sync;
    let hooks = Overlap::new(params)?;
    let mine = hooks.record(model, data, params, world.rank())?;
    // A replacement joining survivors mid-run (`--grow-back`) cannot ask them: they agreed on
    // this order at their start, and the same model records the same one here.
    let order = if world.joined() {
        mine
    } else {
        let names: Vec<String> = params.iter().map(|p| p.name.clone()).collect();
        order::agree(world, &mine, &names, overlaps)?
    };
    Ok((order, overlaps.then_some(hooks)))
}

/// The gradient exchange of `opt`'s parameters in buckets laid out in `order` (bucket size,
/// all-reduce, codec, error feedback and local clipping as `config` says).
fn gradient_exchange(
    config: &TrainConfig,
    opt: &dyn Optimizer,
    order: &[usize],
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
    if policies.get(PolicyKind::LayerRate).is_some() {
        run.validate_layer_rate()?;
    }
    GradientExchange::new(
        &shapes,
        order,
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
