//! Resuming a run from its checkpoint: the check that it is the same run (settings, training
//! set, plugin identities), then weights, optimizer, codec state, clock, loss scaler and the
//! stateful plugins' snapshots restored.
//!
//! With `--allow-policy-change` the run may go on with other policy plugins, other parameters
//! or another `--epochs` (one whose end it has not passed); every other setting must still
//! match. Weights, optimizer state, loss scaler, step and stream position carry over, and the
//! new plugins start at the checkpoint's step. What a changed plugin left behind is not given
//! to its successor, which could not read it: a stateful plugin whose identity (slot, blake3,
//! parameters) changed starts fresh, and a changed codec starts with zero error-feedback
//! state. The change is recorded as a `policy-change` record in metrics.jsonl.

use std::path::Path;

use lsgd_runtime::plugin::PolicyKind;
use lsgd_runtime::policy::{Clock, Slot};
use tch::Tensor;
use tch::nn::VarStore;

use super::identity::{identity, in_slot, plugin_changes, same_plugin};
use super::{MODEL, Trainer};
use crate::checkpoint::{self, Meta};
use crate::exchange::carry::STATE_PREFIX;
use crate::exchange::codec::RESIDUAL_PREFIX;
use crate::metrics::{self, PolicyChangeRecord};
use crate::{Error, Result};

/// The flag that lets a resume change the policies, as messages name it.
const FLAG: &str = "--allow-policy-change";

/// What [`Trainer::resume`] continued.
pub(super) struct Resumed {
    /// The checkpoint, as the metrics writer needs it to keep the records before it.
    pub metrics: metrics::Resumed,
    /// How the policies changed, with `--allow-policy-change` (`None`: they did not).
    pub change: Option<PolicyChangeRecord>,
}

impl Trainer<'_> {
    /// Continues the checkpoint at `path` (a run directory: its newest valid one): checks it
    /// belongs to this run (other policies and epochs only if `allow_policy_change`), restores
    /// weights, optimizer, codec state and clock; returns what it continued. Rank 0 says which
    /// checkpoint it used and why it skipped newer ones (even when `quiet`: a skip means lost
    /// steps), and what changed.
    pub(super) fn resume(
        &mut self,
        path: &Path,
        allow_policy_change: bool,
        quiet: bool,
    ) -> Result<Resumed> {
        let checkpoint::Loaded {
            meta,
            tensors,
            json,
            skipped,
        } = checkpoint::resolve(path)?;
        if self.world.is_root() {
            say_which(&json, &meta, &skipped, quiet);
        }
        let path = json.as_path();
        let mut change = self.check_resumable(&meta, path, allow_policy_change)?;
        let cannot =
            |e: Error| Error::Checkpoint(format!("cannot restore {}: {e}", path.display()));
        restore_model(&self.vs, &tensors).map_err(cannot)?;
        self.opt
            .load_state(&tensors, meta.last_lr)
            .map_err(cannot)?;
        if self.same_codec(&meta) {
            self.gradients
                .restore(
                    &tensors,
                    self.world.rank(),
                    self.world.size(),
                    meta.bucket_order.as_deref(),
                )
                .map_err(cannot)?;
        } else if let Some(c) = &mut change {
            // Residuals are what the old codec's payloads still owe; another codec (or none)
            // would pay them back in its own terms, or not at all. A codec's own state is in
            // its own terms too.
            c.codec_state_dropped = tensors
                .iter()
                .any(|(n, _)| n.starts_with(RESIDUAL_PREFIX) || n.starts_with(STATE_PREFIX));
        }
        self.clock = Clock::resume(
            *self.clock.shape(),
            meta.step,
            meta.samples_seen,
            meta.last_loss,
            meta.last_metric,
        );
        self.epochs_evaluated = meta.epochs_evaluated;
        self.restore_windows(meta.window, &tensors, meta.last_lr, path)?;
        if let Some(scaler) = &mut self.scaler {
            let saved = meta.loss_scaler.ok_or_else(|| {
                Error::Checkpoint(format!("{} has no fp16 loss-scaler state", path.display()))
            })?;
            scaler.restore(saved);
        }
        let fresh = self.restore_policy_state(&meta, path)?;
        if let Some(c) = &mut change {
            c.fresh_state = fresh;
            if self.world.is_root() && !quiet {
                eprintln!("{}", describe(c));
            }
        }
        self.note_checkpoint(json.clone(), meta.step);
        Ok(Resumed {
            metrics: metrics::Resumed {
                step: meta.step,
                plugins: identity(&meta.plugins),
                epochs: meta.config.run.epochs,
            },
            change,
        })
    }

    /// Whether this run's codec is the checkpoint's (both none counts), so its error-feedback
    /// state carries over.
    fn same_codec(&self, meta: &Meta) -> bool {
        let codec = Slot {
            kind: PolicyKind::Codec,
            part: 0,
        }
        .key();
        match (
            in_slot(&meta.plugins, &codec),
            in_slot(&self.plugins, &codec),
        ) {
            (Some(a), Some(b)) => same_plugin(a, b),
            (a, b) => a.is_none() && b.is_none(),
        }
    }

    /// Puts every stateful plugin back into the state the checkpoint recorded for it, except
    /// those that are not the checkpoint's plugin (a resume with `--allow-policy-change`):
    /// they start fresh, and their slot keys are returned.
    fn restore_policy_state(&mut self, meta: &Meta, path: &Path) -> Result<Vec<String>> {
        let mut fresh = Vec::new();
        let records = &self.plugins;
        for (slot, plugin) in self.policies.plugins_mut() {
            if !plugin.stateful() {
                continue;
            }
            let key = slot.key();
            let then = in_slot(&meta.plugins, &key);
            if !then
                .zip(in_slot(records, &key))
                .is_some_and(|(a, b)| same_plugin(a, b))
            {
                fresh.push(key);
                continue;
            }
            let saved = meta.policy_state.get(&key).ok_or_else(|| {
                Error::Checkpoint(format!(
                    "{} has no state for the stateful {key} plugin {}",
                    path.display(),
                    plugin.label()
                ))
            })?;
            let bytes = checkpoint::unhex(saved)
                .map_err(|e| Error::Checkpoint(format!("{}: {key} state: {e}", path.display())))?;
            plugin.restore(meta.step, bytes).map_err(Error::from)?;
        }
        Ok(fresh)
    }

    /// Refuses a resume that would not continue the same run: another [`crate::RunConfig`],
    /// training set or set of plugins; with `allow_policy_change`, other plugins and epochs
    /// (not yet passed) are the same run's new policies, returned as the change (`None` when
    /// nothing changed).
    fn check_resumable(
        &self,
        meta: &Meta,
        path: &Path,
        allow_policy_change: bool,
    ) -> Result<Option<PolicyChangeRecord>> {
        let (run, saved) = (&self.config.run, &meta.config.run);
        let mut problems = if allow_policy_change {
            run.fixed_mismatches(saved)
        } else {
            run.mismatches(saved)
        };
        let train_len = self.data.train.len;
        if meta.train_len != train_len {
            problems.push(format!(
                "training set: checkpoint has {} samples, this run has {train_len}",
                meta.train_len
            ));
        }
        let (now, then) = (identity(&self.plugins), identity(&meta.plugins));
        let epochs_changed = run.epochs != saved.epochs;
        if !allow_policy_change && (now != then || epochs_changed) {
            let fixed = problems.len() - usize::from(epochs_changed);
            if now != then {
                problems.push(format!(
                    "policy plugins: checkpoint has [{}], this run has [{}]",
                    then.join("; "),
                    now.join("; ")
                ));
            }
            problems.push(format!(
                "pass {FLAG} to continue with the new policies (plugins, parameters, --epochs){}",
                if fixed > 0 {
                    "; the other settings must still match"
                } else {
                    ""
                }
            ));
        }
        if !problems.is_empty() {
            return Err(Error::Mismatch {
                path: path.to_path_buf(),
                problems,
            });
        }
        let total = self.clock.shape().total_samples();
        if meta.samples_seen > total {
            return Err(Error::Config(format!(
                "cannot resume from {} with --epochs {}: it has trained on {} samples (step {}), \
                 past the end of {} epoch(s) ({total} samples); a resume may shorten a run only \
                 to an end it has not passed",
                path.display(),
                run.epochs,
                meta.samples_seen,
                meta.step,
                run.epochs
            )));
        }
        let changes = plugin_changes(&meta.plugins, &self.plugins);
        if changes.is_empty() && !epochs_changed {
            return Ok(None);
        }
        Ok(Some(PolicyChangeRecord {
            step: meta.step,
            changes,
            epochs_from: epochs_changed.then_some(saved.epochs),
            epochs_to: epochs_changed.then_some(run.epochs),
            fresh_state: Vec::new(),
            codec_state_dropped: false,
        }))
    }
}

