//! `lsgd-host run`: train a model, the policies given as plugins.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use super::args::{LimitArgs, PolicyArgs};
use crate::collective::survive::Loss;
use crate::collective::{Algorithm, World, parse_shape};
use crate::model::{Arch, ModelSpec, ScriptFile, Shortcut};
use crate::optim::{AdamWConfig, OptimizerKind, SgdConfig, SgdForm};
use crate::policy::OnFault;
use crate::precision::{MixedPrecision, Precision};
use crate::train::augment::Augment;
use crate::train::config::{LoseRank, Mode, Slowdown, Tolerance};
use crate::train::data::DatasetKind;
use crate::train::exchange::ErrorFeedback;
use crate::train::trainer::Start;
use crate::train::{DeviceChoice, Invocation, Reporting, RunConfig, TrainConfig, Trainer};

/// `--on-plugin-fault`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum FaultAction {
    /// Stop the run after a checkpoint.
    Abort,
    /// Keep the last good output, recreate the instance, go on.
    HoldLast,
}

impl RunArgs {
    /// Whether the run asks for `--fault-tolerance`.
    pub fn tolerant(&self) -> bool {
        self.fault_tolerance
    }

    /// The policies' fault handling the flags ask for.
    fn on_fault(&self) -> Result<OnFault> {
        Ok(match self.on_plugin_fault {
            FaultAction::Abort => OnFault::Abort,
            FaultAction::HoldLast if self.max_plugin_faults < 2 => {
                bail!("--max-plugin-faults must be at least 2 with --on-plugin-fault hold-last")
            }
            FaultAction::HoldLast => OnFault::HoldLast {
                max_in_a_row: self.max_plugin_faults,
            },
        })
    }
}

