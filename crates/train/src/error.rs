//! Why training could not start, go on or be saved. Every message names what a person needs to
//! act on: the flag, the file, the plugin and the step.

use std::path::PathBuf;

use lsgd_runtime::plugin::PluginError;

use crate::data::DataError;

/// The error of every fallible operation of the trainer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Settings that cannot train (names the flag).
    #[error("{0}")]
    Config(String),
    /// A file or directory could not be created, read or written.
    #[error("{context}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file that does not parse or cannot be written.
    #[error("{context}")]
    Json {
        /// What was being read or written, with the path.
        context: String,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// The data set.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A checkpoint that cannot be written, read or applied to this model.
    #[error("{0}")]
    Checkpoint(String),
    /// A resume that would not continue the same run.
    #[error("cannot resume from {}: it belongs to a different run:\n  {}", .path.display(), .problems.join("\n  "))]
    Mismatch {
        /// The checkpoint.
        path: PathBuf,
        /// Each difference, with its flag.
        problems: Vec<String>,
    },
    /// With `--fault-tolerance`, the world shrank below `--min-np`.
    #[error(
        "lost rank(s) {lost:?} at step {step}: {left} rank(s) left, fewer than --min-np \
         {min_np}; stopped with a checkpoint of the state before step {step} ({}), which \
         `--resume` (or `lsgd-host launch`'s restart) continues",
        .checkpoint.display()
    )]
    TooFewRanks {
        /// The ranks lost, numbered in the world that lost them.
        lost: Vec<usize>,
        /// The step that was to be redone.
        step: u64,
        /// Ranks left.
        left: usize,
        /// `--min-np`.
        min_np: usize,
        /// The checkpoint the survivors wrote.
        checkpoint: PathBuf,
    },
    /// A collective failed, or the ranks disagree.
    #[error(transparent)]
    Collective(#[from] lsgd_collective::Error),
    /// The plugin runtime refused a setting or a plugin.
    #[error(transparent)]
    Runtime(#[from] lsgd_runtime::Error),
    /// The TorchScript model failed in a step (names its file): its own code raised, or
    /// returned what training cannot use.
    #[error("{0}")]
    Model(String),
    /// A plugin failed on this rank.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The codec failed on another rank, or the ranks' payloads disagree.
    #[error("{0}")]
    Exchange(String),
    /// The weights or policy outputs differ between ranks.
    #[error(
        "consistency check failed at step {step}: the {what} of {} differ from rank 0's ({root:016x}); the ranks no longer train the same model",
        .ranks.join(", ")
    )]
    Inconsistent {
        /// The step after which the check ran.
        step: u64,
        /// What was compared.
        what: String,
        /// The ranks that differ from rank 0, with their digests.
        ranks: Vec<String>,
        /// Rank 0's digest.
        root: u64,
    },
    /// The loss stopped being a number.
    #[error(
        "training diverged at step {step}: loss {loss} (lr {lr}, batch {batch}); {}",
        newest_checkpoint(.checkpoint.as_ref())
    )]
    Diverged {
        /// The step.
        step: u64,
        /// Its loss.
        loss: f64,
        /// Its learning rate.
        lr: f64,
        /// Its global batch.
        batch: usize,
        /// The newest checkpoint this run wrote or resumed from, with its step.
        checkpoint: Option<(PathBuf, u64)>,
    },
    /// fp16 gradients kept overflowing until no loss scale could help.
    #[error(
        "fp16 loss scaling gave up at step {step}: {skipped} step(s) in a row overflowed and the loss scale fell to {scale:e}, below 2^-24; the forward pass overflows fp16 or training diverged (try --precision bf16 or a lower LR); {}",
        newest_checkpoint(.checkpoint.as_ref())
    )]
    LossScaleCollapsed {
        /// The step.
        step: u64,
        /// Steps skipped in a row.
        skipped: u32,
        /// The scale it fell to.
        scale: f64,
        /// The newest checkpoint this run wrote or resumed from, with its step.
        checkpoint: Option<(PathBuf, u64)>,
    },
    /// A plugin fault stopped training after the state was saved. The fault is part of the
    /// message (not only its source) so that every way of printing it names the plugin.
    #[error(
        "training stopped; state before step {step} saved to {} (resume with {}): {fault}",
        .saved.display(),
        resume_advice(.saved)
    )]
    Stopped {
        /// The step that did not happen.
        step: u64,
        /// The checkpoint written.
        saved: PathBuf,
        /// What stopped it.
        fault: Box<Error>,
    },
    /// A fault on one rank, as every rank reports it: the lowest faulting rank's message.
    #[error("rank {rank}: {message}")]
    OnRank {
        /// The lowest rank that faulted.
        rank: usize,
        /// Its fault, as it printed it.
        message: String,
    },
    /// What a rank that did not fault knows of a fault elsewhere, before the ranks share the
    /// faulting rank's message.
    #[error("the {what} failed on rank {rank} at step {step}; see that rank's error")]
    Elsewhere {
        /// The lowest rank that faulted.
        rank: usize,
        /// Which calls faulted.
        what: String,
        /// The step.
        step: u64,
    },
    /// The ranks loaded different plugins or parameters: each would decide its own steps.
    #[error(
        "the ranks did not load the same plugins (every rank must be given the same plugin flags and --set): {}",
        .0.join("; ")
    )]
    PluginsDiffer(Vec<String>),
    /// libtorch refused an operation.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

impl Error {
    /// Whether a collective lost a rank: what `--fault-tolerance` survives.
    pub fn is_rank_lost(&self) -> bool {
        matches!(
            self,
            Error::Collective(lsgd_collective::Error::RankLost { .. })
        )
    }

    /// An [`Error::Io`] with `context`.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}

/// Where a stopped run can be continued from: its newest checkpoint, or that it has none.
fn newest_checkpoint(checkpoint: Option<&(PathBuf, u64)>) -> String {
    match checkpoint {
        Some((path, step)) => format!(
            "the newest checkpoint of this run is {} (step {step})",
            path.display()
        ),
        None => "this run wrote no checkpoint (--checkpoint-every N writes one every N steps)"
            .to_string(),
    }
}

/// How to continue after a plugin fault whose state went to `saved`: as it is, or, since a
/// fixed plugin or other parameters are other policies, with `--allow-policy-change`.
fn resume_advice(saved: &std::path::Path) -> String {
    let dir = saved
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    format!(
        "--resume {dir}; once the plugin or its --set is fixed, with --resume {dir} \
         --allow-policy-change",
        dir = dir.display()
    )
}

/// The trainer's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
