//! Resuming a run from its checkpoint: the check that it is the same run (settings, training
//! set, plugin identities), then weights, optimizer, codec state, clock, loss scaler and the
//! stateful plugins' snapshots restored.

use std::path::Path;

use lsgd_runtime::policy::Clock;
use tch::Tensor;
use tch::nn::VarStore;

use super::identity::identity;
use super::{MODEL, Trainer};
use crate::checkpoint::{self, Meta};
use crate::{Error, Result};

impl Trainer<'_> {
    /// Continues the checkpoint at `path` (a run directory: its newest valid one): checks it
    /// belongs to this run, restores weights, optimizer, codec state and clock; returns the
    /// step it was taken at. Rank 0 says which checkpoint it used and why it skipped newer
    /// ones (even when `quiet`: a skip means lost steps).
    pub(super) fn resume(&mut self, path: &Path, quiet: bool) -> Result<u64> {
        let checkpoint::Loaded {
            meta,
            tensors,
            json,
            skipped,
        } = checkpoint::resolve(path)?;
        if self.world.is_root() {
            let name = |p: &Path| {
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            };
            for s in &skipped {
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
        let path = json.as_path();
        self.check_resumable(&meta, path)?;
        let cannot =
            |e: Error| Error::Checkpoint(format!("cannot restore {}: {e}", path.display()));
        restore_model(&self.vs, &tensors).map_err(cannot)?;
        self.opt
            .load_state(&tensors, meta.last_lr)
            .map_err(cannot)?;
        self.gradients
            .restore(&tensors, self.world.rank(), self.world.size())
            .map_err(cannot)?;
        self.clock = Clock::resume(
            *self.clock.shape(),
            meta.step,
            meta.samples_seen,
            meta.last_loss,
            meta.last_metric,
        );
        self.epochs_evaluated = meta.epochs_evaluated;
        if let Some(scaler) = &mut self.scaler {
            let saved = meta.loss_scaler.ok_or_else(|| {
                Error::Checkpoint(format!("{} has no fp16 loss-scaler state", path.display()))
            })?;
            scaler.restore(saved);
        }
        self.restore_policy_state(&meta, path)?;
        self.last_checkpoint = Some((json.clone(), meta.step));
        Ok(meta.step)
    }

    /// Puts every stateful plugin back into the state the checkpoint recorded for it.
    fn restore_policy_state(&mut self, meta: &Meta, path: &Path) -> Result<()> {
        for (slot, plugin) in self.policies.plugins_mut() {
            if !plugin.stateful() {
                continue;
            }
            let key = slot.key();
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
        Ok(())
    }

    /// Refuses a resume that would not continue the same run: another [`crate::RunConfig`],
    /// training set or set of plugins.
    fn check_resumable(&self, meta: &Meta, path: &Path) -> Result<()> {
        let mut problems = self.config.run.mismatches(&meta.config.run);
        let train_len = self.data.train.len;
        if meta.train_len != train_len {
            problems.push(format!(
                "training set: checkpoint has {} samples, this run has {train_len}",
                meta.train_len
            ));
        }
        let (now, then) = (identity(&self.plugins), identity(&meta.plugins));
        if now != then {
            problems.push(format!(
                "policy plugins: checkpoint has [{}], this run has [{}]",
                then.join("; "),
                now.join("; ")
            ));
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(Error::Mismatch {
            path: path.to_path_buf(),
            problems,
        })
    }
}

/// Copies the checkpoint's model variables into `vs`.
fn restore_model(vs: &VarStore, tensors: &[(String, Tensor)]) -> Result<()> {
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
