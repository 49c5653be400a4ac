//! Everything a training run is, as one serialisable value: written into every checkpoint so a
//! resumed run can be checked against the run it continues.

use std::path::PathBuf;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::augment::Augment;
use crate::data::DatasetKind;
use crate::exchange::ErrorFeedback;
use crate::model::ModelSpec;
use crate::optim::{AdamWConfig, SgdConfig, SgdForm};
use crate::precision::MixedPrecision;
use lsgd_collective::Algorithm;
use lsgd_collective::survive::Loss;

/// Where tensors live.
#[derive(ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// The first CUDA GPU if libtorch sees one, else the CPU.
    Auto,
    /// The CPU (deterministic given --seed).
    Cpu,
    /// The first CUDA GPU; an error if there is none.
    Cuda,
}

/// The settings of a training run: what defines the run, and what only this invocation.
/// Both halves are flattened into one JSON object in checkpoints.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// What the run computes; a resume must match it exactly.
    #[serde(flatten)]
    pub run: RunConfig,
    /// How this process runs it; free to change on resume.
    #[serde(flatten)]
    pub invocation: Invocation,
}

/// The settings that define a run: two runs with equal `RunConfig`s (and the same plugins
/// and data) train the same model, so a resume must have an equal one.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RunConfig {
    /// The network.
    pub model: ModelSpec,
    /// The SGD settings (the optimiser unless `adamw` is set).
    pub sgd: SgdConfig,
    /// AdamW instead of SGD (`--optimizer adamw`).
    #[serde(default)]
    pub adamw: Option<AdamWConfig>,
    /// Epochs to train.
    pub epochs: u32,
    /// Global batch at step 0 (what a batch-size policy sees as configured).
    pub global_batch: u32,
    /// Largest micro-batch one forward/backward pass may take; larger per-worker batches are
    /// accumulated over several passes (it sets the BatchNorm batch).
    pub max_micro_batch: u32,
    /// Learning rate at `reference_batch`.
    pub base_lr: f64,
    /// The batch `base_lr` applies to (linear scaling rule).
    pub reference_batch: u32,
    /// Largest global batch a batch-size policy may return.
    pub max_batch: u32,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// Train on the first N training samples only.
    pub train_subset: Option<usize>,
    /// Evaluate on the first N test samples only (the metric policies see).
    pub test_subset: Option<usize>,
    /// Gradient bucket size, MiB (a codec's buckets and residuals follow it).
    pub bucket_mb: f64,
    /// What a codec drops is kept per bucket and sent later: off, GRACE's residual, or DGC's
    /// momentum correction (`true`/`false` in checkpoints written before the modes existed).
    #[serde(default)]
    pub error_feedback: ErrorFeedback,
    /// Clip each rank's gradient to a total L2 norm of C/√k before error feedback accumulates
    /// it (DGC's local gradient clipping).
    #[serde(default)]
    pub local_clip_norm: Option<f64>,
    /// `--precision` and fp16's loss scaling (fp32 in checkpoints written before it existed).
    #[serde(default)]
    pub mixed_precision: MixedPrecision,
    /// `--mode`: synchronous data parallelism, or asynchronous SGD with a parameter server
    /// (synchronous in checkpoints written before it existed).
    #[serde(default)]
    pub mode: Mode,
    /// `--dataset`: which data set `--data-dir` holds (Fashion-MNIST in checkpoints written
    /// before it existed).
    #[serde(default)]
    pub dataset: DatasetKind,
    /// `--augment`: the training batches' augmentation (none in checkpoints written before it
    /// existed).
    #[serde(default)]
    pub augment: Augment,
    /// `--image-size`: the side of the square images made from image files.
    #[serde(default = "default_image_size")]
    pub image_size: u32,
}

/// `--image-size`' default: ImageNet's 224.
pub fn default_image_size() -> u32 {
    224
}

/// How the ranks of a run combine their gradients.
#[derive(ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every rank computes its shard of each global batch; the gradients are summed
    /// (all-reduce) and every rank applies the same update.
    #[default]
    Sync,
    /// Rank 0 is a parameter server holding the weights, optimizer and policies; the other
    /// ranks pull the weights, compute a gradient on a batch of their own and push it without
    /// waiting for each other, and the server applies each as it arrives.
    Async,
}

