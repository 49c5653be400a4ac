//! Argument groups shared by several subcommands, and their resolution into runtime settings.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::plugin::{Cache, EngineOptions, Limits, PolicyKind, Runtime};
use crate::policy::{Bounds, Clock, Composition, PolicySet, RunShape};
use crate::trace::{Drift, Inputs, Norms, parse_series, read_input};

/// The shape of the (possibly imaginary) run whose states the policies see.
#[derive(Args, Debug, Clone)]
pub struct ShapeArgs {
    /// Epochs to run.
    #[arg(long)]
    pub epochs: Option<u32>,
    /// Optimiser steps per epoch at --global-batch (the data set is steps × batch samples).
    #[arg(long)]
    pub steps_per_epoch: Option<u64>,
    /// Global batch at step 0.
    #[arg(long)]
    pub global_batch: Option<u32>,
    /// Data-parallel workers k [default: 1].
    #[arg(long)]
    pub world_size: Option<u32>,
    /// Learning rate at --reference-batch (Goyal: 0.1 per 256) [default: 0.1].
    #[arg(long)]
    pub base_lr: Option<f64>,
    /// Batch size --base-lr applies to [default: 256].
    #[arg(long)]
    pub reference_batch: Option<u32>,
}

// No field is required or defaulted by clap, so that `compare`, which needs a shape only for
// step policies, can tell whether one was given; `clock` asks for the missing ones.
impl ShapeArgs {
    /// Whether any shape flag was given.
    pub fn given(&self) -> bool {
        self.epochs.is_some()
            || self.steps_per_epoch.is_some()
            || self.global_batch.is_some()
            || self.world_size.is_some()
            || self.base_lr.is_some()
            || self.reference_batch.is_some()
    }

    /// Data-parallel workers.
    pub fn world_size(&self) -> u32 {
        self.world_size.unwrap_or(1)
    }

    /// A clock at step 0 for this shape.
    pub fn clock(&self) -> Result<Clock> {
        let (Some(epochs), Some(steps), Some(batch)) =
            (self.epochs, self.steps_per_epoch, self.global_batch)
        else {
            bail!(
                "the run's shape is needed: --epochs, --steps-per-epoch and --global-batch \
                 (--world-size, --base-lr and --reference-batch are optional)"
            );
        };
        let samples = steps
            .checked_mul(u64::from(batch))
            .context("--steps-per-epoch × --global-batch overflows")?;
        Ok(Clock::new(RunShape {
            epochs,
            samples_per_epoch: samples,
            initial_batch: batch,
            world_size: self.world_size(),
            base_lr: self.base_lr.unwrap_or(0.1),
            reference_batch: self.reference_batch.unwrap_or(256),
        })?)
    }
}

/// Sandbox limits and output bounds.
#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Memory cap of each plugin instance, MiB.
    #[arg(long, default_value_t = 64, value_name = "MIB")]
    pub plugin_memory_mb: usize,
    /// Wall-clock backstop of each policy call, ms (setup and codec calls get 100 times it);
    /// the budget proper is fuel, the same on every rank whatever the load.
    #[arg(long, default_value_t = Limits::default().deadline_ms, value_name = "MS")]
    pub plugin_deadline_ms: u64,
    /// Fuel of each policy call, in units of about one WebAssembly instruction.
    #[arg(long, default_value_t = Limits::default().fuel, value_name = "UNITS")]
    pub plugin_fuel: u64,
    /// Fuel of each codec call per float it handles (bucket plus input payloads), on top of a
    /// fixed base.
    #[arg(long, default_value_t = Limits::default().codec_fuel_per_float, value_name = "UNITS")]
    pub codec_fuel_per_float: u64,
    /// Largest plugin component the host compiles, MiB.
    #[arg(long, default_value_t = Limits::default().max_component_bytes >> 20, value_name = "MIB")]
    pub plugin_max_mb: u64,
    /// Largest global batch a batch-size policy may return.
    #[arg(long, default_value_t = Bounds::default().max_batch)]
    pub max_batch: u32,
    /// Compile codec plugins with canonical NaNs, as policies always are: for ranks on CPUs of
    /// different architectures (NaN bit patterns differ between x86 and Arm). Slower codecs.
    #[arg(long)]
    pub codec_canonical_nans: bool,
}