/// What a resume with `--allow-policy-change` says it changed, one line per change.
fn describe(c: &PolicyChangeRecord) -> String {
    let none = || "none".to_string();
    let mut lines = vec![format!(
        "resume: {FLAG}: the policies change at step {}",
        c.step
    )];
    for p in &c.changes {
        lines.push(format!(
            "  {}: {} -> {}",
            p.slot,
            p.from.clone().unwrap_or_else(none),
            p.to.clone().unwrap_or_else(none)
        ));
    }
    if let (Some(from), Some(to)) = (c.epochs_from, c.epochs_to) {
        lines.push(format!("  --epochs: {from} -> {to}"));
    }
    for key in &c.fresh_state {
        lines.push(format!(
            "  {key}: a stateful plugin that is not the checkpoint's starts from a fresh state"
        ));
    }
    if c.codec_state_dropped {
        lines.push(
            "  codec: the checkpoint's error-feedback state belongs to the old codec and is \
             dropped; the new one starts from zero"
                .to_string(),
        );
    }
    lines.join("\n")
}

/// Copies the checkpoint's model variables into `vs`.
pub(super) fn restore_model(vs: &VarStore, tensors: &[(String, Tensor)]) -> Result<()> {
    let _guard = tch::no_grad_guard();
    for (name, mut var) in vs.variables() {
        let key = format!("{MODEL}{name}");
        let saved = tensors
            .iter()
            .find(|(n, _)| *n == key)
            .map(|(_, t)| t)
            .ok_or_else(|| Error::Checkpoint(format!("no tensor `{key}`")))?;
        if saved.size() != var.size() {
            return Err(Error::Checkpoint(format!(
                "tensor `{key}` has shape {:?}, the model needs {:?}",
                saved.size(),
                var.size()
            )));
        }
        var.copy_(&saved.to_device(var.device()));
    }
    Ok(())
}

/// Rank 0's word on the checkpoint a resume uses: each newer one skipped and why (even when
/// `quiet`: a skip means lost steps), then the one used.
fn say_which(json: &Path, meta: &Meta, skipped: &[checkpoint::Skipped], quiet: bool) {
    let name = |p: &Path| {
        p.file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned()
    };
    for s in skipped {
        eprintln!("resume: skipped {}: {}", name(&s.json), s.reason);
    }
    if !quiet || !skipped.is_empty() {
        eprintln!(
            "resume: using {} (step {}, {}){}",
            json.display(),
            meta.step,
            meta.reason,
            if skipped.is_empty() {
                ""
            } else {
                ", the newest valid checkpoint"
            }
        );
    }
}