/// A deliberate delay of one rank (`--slow-rank`, `--slow-ms`): how a study or test shows
/// what a straggler does to synchronous and asynchronous training.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slowdown {
    /// The rank that is slowed.
    pub rank: usize,
    /// Milliseconds it sleeps before each gradient it computes.
    pub ms: u64,
}

/// `--fault-tolerance`: a lost rank costs the step in flight, not the run; the survivors
/// shrink the world and redo the step on the same global batch (trainer/survive.rs).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Tolerance {
    /// `--min-np`: the fewest ranks the world may shrink to; below it the survivors stop with
    /// a checkpoint of the state before the step, for `lsgd-host launch` to restart from.
    pub min_np: usize,
    /// `--grow-back`: after a shrink, the survivors start replacements for the lost ranks at
    /// the next step boundary and the world grows back to its size (false in checkpoints
    /// written before it existed).
    #[serde(default)]
    pub grow_back: bool,
}

/// Ranks lost on purpose (`--lose-rank`), numbered in the world the run started with.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct LoseRank {
    /// The ranks.
    pub ranks: Vec<usize>,
    /// The step before whose exchange it goes.
    pub step: u64,
    /// Killed, or stopped (only the failure detector finds it).
    pub how: Loss,
}

/// The settings of one invocation: where it writes, how it reports and how it uses this
/// machine. A resume may change any of them (or the number of ranks).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Invocation {
    /// Intra-op threads of libtorch.
    pub threads: usize,
    /// `--data-dir`: the data set's directory (or file, for npz and safetensors).
    pub data: PathBuf,
    /// Where tensors live.
    pub device: DeviceChoice,
    /// Run directory (metrics, checkpoints).
    pub out: PathBuf,
    /// Write a checkpoint every N steps (0: only at the end and on a fault).
    pub checkpoint_every: u64,
    /// Stop (with a checkpoint) once this many steps have been taken in total.
    pub stop_after_steps: Option<u64>,
    /// Also write metrics.csv and eval.csv.
    pub csv: bool,
    /// The gradient all-reduce algorithm (with more than one rank).
    pub allreduce: Algorithm,
    /// Compare weights and policy outputs across ranks every N steps (0: only at the end).
    pub consistency_every: u64,
    /// One rank made slower on purpose (none in checkpoints written before it existed).
    #[serde(default)]
    pub slow: Option<Slowdown>,
    /// `--fault-tolerance` (none in checkpoints written before it existed).
    #[serde(default)]
    pub tolerance: Option<Tolerance>,
    /// `--lose-rank R[,R…]@STEP[:stop]`: ranks lost on purpose before that step's exchange
    /// (tests and `scripts/bench-faults.sh`; none in checkpoints written before it existed).
    #[serde(default)]
    pub lose: Option<LoseRank>,
    /// Checkpoint generations kept in `out` (`--keep-checkpoints`, at least 1; 2 in
    /// checkpoints written before it existed).
    #[serde(default = "default_keep_checkpoints")]
    pub keep_checkpoints: u32,
    /// `--overwrite`: a new run may replace another run's files in `out` (otherwise it
    /// refuses such an `out`; see [`crate::rundir`]).
    #[serde(default)]
    pub overwrite: bool,
    /// `--loader-threads`: threads decoding image files (image folders only).
    #[serde(default = "default_loader_threads")]
    pub loader_threads: usize,
    /// `--save-model FILE`: where the trained weights go at the end (safetensors).
    #[serde(default)]
    pub save_model: Option<PathBuf>,
    /// `--overlap` (true) or `--no-overlap` (false): whether buckets move while the backward
    /// pass runs; unset, they do wherever the other settings allow ([`TrainConfig::overlaps`]).
    /// Either way a run ends with the same weights.
    #[serde(default)]
    pub overlap: Option<bool>,
}

/// `--loader-threads`' default.
pub fn default_loader_threads() -> usize {
    2
}

/// `--keep-checkpoints`' default: the newest generation and one to fall back to.
pub fn default_keep_checkpoints() -> u32 {
    2
}