impl LimitArgs {
    /// A runtime with these limits and the cache from the environment.
    pub fn runtime(&self) -> Result<Runtime> {
        if self.plugin_memory_mb == 0
            || self.plugin_deadline_ms == 0
            || self.plugin_fuel == 0
            || self.plugin_max_mb == 0
        {
            bail!(
                "--plugin-memory-mb, --plugin-deadline-ms, --plugin-fuel and --plugin-max-mb \
                 must be at least 1"
            );
        }
        let limits = Limits {
            memory_bytes: self.plugin_memory_mb << 20,
            deadline_ms: self.plugin_deadline_ms,
            fuel: self.plugin_fuel,
            codec_fuel_per_float: self.codec_fuel_per_float,
            max_component_bytes: self.plugin_max_mb.saturating_mul(1 << 20),
            ..Limits::default()
        };
        let options = EngineOptions {
            canonical_codec_nans: self.codec_canonical_nans,
            ..EngineOptions::default()
        };
        Ok(Runtime::with_options(Cache::from_env(), limits, options)?)
    }

    /// The output bounds.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            max_batch: self.max_batch,
        }
    }
}

/// The policy plugins of a run and their parameters.
#[derive(Args, Debug, Clone)]
pub struct PolicyArgs {
    /// Learning-rate schedule plugin (a path, or a name such as `warmup`).
    #[arg(long, value_name = "PLUGIN")]
    pub schedule: Option<String>,
    #[command(flatten)]
    pub compose: ComposeArgs,
    /// Batch-size controller plugin.
    #[arg(long, value_name = "PLUGIN")]
    pub batch_size: Option<String>,
    /// Label-smoothing plugin.
    #[arg(long, value_name = "PLUGIN")]
    pub label_smoothing: Option<String>,
    /// Gradient-compression codec plugin (contract 0.2), applied to every gradient bucket.
    #[arg(long, value_name = "PLUGIN")]
    pub codec: Option<String>,
    /// Layer-wise rate plugin (contract 0.3): one LR multiplier per parameter tensor each step
    /// (`lars` with SGD, `lamb` with AdamW).
    #[arg(long, value_name = "PLUGIN")]
    pub layer_rate: Option<String>,
    /// Synchronisation policy plugin (contract 0.5): which steps the ranks take on their own,
    /// when they average, and the outer step on the averaged pseudo-gradient (`local-sgd`,
    /// `post-local-sgd`, `diloco`, `adaptive-period`).
    #[arg(long, value_name = "PLUGIN")]
    pub sync: Option<String>,
    /// A plugin parameter, `schedule.KEY=VALUE`, `batch_size.KEY=VALUE`,
    /// `label_smoothing.KEY=VALUE`, `codec.KEY=VALUE`, `layer_rate.KEY=VALUE` or
    /// `sync.KEY=VALUE` (`schedule.N.KEY=VALUE` for part N of a composed schedule); repeatable.
    #[arg(long = "set", value_name = "KIND.KEY=VALUE")]
    pub set: Vec<String>,
}

