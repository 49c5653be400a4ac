//! How a run ends and what it leaves: the end of the last step (the final consistency check,
//! checkpoint and summary), the checkpoint every save writes and every rank names alike, and
//! the one exit on a plugin fault, which the ranks agree on first so that they all stop at the
//! same step with the same message and the state before it saved.

use std::path::{Path, PathBuf};

use tch::Tensor;

use super::{MODEL, Trainer, per_second};
use crate::checkpoint::{self, Meta};
use crate::config::Mode;
use crate::precision::LossScaler;
use crate::{Error, Result, Summary};

impl Trainer<'_> {
    /// After the last step: the final consistency check and checkpoint, and the summary.
    pub(super) fn finish(mut self) -> Result<Summary> {
        self.metrics.flush()?;
        // Stopped inside a sync policy's window (`--stop-after-steps`), the ranks' weights differ
        // until its end.
        if self.world.size() > 1 && self.config.run.mode == Mode::Sync && self.in_agreement() {
            if let Some((d, scales)) = self.last_decision.take() {
                self.surviving("consistency check", |t| t.consistency(&d, &scales))?;
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
        let checkpoint = self.surviving("checkpoint", |t| t.save(reason))?;
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
        let mut codec_state = self.gradients.checkpoint_tensors(self.world)?;
        let (windows, window) = self.window_checkpoint()?;
        codec_state.extend(windows);
        let written = if self.world.is_root() {
            self.write_checkpoint(reason, codec_state, window)
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

    /// Writes rank 0's checkpoint of the state now, with every rank's `codec_state` (and a
    /// sync policy's tensors) and where a sync policy's windows stand (`window`).
    fn write_checkpoint(
        &mut self,
        reason: &str,
        codec_state: Vec<(String, Tensor)>,
        window: Option<super::windows::WindowMeta>,
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
            bucket_order: Some(self.gradients.order().to_vec()),
            window,
        };
        checkpoint::save(out, meta, &tensors)
    }

    /// Records the newest checkpoint: a divergence names it, and so does the collective
    /// watchdog's report (with the directory to resume from).
    pub(super) fn note_checkpoint(&mut self, json: PathBuf, step: u64) {
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
    /// `--mode async` only the server calls the policies, and stops the workers itself), and
    /// with a sync policy not inside a window, whose local steps make no collective call (the
    /// policies see the same inputs on every rank and fault alike).
    pub(super) fn agrees(&self) -> bool {
        self.world.size() > 1 && self.config.run.mode == Mode::Sync && self.in_agreement()
    }

    /// `outcome` of this rank's `what` calls, once the ranks agree: one all-gather of a flag
    /// (none on one rank), and if any rank faulted, every rank stops through [`Trainer::stop`].
    pub(super) fn agreed<T>(&mut self, what: &str, outcome: Result<T>) -> Result<T> {
        self.agreed_then(what, outcome, |_| {})
    }

    /// [`Trainer::agreed`], calling `undo` before stopping: what puts the state before the
    /// step back when the fault comes after the step changed it (a window's end, after the
    /// local update).
    pub(super) fn agreed_then<T>(
        &mut self,
        what: &str,
        outcome: Result<T>,
        undo: impl FnOnce(&mut Self),
    ) -> Result<T> {
        self.report_held();
        if !self.agrees() {
            return outcome.map_err(|fault| {
                undo(self);
                self.stop(fault)
            });
        }
        match (self.world.agree_failure(outcome.is_err())?, outcome) {
            (_, Err(fault)) => {
                undo(self);
                Err(self.stop(fault))
            }
            (Some(rank), Ok(_)) => {
                undo(self);
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
}