impl TrainConfig {
    /// Refuses settings that cannot train.
    pub fn validate(&self) -> Result<(), Error> {
        let run = &self.run;
        run.model.validate()?;
        run.sgd.validate()?;
        run.mixed_precision.validate()?;
        if let Some(adamw) = &run.adamw {
            adamw.validate()?;
            if run.sgd.nesterov || run.sgd.form == SgdForm::Goyal {
                return Err(Error::Config(
                    "--nesterov and --sgd-form goyal are SGD's; --optimizer adamw takes neither"
                        .into(),
                ));
            }
        }
        if run.max_micro_batch == 0 {
            return Err(Error::Config("--max-micro-batch must be at least 1".into()));
        }
        if !(run.bucket_mb.is_finite() && run.bucket_mb > 0.0) {
            return Err(Error::Config(format!(
                "--bucket-mb {} must be above 0",
                run.bucket_mb
            )));
        }
        if let Some(t) = &self.invocation.tolerance {
            if run.mode == Mode::Async {
                return Err(Error::Config(
                    "--fault-tolerance redoes a synchronous step on the ranks left; --mode async \
                     has no such step (its server would have to re-send weights to workers that \
                     come and go): run it without --fault-tolerance"
                        .into(),
                ));
            }
            if t.min_np == 0 {
                return Err(Error::Config("--min-np must be at least 1".into()));
            }
        }
        if self.invocation.threads == 0 {
            return Err(Error::Config("--threads must be at least 1".into()));
        }
        if self.invocation.loader_threads == 0 {
            return Err(Error::Config("--loader-threads must be at least 1".into()));
        }
        if run.image_size < 8 {
            return Err(Error::Config(format!(
                "--image-size {} is too small: use at least 8 pixels",
                run.image_size
            )));
        }
        if let Some(why) = self
            .overlap_refused()
            .filter(|_| self.invocation.overlap == Some(true))
        {
            return Err(Error::Config(format!(
                "--overlap: {why}; drop --overlap (the exchange then runs after the backward pass)"
            )));
        }
        run.validate_local()
    }