impl PolicyArgs {
    /// Loads and configures every given plugin.
    pub fn load(&self, runtime: &Runtime, bounds: Bounds) -> Result<PolicySet> {
        let given = [
            (PolicyKind::Schedule, &self.schedule),
            (PolicyKind::BatchSize, &self.batch_size),
            (PolicyKind::LabelSmoothing, &self.label_smoothing),
            (PolicyKind::Codec, &self.codec),
            (PolicyKind::LayerRate, &self.layer_rate),
            (PolicyKind::Sync, &self.sync),
        ];
        let settings = parse_settings(&self.set, &PolicyKind::EVERY.map(|k| k.set_prefix()))?;
        for (prefix, key, _) in &settings {
            let (kind, path) = given
                .iter()
                .find(|(k, _)| k.set_prefix() == prefix)
                .expect("prefix was validated");
            if path.is_none() {
                bail!(
                    "--set {prefix}.{key}=… given, but no {} plugin",
                    kind.flag()
                );
            }
        }
        let (composition, later) = self.compose.composition()?;
        let prefix = PolicyKind::Schedule.set_prefix();
        let mut parts = schedule_parts(&settings_for(&settings, prefix), later.len())?;
        let mut plugins = Vec::new();
        for (kind, path) in given {
            if let Some(path) = path {
                let mine = match kind {
                    PolicyKind::Schedule => std::mem::take(&mut parts[0]),
                    _ => settings_for(&settings, kind.set_prefix()),
                };
                plugins.push(runtime.load_configured(path, Some(kind), &mine)?);
            }
        }
        let mut set = PolicySet::new(plugins, bounds)?;
        compose_schedule(runtime, &mut set, composition, &later, parts)?;
        Ok(set)
    }
}

/// The later parts of a composed schedule.
#[derive(Args, Debug, Clone, Default)]
pub struct ComposeArgs {
    /// Another schedule that takes over at optimizer step STEP and counts its own steps from
    /// there (torch's `SequentialLR`); repeatable, in order. Its parameters are
    /// `--set schedule.N.KEY=VALUE`, N = 1 for the first --then.
    #[arg(long = "then", value_name = "PLUGIN@STEP", conflicts_with = "chain")]
    pub then: Vec<String>,
    /// Another schedule whose factor multiplies the LR at every step (torch's
    /// `ChainedScheduler`): it is asked at base LR 1 for the step's batch; repeatable. Its
    /// parameters are `--set schedule.N.KEY=VALUE`, N = 1 for the first --chain.
    #[arg(long, value_name = "PLUGIN")]
    pub chain: Vec<String>,
}

impl ComposeArgs {
    /// The composition `--then` or `--chain` asks for, and the later parts' plugins.
    pub fn composition(&self) -> Result<(Composition, Vec<String>)> {
        if !self.then.is_empty() {
            let mut milestones = Vec::new();
            let mut paths = Vec::new();
            for spec in &self.then {
                let (path, step) = spec.rsplit_once('@').with_context(|| {
                    format!("--then {spec}: expected PLUGIN@STEP, e.g. cosine-annealing@30")
                })?;
                let step: u64 = step
                    .parse()
                    .with_context(|| format!("--then {spec}: `{step}` is not a step number"))?;
                milestones.push(step);
                paths.push(path.to_string());
            }
            return Ok((Composition::Sequential(milestones), paths));
        }
        if !self.chain.is_empty() {
            return Ok((Composition::Chained, self.chain.clone()));
        }
        Ok((Composition::Single, Vec::new()))
    }
}

/// Loads the later parts `paths` of a composed schedule, part N configured with `parts[N]`,
/// and composes `set`'s schedule with them (nothing for [`Composition::Single`]).
pub fn compose_schedule(
    runtime: &Runtime,
    set: &mut PolicySet,
    composition: Composition,
    paths: &[String],
    parts: Vec<Vec<(String, String)>>,
) -> Result<()> {
    if composition == Composition::Single {
        return Ok(());
    }
    let later = paths
        .iter()
        .zip(parts.into_iter().skip(1))
        .map(|(path, mine)| runtime.load_configured(path, Some(PolicyKind::Schedule), &mine))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(set.compose(later, composition)?)
}

/// Splits the `--set schedule.…` settings by part: `KEY=VALUE` is part 0's, `N.KEY=VALUE`
/// part N's, for a schedule of `later` parts after the first.
pub fn schedule_parts(
    settings: &[(String, String)],
    later: usize,
) -> Result<Vec<Vec<(String, String)>>> {
    let mut parts = vec![Vec::new(); later + 1];
    for (key, value) in settings {
        let (part, key) = match key.split_once('.') {
            Some((n, rest)) if n.bytes().all(|b| b.is_ascii_digit()) => {
                let n: usize = n.parse().context("part number")?;
                if n > later {
                    bail!(
                        "--set schedule.{key}: the schedule has no part {n} ({later} --then or \
                         --chain given)"
                    );
                }
                (n, rest)
            }
            _ => (0, key.as_str()),
        };
        parts[part].push((key.to_string(), value.clone()));
    }
    Ok(parts)
}