/// Arguments of `run`. Every flag can also be a key of the `--config` TOML file.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// A TOML file of settings, keys named as the flags (`epochs = 90`, `nesterov = true`,
    /// `set = ["schedule.warmup_epochs=5"]`); flags on the command line win.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    policies: PolicyArgs,
    #[command(flatten)]
    limits: LimitArgs,
    /// What a policy plugin's fault does (a trap, its budget spent, an invalid output): `abort`
    /// stops the run after a checkpoint; `hold-last` keeps the plugin's last good output for
    /// that step, recreates its instance and goes on (codec faults always abort).
    #[arg(long, value_enum, default_value_t = FaultAction::Abort)]
    on_plugin_fault: FaultAction,
    /// With `--on-plugin-fault hold-last`: faults in a row of one plugin at which the run
    /// stops anyway.
    #[arg(long, default_value_t = 3, value_name = "N")]
    max_plugin_faults: u32,
    /// Network to train: mlp, cnn, resnet, or the path of a TorchScript file
    /// (`torch.jit.script(model).save("model.pt")`; docs/data.md).
    #[arg(long, default_value = "cnn", value_parser = parse_model, value_name = "NAME|FILE.pt")]
    model: ModelArg,
    /// ResNet depth, 6n + 2 (20, 32, 44, 56, 110 are He et al.'s CIFAR ResNets).
    #[arg(long, default_value_t = 20)]
    depth: u32,
    /// ResNet shortcuts where the shape changes: `a`, identity with subsampling and zero
    /// channels (He et al.'s CIFAR nets, no parameters), or `b`, 1×1 convolution + BatchNorm.
    #[arg(long, value_enum, default_value_t = Shortcut::A)]
    shortcut: Shortcut,
    /// Zero γ in the last BatchNorm of each residual block (Goyal et al. §5.1).
    #[arg(long)]
    zero_init_residual: bool,
    /// Epochs to train.
    #[arg(long, default_value_t = 3)]
    epochs: u32,
    /// Global batch at step 0 (a batch-size plugin may change it).
    #[arg(long, default_value_t = 256)]
    global_batch: u32,
    /// Largest micro-batch per forward/backward pass; larger worker batches are accumulated.
    #[arg(long, default_value_t = 512)]
    max_micro_batch: u32,
    /// Learning rate at --reference-batch (Goyal: 0.1 per 256).
    #[arg(long, default_value_t = 0.1)]
    base_lr: f64,
    /// Batch size --base-lr applies to (the schedule plugin scales it).
    #[arg(long, default_value_t = 256)]
    reference_batch: u32,
    /// The update rule: SGD with momentum, or AdamW (decoupled weight decay = --weight-decay).
    #[arg(long, value_enum, default_value_t = OptimizerKind::Sgd)]
    optimizer: OptimizerKind,
    /// AdamW's β1.
    #[arg(long, default_value_t = 0.9)]
    adam_beta1: f64,
    /// AdamW's β2.
    #[arg(long, default_value_t = 0.999)]
    adam_beta2: f64,
    /// AdamW's ε.
    #[arg(long, default_value_t = 1e-8)]
    adam_eps: f64,
    /// Momentum (SGD).
    #[arg(long, default_value_t = 0.9)]
    momentum: f64,
    /// Nesterov momentum.
    #[arg(long)]
    nesterov: bool,
    /// Weight decay λ, applied in the update (not through the loss).
    #[arg(long, default_value_t = 1e-4)]
    weight_decay: f64,
    /// Exempt BatchNorm γ/β and biases (parameters with < 2 dimensions) from weight decay.
    #[arg(long)]
    no_decay_bn_bias: bool,
    /// Update equations: `pytorch` (v ← m·v + d; w ← w − η·v) or `goyal` (u ← m·u + η·d;
    /// w ← w − u, with momentum correction when the LR changes).
    #[arg(long, value_enum, default_value_t = SgdForm::Pytorch)]
    sgd_form: SgdForm,
    /// With --sgd-form goyal: leave out the momentum correction (Goyal's pitfall, for study).
    #[arg(long)]
    no_momentum_correction: bool,
    /// Precision of the forward/backward passes: `bf16` or `fp16` autocast them (convolutions
    /// and matrix products in 16 bits), keeping fp32 master weights and optimizer state; fp16
    /// scales the loss dynamically.
    #[arg(long, value_enum, default_value_t = Precision::Fp32)]
    precision: Precision,
    /// With --precision fp16: the initial loss scale (halved on every step whose gradients
    /// overflow, which is then skipped).
    #[arg(long, default_value_t = 65536.0, value_name = "S")]
    loss_scale: f64,
    /// With --precision fp16: double the loss scale after N steps in a row without overflow.
    #[arg(long, default_value_t = 2000, value_name = "N")]
    loss_scale_growth_interval: u32,
    /// Seed of initialisation and data order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// libtorch intra-op threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// The data set: fashion-mnist (installed by the setup), mnist, cifar10, cifar100,
    /// imagefolder, npz or safetensors (docs/data.md has each layout).
    #[arg(long, value_enum, default_value_t = DatasetKind::FashionMnist)]
    dataset: DatasetKind,
    /// Where the data set is: its directory (the `.npz` / `.safetensors` file itself, or a
    /// directory holding one); defaults to the Debian package's directory for fashion-mnist.
    #[arg(long, alias = "data", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Training augmentation: `cifar` (random crop from a 4-pixel zero padding, horizontal
    /// flip), `imagenet` (random-resized crop and flip; image folders) or none.
    #[arg(long, value_enum, default_value_t = Augment::None)]
    augment: Augment,
    /// Side of the square images made from image files (--dataset imagefolder): the training
    /// crop, and the centre crop after resizing to size·256/224 for evaluation.
    #[arg(long, default_value_t = crate::train::config::default_image_size(), value_name = "PX")]
    image_size: u32,
    /// Threads decoding image files a step ahead of training (--dataset imagefolder).
    #[arg(long, default_value_t = crate::train::config::default_loader_threads(), value_name = "N")]
    loader_threads: usize,
    /// At the end, write the trained weights here as safetensors, named as the model names
    /// them (a TorchScript model is also saved whole, as FILE with the extension `.pt`).
    #[arg(long, value_name = "FILE")]
    save_model: Option<PathBuf>,
    /// Run directory: metrics.jsonl, checkpoints.
    #[arg(long, default_value = "out/run")]
    out: PathBuf,
    /// Train on the first N training samples.
    #[arg(long, value_name = "N")]
    train_subset: Option<usize>,
    /// Evaluate on the first N test samples.
    #[arg(long, value_name = "N")]
    test_subset: Option<usize>,
    /// Continue from a checkpoint (its checkpoint.json, or the run directory).
    #[arg(long, value_name = "CKPT")]
    resume: Option<PathBuf>,
    /// With --resume: continue the checkpoint with other policy plugins, other plugin
    /// parameters or another --epochs (one whose end it has not passed), e.g. after fixing the
    /// plugin that stopped it. Weights, optimizer, loss scaler and step carry over; the new
    /// plugins start at the checkpoint's step, a changed stateful plugin from a fresh state, a
    /// changed codec with zero error feedback; metrics.jsonl records a `policy-change`. Every
    /// other setting must still match.
    #[arg(long, requires = "resume")]
    allow_policy_change: bool,
    /// Start a new run in an --out that holds another run's checkpoints or metrics, removing
    /// them first (without it such an --out is refused); nothing is removed when --resume
    /// continues the run in --out itself (as `launch` does on a restart).
    #[arg(long)]
    overwrite: bool,
    /// Write a checkpoint every N steps (0: only at the end and on a plugin fault).
    #[arg(long, default_value_t = 0, value_name = "N")]
    checkpoint_every: u64,
    /// Keep the newest K checkpoints in --out (K >= 1); older ones are removed once a new one
    /// is safely on disk.
    #[arg(long, default_value_t = 2, value_name = "K",
          value_parser = clap::value_parser!(u32).range(1..))]
    keep_checkpoints: u32,
    /// Stop with a checkpoint once N steps have been taken (resume later with --resume).
    #[arg(long, value_name = "N")]
    stop_after_steps: Option<u64>,
    /// Where tensors live.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    device: DeviceChoice,
    /// Gradient all-reduce algorithm when run under mpirun with more than one rank.
    #[arg(long, value_enum, default_value_t = Algorithm::Mpi)]
    allreduce: Algorithm,
    /// Gradients are fused into buckets of about this many MiB per collective call (the
    /// first, as DDP's, at most 1 MiB), laid out in the order the backward pass makes them.
    #[arg(long, default_value_t = 25.0, value_name = "MIB")]
    bucket_mb: f64,
    /// Exchange each bucket while the backward pass computes the rest, as DDP does (the
    /// default wherever the settings allow: not with --precision fp16, --local-clip-norm or
    /// --mode async, and with --fault-tolerance only if asked for). The weights end the same
    /// either way.
    #[arg(long, overrides_with = "no_overlap")]
    overlap: bool,
    /// Exchange the gradients after the backward pass.
    #[arg(long, overrides_with = "overlap")]
    no_overlap: bool,
    /// Every N steps, check that all ranks hold bit-identical weights and policy outputs
    /// (0: only at the end).
    #[arg(long, default_value_t = 100, value_name = "N")]
    consistency_every: u64,
    /// With --codec: keep what the codec drops, per bucket and rank, and send it later; saved
    /// in checkpoints. `residual` (the flag alone; EF-SGD): p = g + e, e ← p − decode(own
    /// payload). `mean` (PyTorch powerSGD_hook's residual): e ← p − decode(Σ payloads)/k, the
    /// rank's input minus the ranks' mean reconstruction. `momentum` (Deep Gradient
    /// Compression's momentum correction, with SGD): the
    /// rank accumulates its velocity u ← m·u + g + λw into v ← v + u, the codec encodes v,
    /// v ← v − decode(own payload), u is zeroed where that payload is nonzero, and the
    /// optimizer applies the exchanged sum with no momentum or decay of its own.
    #[arg(long, value_enum, value_name = "MODE", num_args = 0..=1,
          default_value_t = ErrorFeedback::Off, default_missing_value = "residual")]
    error_feedback: ErrorFeedback,
    /// Clip each rank's own gradient to a total L2 norm of C/√k (k ranks) before error
    /// feedback accumulates it (DGC's local gradient clipping; C bounds the summed gradient).
    #[arg(long, value_name = "C")]
    local_clip_norm: Option<f64>,
    /// `sync`: data parallelism, gradients all-reduced every step. `async`: asynchronous SGD
    /// with rank 0 as parameter server; the other ranks pull weights and push gradients of
    /// their own batches (of --global-batch samples each) without waiting for each other.
    #[arg(long, value_enum, default_value_t = Mode::Sync)]
    mode: Mode,
    /// Make rank R slower on purpose (with --slow-ms): it sleeps before each gradient, a
    /// straggler for comparing --mode sync and async.
    #[arg(long, value_name = "R", requires = "slow_ms")]
    slow_rank: Option<usize>,
    /// Milliseconds --slow-rank sleeps before each gradient it computes.
    #[arg(long, value_name = "MS", requires = "slow_rank")]
    slow_ms: Option<u64>,
    /// Seconds a rank may wait in one collective without progress (a lost link or host, a
    /// frozen peer) before it ends with an error naming the rank and host it waits on and the
    /// newest checkpoint (exit status 75), instead of hanging; `0` or `off`: wait forever.
    #[arg(long, default_value = "60", value_name = "S", value_parser = parse_timeout)]
    pub(crate) collective_timeout: Duration,
    /// A lost rank costs the step in flight, not the run: the survivors agree on the loss,
    /// shrink the world (a majority of it goes on; the rest stops) and redo the step with the
    /// same global batch, as a resume on fewer ranks would. Needs MPI's ULFM (Open MPI 5 under
    /// `mpirun --with-ft ulfm`; `lsgd-host launch` sets it up); --collective-timeout becomes
    /// the time after which a silent rank counts as lost. docs/cluster.md has the details.
    #[arg(long)]
    fault_tolerance: bool,
    /// With --fault-tolerance: after a shrink, start a replacement for each lost rank (MPI's
    /// spawn, placed by mpirun) at the next step boundary; it receives the state from rank 0
    /// as a resume would, and the world grows back to its size.
    #[arg(long, requires = "fault_tolerance")]
    grow_back: bool,
    /// With --fault-tolerance: the fewest ranks the world may shrink to; below it the survivors
    /// stop with a checkpoint of the state before the step (launch then restarts the job).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        requires = "fault_tolerance"
    )]
    min_np: usize,
    /// Rank R (of the starting world; or several, `R,R…`) kills itself, or with `:stop` stops
    /// itself (SIGSTOP), before step STEP's exchange: for tests and scripts/bench-faults.sh,
    /// with or without --fault-tolerance.
    #[arg(long, value_name = "R[,R…]@STEP[:stop]", value_parser = parse_lose_rank)]
    lose_rank: Option<LoseRank>,
    /// Rows × columns of the torus2d all-reduce, e.g. 4x8 (default: near-square).
    #[arg(long, value_name = "XxY", value_parser = parse_shape)]
    torus_shape: Option<(usize, usize)>,
    /// Also write metrics.csv and eval.csv.
    #[arg(long)]
    csv: bool,
    /// No progress bar or log lines.
    #[arg(long, short)]
    quiet: bool,
}