    /// Why the settings keep the exchange out of the backward pass, if they do.
    pub fn overlap_refused(&self) -> Option<&'static str> {
        let run = &self.run;
        if run.mode == Mode::Async {
            Some("--mode async has no synchronous exchange to overlap")
        } else if run.mixed_precision.precision == crate::precision::Precision::Fp16 {
            Some(
                "--precision fp16 checks every rank's gradient for overflow before anything \
                 moves (a step that overflowed on any rank exchanges nothing)",
            )
        } else if run.local_clip_norm.is_some() {
            Some(
                "--local-clip-norm clips by the norm of this rank's whole gradient, known only \
                 after the backward pass",
            )
        } else {
            None
        }
    }

    /// [`RunConfig::validate_sync`] and what this invocation adds: `--fault-tolerance` (its
    /// redo of a step assumes the ranks hold the same weights) and `--overlap` (a window's
    /// exchange comes after the update, with nothing left to overlap; a synchronous step of a
    /// sync policy runs the exchange after the backward pass).
    pub fn validate_sync(&self, layer_rate: bool) -> Result<(), Error> {
        self.run.validate_sync(layer_rate)?;
        if self.invocation.tolerance.is_some() {
            return Err(Error::Config(
                "--sync cannot be combined with --fault-tolerance: a redone step assumes every \
                 rank holds the same weights, and inside a window they do not"
                    .into(),
            ));
        }
        if self.invocation.overlap == Some(true) {
            return Err(Error::Config(
                "--sync cannot be combined with --overlap: a window ends with an exchange after \
                 the update, which has no backward pass to hide behind; drop --overlap"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether the step exchanges buckets while the backward pass runs: unless `--no-overlap`
    /// or [`TrainConfig::overlap_refused`], and with `--fault-tolerance` only if asked for
    /// (`--overlap`): under load the lab's grow-back test saw a survivor take a live rank for
    /// lost, with and without overlap; the suspect is the single malloc arena, which tolerant
    /// runs now go without (`crate::one_malloc_arena`; the next CI run under load passed), so
    /// they keep the sequential step by default until more runs settle it (a tolerance test
    /// loses a rank in an overlapped run). The same on every rank, since it follows the
    /// settings alone (the two steps make their collectives in a different order), a
    /// replacement's that joins mid-run included.
    pub fn overlaps(&self) -> bool {
        let wanted = self
            .invocation
            .overlap
            .unwrap_or(self.invocation.tolerance.is_none());
        wanted && self.overlap_refused().is_none()
    }
}

impl RunConfig {
    /// Refuses what each rank would do to its own gradient (`--local-clip-norm`,
    /// `--error-feedback momentum`) where the other settings cannot take it: momentum
    /// correction needs SGD in its plain form, since it takes over the optimizer's momentum and
    /// weight decay.
    fn validate_local(&self) -> Result<(), Error> {
        if let Some(c) = self
            .local_clip_norm
            .filter(|c| !(c.is_finite() && *c > 0.0))
        {
            return Err(Error::Config(format!(
                "--local-clip-norm {c} must be finite and above 0"
            )));
        }
        if self.local_clip_norm.is_some() && self.mode == Mode::Async {
            return Err(Error::Config(
                "--local-clip-norm clips a rank's gradient before the synchronous exchange, \
                 which --mode async does not run"
                    .into(),
            ));
        }
        if !self.error_feedback.moves_momentum() {
            return Ok(());
        }
        if self.adamw.is_some() {
            return Err(momentum_refusal(
                "--optimizer adamw",
                "it accumulates SGD's velocity in the exchange (use --error-feedback residual)",
            ));
        }
        if self.sgd.nesterov {
            return Err(momentum_refusal(
                "--nesterov",
                "the exchange's velocity is heavy-ball momentum only",
            ));
        }
        if self.sgd.form == SgdForm::Goyal {
            return Err(momentum_refusal(
                "--sgd-form goyal",
                "the velocity accumulates gradients and the LR applies at the update, which is the pytorch form",
            ));
        }
        Ok(())
    }

    /// Refuses a layer-wise rate plugin (`--layer-rate`) with `--error-feedback momentum`: the
    /// plugin is told the norms of a gradient, and the exchange returns accumulated velocities.
    /// Not part of [`TrainConfig::validate`]: whether there is such a plugin is no setting.
    pub fn validate_layer_rate(&self) -> Result<(), Error> {
        if !self.error_feedback.moves_momentum() {
            return Ok(());
        }
        Err(momentum_refusal(
            "--layer-rate",
            "a layer-wise rate sees the norms of a gradient, and the exchange returns accumulated velocities",
        ))
    }

    /// Refuses what a sync policy (`--sync`, contract 0.5) cannot run beside: each of these
    /// needs every rank's gradients, or an agreement of the ranks, at every step, while a
    /// window's local steps exchange nothing. Not part of [`TrainConfig::validate`]: whether
    /// there is such a plugin is no setting; `layer_rate` says whether there is a layer-rate
    /// plugin.
    pub fn validate_sync(&self, layer_rate: bool) -> Result<(), Error> {
        let refuse = |what: &str, why: &str| {
            Err(Error::Config(format!(
                "--sync cannot be combined with {what}: {why}"
            )))
        };
        if self.mode == Mode::Async {
            return refuse(
                "--mode async",
                "the parameter server applies each worker's gradient as it comes; a sync \
                 policy's ranks each keep weights of their own",
            );
        }
        if self.mixed_precision.precision == crate::precision::Precision::Fp16 {
            return refuse(
                "--precision fp16",
                "a step that overflows on one rank is skipped on every rank, which needs an \
                 agreement at every step (use --precision bf16)",
            );
        }
        if self.error_feedback.moves_momentum() {
            return refuse(
                "--error-feedback momentum",
                "it keeps SGD's momentum inside the gradient exchange, which local steps skip",
            );
        }
        if self.local_clip_norm.is_some() {
            return refuse(
                "--local-clip-norm",
                "it clips a rank's gradient before the exchange, which local steps skip",
            );
        }
        if layer_rate {
            return refuse(
                "--layer-rate",
                "a layer-wise rate sees the norms of the gradient summed over the ranks, which \
                 a local step never forms",
            );
        }
        Ok(())
    }

    /// How `self` differs from the run a checkpoint saved, one line per setting, named by its
    /// flag; empty when they are equal.
    pub fn mismatches(&self, saved: &RunConfig) -> Vec<String> {
        if self == saved {
            return Vec::new();
        }
        let (now, then) = (json(self), json(saved));
        let mut out = Vec::new();
        diff(&now, &then, &mut out);
        out
    }

    /// [`RunConfig::mismatches`] less the settings a resume with `--allow-policy-change` may
    /// change (`--epochs`; the plugins are not settings): what still makes it another run.
    pub fn fixed_mismatches(&self, saved: &RunConfig) -> Vec<String> {
        let mut now = self.clone();
        now.epochs = saved.epochs;
        now.mismatches(saved)
    }
}

/// Why `--error-feedback momentum` cannot be combined with `flag`.
fn momentum_refusal(flag: &str, why: &str) -> Error {
    Error::Config(format!(
        "--error-feedback momentum cannot be combined with {flag}: {why}"
    ))
}

fn json(c: &RunConfig) -> serde_json::Value {
    serde_json::to_value(c).expect("a RunConfig serialises")
}

/// Appends a line for every leaf of `now` that differs from `then`, descending into the nested
/// settings (model, optimiser) so that each line names one flag.
fn diff(now: &serde_json::Value, then: &serde_json::Value, out: &mut Vec<String>) {
    let (Some(now), Some(then)) = (now.as_object(), then.as_object()) else {
        return;
    };
    for (key, a) in now {
        let b = then.get(key).unwrap_or(&serde_json::Value::Null);
        if a == b {
            continue;
        }
        if a.is_object() && b.is_object() {
            diff(a, b, out);
        } else {
            out.push(format!(
                "{}: checkpoint has {b}, this run has {a}",
                flag(key)
            ));
        }
    }
}

/// The command-line flag of a setting (its field name, except where the flag is a negation
/// or names the setting differently).
fn flag(field: &str) -> String {
    match field {
        "arch" | "script" => "--model".into(),
        "adamw" => "--optimizer".into(),
        "beta1" | "beta2" | "eps" => format!("--adam-{field}"),
        "form" => "--sgd-form".into(),
        "decay_bn_and_bias" => "--no-decay-bn-bias".into(),
        "momentum_correction" => "--no-momentum-correction".into(),
        other => format!("--{}", other.replace('_', "-")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Arch, Shortcut};

    fn run() -> RunConfig {
        RunConfig {
            model: ModelSpec {
                arch: Arch::Cnn,
                depth: 20,
                zero_init_residual: false,
                shortcut: Shortcut::A,
                script: None,
            },
            sgd: SgdConfig::default(),
            adamw: None,
            epochs: 2,
            global_batch: 64,
            max_micro_batch: 512,
            base_lr: 0.1,
            reference_batch: 256,
            max_batch: 1 << 20,
            seed: 7,
            train_subset: Some(600),
            test_subset: None,
            bucket_mb: 25.0,
            error_feedback: ErrorFeedback::Off,
            local_clip_norm: None,
            mixed_precision: MixedPrecision::default(),
            mode: Mode::Sync,
            dataset: DatasetKind::FashionMnist,
            augment: Augment::None,
            image_size: 224,
        }
    }

    #[test]
    fn equal_runs_have_no_mismatch_and_each_difference_names_its_flag() {
        assert!(run().mismatches(&run()).is_empty());
        let mut other = run();
        other.seed = 8;
        other.sgd.nesterov = true;
        other.model.arch = Arch::Mlp;
        other.train_subset = None;
        other.adamw = Some(AdamWConfig::default());
        assert_eq!(
            other.mismatches(&run()),
            [
                "--optimizer: checkpoint has null, this run has {\"beta1\":0.9,\"beta2\":0.999,\"decay_bn_and_bias\":true,\"eps\":1e-8,\"weight_decay\":0.01}",
                "--model: checkpoint has \"cnn\", this run has \"mlp\"",
                "--seed: checkpoint has 7, this run has 8",
                "--nesterov: checkpoint has false, this run has true",
                "--train-subset: checkpoint has 600, this run has null",
            ]
        );
    }

    fn config(run: RunConfig) -> TrainConfig {
        TrainConfig {
            run,
            invocation: Invocation {
                threads: 1,
                data: PathBuf::from("d"),
                device: DeviceChoice::Cpu,
                out: PathBuf::from("o"),
                checkpoint_every: 0,
                stop_after_steps: None,
                csv: false,
                allreduce: Algorithm::Mpi,
                consistency_every: 100,
                slow: None,
                tolerance: None,
                lose: None,
                keep_checkpoints: 2,
                overwrite: false,
                loader_threads: 2,
                save_model: None,
                overlap: None,
            },
        }
    }

    #[test]
    fn both_halves_flatten_into_one_json_object_as_before_the_split() {
        let c = config(run());
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["seed"], 7);
        assert_eq!(v["out"], "o");
        assert_eq!(serde_json::from_value::<TrainConfig>(v.clone()).unwrap(), c);
        // Checkpoints written before `adamw`, `mixed_precision`, `mode` and `slow` existed still read, as
        // fp32 SGD runs.
        let mut old = v;
        old.as_object_mut().unwrap().remove("adamw");
        old.as_object_mut().unwrap().remove("mixed_precision");
        old.as_object_mut().unwrap().remove("mode");
        old.as_object_mut().unwrap().remove("slow");
        old.as_object_mut().unwrap().remove("tolerance");
        old.as_object_mut().unwrap().remove("lose");
        old.as_object_mut().unwrap().remove("keep_checkpoints");
        // ... and before data sets, augmentation and saved models.
        for key in [
            "dataset",
            "augment",
            "image_size",
            "loader_threads",
            "save_model",
        ] {
            old.as_object_mut().unwrap().remove(key);
        }
        // ... and before `local_clip_norm`, when `error_feedback` was a switch.
        old.as_object_mut().unwrap().remove("local_clip_norm");
        old["error_feedback"] = serde_json::Value::Bool(false);
        assert_eq!(serde_json::from_value::<TrainConfig>(old).unwrap(), c);
    }

    #[test]
    fn local_clipping_and_momentum_correction_are_refused_where_the_run_cannot_take_them() {
        config(run()).validate().unwrap();
        let refused = |change: &dyn Fn(&mut RunConfig), says: &str| {
            let mut r = run();
            change(&mut r);
            let e = config(r).validate().unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        };
        for c in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            refused(
                &|r| r.local_clip_norm = Some(c),
                "must be finite and above 0",
            );
        }
        refused(
            &|r| {
                r.local_clip_norm = Some(1.0);
                r.mode = Mode::Async;
            },
            "which --mode async does not run",
        );
        let momentum = |r: &mut RunConfig| r.error_feedback = ErrorFeedback::Momentum;
        for (change, flag) in [
            (
                &(|r: &mut RunConfig| r.adamw = Some(AdamWConfig::default()))
                    as &dyn Fn(&mut RunConfig),
                "--optimizer adamw",
            ),
            (&|r: &mut RunConfig| r.sgd.nesterov = true, "--nesterov"),
            (
                &|r: &mut RunConfig| r.sgd.form = SgdForm::Goyal,
                "--sgd-form goyal",
            ),
        ] {
            // Each is a run of its own, refused with momentum correction only.
            let mut r = run();
            change(&mut r);
            config(r).validate().unwrap();
            let says = format!("--error-feedback momentum cannot be combined with {flag}");
            refused(
                &|r| {
                    momentum(r);
                    change(r);
                },
                &says,
            );
        }
        let mut r = run();
        r.validate_layer_rate().unwrap();
        momentum(&mut r);
        config(r.clone()).validate().unwrap();
        let e = r.validate_layer_rate().unwrap_err().to_string();
        assert!(
            e.contains("--error-feedback momentum cannot be combined with --layer-rate"),
            "{e}"
        );
    }

    #[test]
    fn only_epochs_may_change_with_the_policies() {
        let mut other = run();
        other.epochs = 5;
        assert_eq!(
            other.mismatches(&run()),
            ["--epochs: checkpoint has 2, this run has 5"]
        );
        assert!(other.fixed_mismatches(&run()).is_empty());
        other.seed = 8;
        assert_eq!(
            other.fixed_mismatches(&run()),
            ["--seed: checkpoint has 7, this run has 8"]
        );
    }

    #[test]
    fn precision_settings_are_named_by_their_flags() {
        let mut a = run();
        a.mixed_precision.precision = crate::precision::Precision::Fp16;
        let mut b = a.clone();
        b.mixed_precision.precision = crate::precision::Precision::Bf16;
        b.mixed_precision.loss_scale = 8.0;
        assert_eq!(
            b.mismatches(&a),
            [
                "--loss-scale: checkpoint has 65536.0, this run has 8.0",
                "--precision: checkpoint has \"fp16\", this run has \"bf16\"",
            ]
        );
    }

    #[test]
    fn adamw_settings_are_named_by_their_flags() {
        let mut a = run();
        a.adamw = Some(AdamWConfig::default());
        let mut b = a.clone();
        b.adamw.as_mut().unwrap().beta2 = 0.99;
        assert_eq!(
            b.mismatches(&a),
            ["--adam-beta2: checkpoint has 0.999, this run has 0.99"]
        );
    }
}