/// What training would feed back into the policies, for `trace` and `compare`.
#[derive(Args, Debug, Clone, Default)]
pub struct InputArgs {
    /// Test metrics, one per line: line e is `last-metric` once epoch e is complete (drives
    /// policies such as `plateau`).
    #[arg(long, value_name = "FILE")]
    pub metric_file: Option<PathBuf>,
    /// Training losses, one per line: line i is `last-loss` after step i.
    #[arg(long, value_name = "FILE")]
    pub loss_file: Option<PathBuf>,
    /// Tensor norms for a layer-rate plugin: CSV
    /// `step,name,role,shape,weight_norm,grad_norm,update_norm,weight_decay`.
    #[arg(long, value_name = "FILE")]
    pub norms_file: Option<PathBuf>,
    /// The pseudo-gradient's norms a sync plugin's outer steps see: CSV
    /// `step,name,role,shape,weight_norm,delta_norm,rank_delta_norm,momentum_norm,delta_dot_momentum`
    /// (a header line and `#` comments skipped; role weight, bias or batchnorm; shape as
    /// `32x1x3x3`; every listed step lists the same tensors, and a window ending at a step not
    /// listed sees the latest listed step before it, the first before that). Without it, one
    /// tensor `model` of shape 1 with weight, delta and rank-delta norms 1 and momentum norms
    /// 0: every rank drifted alike, no outer momentum yet.
    #[arg(long, value_name = "FILE")]
    pub drift_file: Option<PathBuf>,
}

impl InputArgs {
    /// Reads the given files.
    pub fn inputs(&self) -> Result<Inputs> {
        let series = |p: &Option<PathBuf>| -> Result<Vec<f64>> {
            Ok(match p {
                Some(p) => read_input(p, parse_series)?,
                None => Vec::new(),
            })
        };
        Ok(Inputs {
            metrics: series(&self.metric_file)?,
            losses: series(&self.loss_file)?,
            norms: match &self.norms_file {
                Some(p) => read_input(p, Norms::parse)?,
                None => Norms::default(),
            },
        })
    }

    /// The drift of `--drift-file`, or the default of one unit tensor.
    pub fn drift(&self) -> Result<Drift> {
        Ok(match &self.drift_file {
            Some(p) => read_input(p, Drift::parse)?,
            None => Drift::default(),
        })
    }
}

/// Splits `PREFIX.KEY=VALUE` settings, checking every prefix is one of `prefixes` (hyphens and
/// underscores are interchangeable in prefixes).
pub fn parse_settings(raw: &[String], prefixes: &[&str]) -> Result<Vec<(String, String, String)>> {
    raw.iter()
        .map(|s| {
            let (lhs, value) = s
                .split_once('=')
                .with_context(|| format!("--set {s}: expected KIND.KEY=VALUE"))?;
            let (prefix, key) = lhs.split_once('.').with_context(|| {
                format!("--set {s}: expected KIND.KEY=VALUE, e.g. schedule.warmup_epochs=5")
            })?;
            let prefix = prefix.replace('-', "_");
            if !prefixes.contains(&prefix.as_str()) {
                bail!(
                    "--set {s}: unknown prefix `{prefix}`; use one of {}",
                    prefixes.join(", ")
                );
            }
            Ok((prefix, key.to_string(), value.to_string()))
        })
        .collect()
}

/// The `KEY=VALUE` pairs addressed to `prefix`.
pub fn settings_for(settings: &[(String, String, String)], prefix: &str) -> Vec<(String, String)> {
    settings
        .iter()
        .filter(|(p, _, _)| p == prefix)
        .map(|(_, k, v)| (k.clone(), v.clone()))
        .collect()
}