impl RunArgs {
    fn train_config(&self) -> Result<TrainConfig> {
        Ok(TrainConfig {
            run: self.run_config()?,
            invocation: Invocation {
                threads: self
                    .threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
                data: data_dir(self.dataset, self.data_dir.as_deref())?,
                device: self.device,
                out: self.out.clone(),
                checkpoint_every: self.checkpoint_every,
                stop_after_steps: self.stop_after_steps,
                csv: self.csv,
                allreduce: self.allreduce,
                consistency_every: self.consistency_every,
                slow: self
                    .slow_rank
                    .zip(self.slow_ms)
                    .map(|(rank, ms)| Slowdown { rank, ms }),
                tolerance: self.fault_tolerance.then_some(Tolerance {
                    min_np: self.min_np,
                    grow_back: self.grow_back,
                }),
                lose: self.lose_rank.clone(),
                keep_checkpoints: self.keep_checkpoints,
                overwrite: self.overwrite,
                loader_threads: self.loader_threads,
                save_model: self.save_model.clone(),
                overlap: match (self.overlap, self.no_overlap) {
                    (true, _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                },
            },
        })
    }

    fn run_config(&self) -> Result<RunConfig> {
        let (arch, script) = match &self.model {
            ModelArg::Builtin(arch) => (*arch, None),
            ModelArg::File(path) => (Arch::Script, Some(ScriptFile::new(path)?)),
        };
        Ok(RunConfig {
            model: ModelSpec {
                arch,
                depth: self.depth,
                zero_init_residual: self.zero_init_residual,
                shortcut: self.shortcut,
                script,
            },
            sgd: SgdConfig {
                momentum: self.momentum,
                nesterov: self.nesterov,
                weight_decay: self.weight_decay,
                decay_bn_and_bias: !self.no_decay_bn_bias,
                form: self.sgd_form,
                momentum_correction: !self.no_momentum_correction,
            },
            adamw: (self.optimizer == OptimizerKind::Adamw).then_some(AdamWConfig {
                beta1: self.adam_beta1,
                beta2: self.adam_beta2,
                eps: self.adam_eps,
                weight_decay: self.weight_decay,
                decay_bn_and_bias: !self.no_decay_bn_bias,
            }),
            epochs: self.epochs,
            global_batch: self.global_batch,
            max_micro_batch: self.max_micro_batch,
            base_lr: self.base_lr,
            reference_batch: self.reference_batch,
            max_batch: self.limits.max_batch,
            seed: self.seed,
            train_subset: self.train_subset,
            test_subset: self.test_subset,
            bucket_mb: self.bucket_mb,
            error_feedback: self.error_feedback,
            local_clip_norm: self.local_clip_norm,
            mixed_precision: MixedPrecision {
                precision: self.precision,
                loss_scale: self.loss_scale,
                loss_scale_growth_interval: self.loss_scale_growth_interval,
            },
            mode: self.mode,
            dataset: self.dataset,
            augment: self.augment,
            image_size: self.image_size,
        })
    }
}

/// `--model`: a built-in network, or a TorchScript file.
#[derive(Debug, Clone)]
enum ModelArg {
    /// `mlp`, `cnn` or `resnet`.
    Builtin(Arch),
    /// The path of a `.pt` file.
    File(PathBuf),
}

/// A built-in network's name, else anything that looks like a path (a `.pt`/`.pt2` name, a
/// `/`, or an existing file): its checks (a `.pt2`, not TorchScript, no parameters) come
/// when it is loaded, with the file named.
fn parse_model(s: &str) -> Result<ModelArg, String> {
    use clap::ValueEnum as _;
    match Arch::from_str(s, true) {
        Ok(Arch::Script) => Err("give the TorchScript file itself: --model FILE.pt".into()),
        Ok(arch) => Ok(ModelArg::Builtin(arch)),
        Err(_) if s.ends_with(".pt") || s.ends_with(".pt2") || s.contains('/') => {
            Ok(ModelArg::File(PathBuf::from(s)))
        }
        Err(_) if std::path::Path::new(s).is_file() => Ok(ModelArg::File(PathBuf::from(s))),
        Err(_) => Err(format!(
            "`{s}` is neither a model (mlp, cnn, resnet) nor a TorchScript file (FILE.pt)"
        )),
    }
}

/// `--data-dir`, or the default place of a data set that has one (Fashion-MNIST's Debian
/// package); the others have no standard place, so the flag is required for them.
pub fn data_dir(dataset: DatasetKind, given: Option<&std::path::Path>) -> Result<PathBuf> {
    match (given, dataset) {
        (Some(dir), _) => Ok(dir.to_path_buf()),
        (None, DatasetKind::FashionMnist) => Ok(PathBuf::from(crate::data::DEFAULT_DIR)),
        (None, other) => bail!(
            "--dataset {other} needs --data-dir: the directory of its files (docs/data.md shows \
             the layout)"
        ),
    }
}

/// How long a rank that ends with an error waits for the others to end too before it aborts
/// the job ([`World::exit_after_error`]): ranks that agreed on a failure end within moments of
/// each other, even on a loaded machine.
const EXIT_LINGER: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `run`. On several ranks, an error is printed before MPI finalizes: finalizing waits for
/// the other ranks, which may be waiting for this one (a checkpoint or metrics file that only
/// rank 0 writes), and the error would reach the user only after the collective timeout, if
/// at all.
pub fn run(args: RunArgs) -> Result<()> {
    let config = args.train_config()?;
    let mut world = if args.fault_tolerance {
        World::init_tolerant(args.collective_timeout)?
    } else {
        World::init()?
    };
    match train(&args, &config, &mut world) {
        Err(e) if world.size() > 1 => {
            super::print_error(&e);
            world.exit_after_error(super::EXIT_ERROR.into(), EXIT_LINGER)
        }
        outcome => outcome,
    }
}

/// Trains in `world` and prints the summary (rank 0).
fn train(args: &RunArgs, config: &TrainConfig, world: &mut World) -> Result<()> {
    world.set_torus_shape(args.torus_shape)?;
    // With fault tolerance the failure detector answers a silent rank; the watchdog stays as a
    // backstop for a recovery that itself hangs.
    let backstop = if world.is_tolerant() { 3 } else { 1 };
    world.set_collective_timeout(args.collective_timeout * backstop);
    let runtime = args.limits.runtime()?;
    let mut policies = args.policies.load(&runtime, args.limits.bounds())?;
    policies.set_on_fault(args.on_fault()?);
    let start = Start {
        resume: args.resume.as_deref(),
        allow_policy_change: args.allow_policy_change,
    };
    let reporting = Reporting { quiet: args.quiet };
    let summary = Trainer::start(world, config, policies, start, reporting)?.run()?;
    if !world.is_root() {
        return Ok(());
    }
    match summary.last_eval {
        Some(e) => println!(
            "test accuracy {:.2}% (test loss {:.4}) after {} steps; {:.0} samples/s; metrics in {}",
            100.0 * e.accuracy,
            e.loss,
            summary.steps,
            summary.samples_per_s,
            config.invocation.out.join("metrics.jsonl").display()
        ),
        None => println!(
            "stopped after {} steps (no epoch completed); checkpoint {}",
            summary.steps,
            summary.checkpoint.display()
        ),
    }
    if let Some(scaler) = summary.loss_scaler {
        println!(
            "fp16 loss scale {} at the end; {} step(s) skipped on overflow (marked \"skipped\" in metrics.jsonl)",
            scaler.scale, scaler.skipped
        );
    }
    if !summary.staleness.is_empty() {
        println!("{}", staleness_line(&summary.staleness));
    }
    // Equal iff two runs ended with bit-identical weights (e.g. before and after a refactor).
    println!("weights blake3 {}", summary.weights_blake3);
    Ok(())
}

/// `--mode async`'s closing line: how stale the applied gradients were.
fn staleness_line(histogram: &std::collections::BTreeMap<u64, u64>) -> String {
    let count: u64 = histogram.values().sum();
    let mean = histogram.iter().map(|(s, n)| s * n).sum::<u64>() as f64 / count.max(1) as f64;
    let max = histogram.keys().last().copied().unwrap_or(0);
    let bins: Vec<String> = histogram.iter().map(|(s, n)| format!("{s}: {n}")).collect();
    format!(
        "asynchronous SGD: {count} gradients applied, staleness mean {mean:.2}, max {max} (steps: gradients {{{}}})",
        bins.join(", ")
    )
}

/// Turns a TOML config file into `run` flags placed before the command line's own, so that
/// the command line wins: `key = value` becomes `--key value`, `key = true` becomes `--key`
/// (`false` adds nothing), and an array repeats the flag. Keys are the long flag names, with
/// `_` or `-`; an unknown key is an error naming the file and the key.
pub fn config_args(path: &std::path::Path) -> Result<Vec<String>> {
    use clap::{Args as _, Command};
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --config {}", path.display()))?;
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("--config {}: not valid TOML", path.display()))?;
    let command = RunArgs::augment_args(Command::new("run"));
    let mut out = Vec::new();
    for (key, value) in table {
        let flag = key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()) && flag != "config")
            .with_context(|| {
                format!(
                    "--config {}: unknown key `{key}` (keys are the flags of `lsgd-host run --help`)",
                    path.display()
                )
            })?;
        let takes_value = arg.get_action().takes_values();
        let scalars = match value {
            toml::Value::Array(items) => items,
            v => vec![v],
        };
        for v in scalars {
            let text = match v {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                // A switch, or a flag whose value may be left out (`error_feedback = true`).
                toml::Value::Boolean(b)
                    if !takes_value || arg.get_num_args().is_some_and(|n| n.min_values() == 0) =>
                {
                    if b {
                        out.push(format!("--{flag}"));
                    }
                    continue;
                }
                other => anyhow::bail!(
                    "--config {}: key `{key}` is {} {}, which is not a value of --{flag}",
                    path.display(),
                    if other.is_array() { "a nested" } else { "a" },
                    other.type_str()
                ),
            };
            if !takes_value {
                anyhow::bail!(
                    "--config {}: key `{key}` is a switch; write `{key} = true`",
                    path.display()
                );
            }
            out.push(format!("--{flag}"));
            out.push(text);
        }
    }
    Ok(out)
}

/// `R@STEP`, `R,R@STEP`, with `:kill` (the default) or `:stop`.
fn parse_lose_rank(s: &str) -> Result<LoseRank, String> {
    let bad = || format!("{s:?} is not R[,R…]@STEP[:kill|:stop] (e.g. 2@10:stop)");
    let (at, how) = match s.split_once(':') {
        Some((at, "kill")) => (at, Loss::Kill),
        Some((at, "stop")) => (at, Loss::Stop),
        Some(_) => return Err(bad()),
        None => (s, Loss::Kill),
    };
    let (ranks, step) = at.split_once('@').ok_or_else(bad)?;
    Ok(LoseRank {
        ranks: (ranks.split(','))
            .map(|r| r.trim().parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?,
        step: step.trim().parse().map_err(|_| bad())?,
        how,
    })
}

/// Parses `--collective-timeout`: seconds (`10`, `2.5`), or `0`/`off` for none.
pub(crate) fn parse_timeout(s: &str) -> Result<Duration, String> {
    if s.trim() == "off" {
        return Ok(Duration::ZERO);
    }
    s.trim()
        .parse::<f64>()
        .ok()
        .and_then(|v| Duration::try_from_secs_f64(v).ok())
        .ok_or_else(|| format!("`{s}`: expected seconds (e.g. 60 or 2.5), or 0 or off"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collective_timeouts_are_seconds_or_off() {
        assert_eq!(parse_timeout("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_timeout("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_timeout("0"), Ok(Duration::ZERO));
        assert_eq!(parse_timeout("off"), Ok(Duration::ZERO));
        for bad in ["-1", "ten", "", "inf", "NaN"] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lost_ranks_are_named_with_their_step_and_how() {
        let lose = |ranks: Vec<usize>, step, how| LoseRank { ranks, step, how };
        assert_eq!(parse_lose_rank("2@10"), Ok(lose(vec![2], 10, Loss::Kill)));
        assert_eq!(
            parse_lose_rank("0,1@3:stop"),
            Ok(lose(vec![0, 1], 3, Loss::Stop))
        );
        assert_eq!(
            parse_lose_rank("1@0:kill"),
            Ok(lose(vec![1], 0, Loss::Kill))
        );
        for bad in ["2", "@3", "2@", "2@3:pause", "a@3", "2@-1", "2,@3"] {
            let err = parse_lose_rank(bad).unwrap_err();
            assert!(err.contains("R[,R…]@STEP"), "{bad}: {err}");
        }
    }
}
