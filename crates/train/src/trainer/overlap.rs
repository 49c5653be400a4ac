//! The overlapped step (`--overlap`): phases 3 and 4 together. The last micro-batch's backward
//! pass runs on a thread of its own while this thread, the one that makes every MPI call
//! (`MPI_THREAD_FUNNELED`), exchanges each bucket as soon as the gradient-ready hooks report
//! its gradients, in the layout's order on every rank; the update waits for the last bucket.
//! Earlier micro-batches only accumulate (DDP's `no_sync`). Keeping the world, the codec plugin
//! and the exchange's state on this thread and moving only the loss tensor to the other is why
//! the backward pass, not the exchange, is the one that moves. While it computes, this thread's
//! waits for messages sleep instead of spinning ([`lsgd_collective::Computing`]), so that they
//! leave it the core.
//!
//! At start-up one backward pass records the order gradients become ready in
//! ([`Overlap::record`]), agreed across ranks; the bucket layout follows it whether or not the
//! step overlaps, so both steps run the same operations on the same buckets and end with the
//! same bits.

use std::sync::Arc;
use std::time::Instant;

use tch::{Kind, Tensor};

use super::{Batch, Trainer};
use lsgd_collective::Traffic;

use crate::exchange::Exchanged;
use crate::model::Model;
use crate::optim::Param;
use crate::overlap::ready::forget_grads;
use crate::overlap::{Gate, GradReady, order};
use crate::tensors::DataTensors;
use crate::{Error, Result, loss};

/// The hooks on the trainable tensors and the gate they report to.
pub(super) struct Overlap {
    hooks: GradReady,
    gate: Arc<Gate>,
}

/// What the overlapped phases 3 and 4 produced.
pub(super) struct Passed {
    /// The sum of this rank's per-sample losses.
    pub loss_sum: Tensor,
    /// What the exchange moved.
    pub exchanged: Exchanged,
    /// Seconds from the first forward pass to the end of the last backward pass.
    pub compute_s: f64,
    /// Seconds the exchange went on after the backward pass.
    pub exposed_s: f64,
    /// Seconds of the last micro-batch's backward pass.
    pub backward_s: f64,
}

impl Overlap {
    /// Hooks on `params` (the optimizer's order), reporting to a closed gate.
    pub(super) fn new(params: &[Param]) -> Result<Overlap> {
        let tensors: Vec<Tensor> = params.iter().map(|p| p.tensor.shallow_clone()).collect();
        let gate = Arc::new(Gate::new(tensors.len()));
        let hooks = GradReady::register(&tensors, gate.clone())
            .map_err(|e| Error::Model(format!("cannot hook the model's gradients: {e}")))?;
        Ok(Overlap { hooks, gate })
    }

    /// The order this rank's gradients become ready in: one forward and backward pass in
    /// evaluation mode (BatchNorm's statistics and dropout's random numbers untouched) on
    /// training sample `rank` (each rank its own, so a backward pass that depends on the data
    /// shows), its gradients forgotten after; tensors it gives no gradient come last.
    pub(super) fn record(
        &self,
        model: &Model,
        data: &mut DataTensors,
        params: &[Param],
        rank: usize,
    ) -> Result<Vec<usize>> {
        let sample = (rank % data.train.len.max(1)) as i64;
        let (x, y) = data.train_batch(&[sample], 0)?;
        self.gate.open(&vec![false; params.len()]);
        let passed = model.forward(&x, false).and_then(|logits| {
            loss::smoothed_cross_entropy(&logits.to_kind(Kind::Float), &y, 0.0)
                .f_backward()
                .map_err(|e| model.fault("backward", &e.to_string()))
        });
        self.gate.finish();
        let (reported, _) = self.gate.close();
        let tensors: Vec<&Tensor> = params.iter().map(|p| &p.tensor).collect();
        forget_grads(&tensors);
        passed?;
        Ok(order::complete(&reported, params.len()))
    }
}

impl Trainer<'_> {
    /// Phases 3 and 4 overlapped (see the module): forward and backward over each
    /// micro-batch, every bucket summed over the ranks as soon as its gradients are ready.
    /// A fault of the model's forward or backward pass on a rank stops every rank as in the
    /// sequential step, after the exchange (which every rank must finish alike), with the codec
    /// state rolled back and a TorchScript module's buffers put back.
    pub(super) fn pass_overlapped(
        &mut self,
        batch: &Batch,
        epsilon: f32,
        step: u64,
    ) -> Result<Passed> {
        let started = Instant::now();
        let buffers = match &self.model {
            Model::Script(script) => Some(script.save_buffers()),
            Model::Builtin(_) => None,
        };
        self.opt.zero_grad();
        let mut loss_sum = Tensor::zeros([], (Kind::Double, self.device));
        let computed = self.all_but_last_backward(batch, epsilon, &mut loss_sum);
        self.lose_on_purpose(step);
        let found = self.open_gate(computed.as_ref().ok())?;
        let Trainer {
            overlap,
            opt,
            gradients,
            world,
            policies,
            ..
        } = self;
        let gate = &overlap.as_ref().expect("an overlapped step has hooks").gate;
        let weights: Vec<&Tensor> = opt.params().iter().map(|p| &p.tensor).collect();
        let codec = policies.codec_mut();
        let has_codec = codec.is_some();
        let last_backward = Instant::now();
        let (exchanged, backward) = std::thread::scope(|s| {
            let worker = computed.as_ref().ok().map(|l| {
                let (loss, gate) = (l.shallow_clone(), gate.clone());
                s.spawn(move || {
                    let computing = lsgd_collective::Computing::begin();
                    let done = loss.f_backward();
                    drop(computing);
                    gate.finish();
                    done
                })
            });
            if worker.is_none() {
                gate.finish();
            }
            let exchanged = gradients.exchange_ready(world, codec, &weights, step, &mut |b| {
                // A backward pass that failed ends the wait; the exchange still finishes, as
                // on every other rank, and the fault is agreed below.
                gate.wait(b.tensors());
            });
            let backward =
                worker.map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            (exchanged, backward)
        });
        let ended = Instant::now();
        let (_, finished) = gate.close();
        let finished = finished.unwrap_or(ended);
        let failure = match (computed, backward) {
            (Err(e), _) => Some(e),
            (Ok(_), Some(Err(e))) => Some(self.model.fault("backward", &e.to_string())),
            _ => None,
        };
        let mut exchanged = self.settle(exchanged, has_codec, step)?;
        exchanged.traffic += found;
        self.model_fault_after_exchange(failure, buffers)?;
        Ok(Passed {
            loss_sum,
            exchanged,
            compute_s: finished.duration_since(started).as_secs_f64(),
            exposed_s: ended.saturating_duration_since(finished).as_secs_f64(),
            backward_s: finished
                .saturating_duration_since(last_backward)
                .as_secs_f64(),
        })
    }

    /// Before the backward pass of `loss` (`None`: this rank's forward pass failed, and no
    /// backward pass follows): the tensors its graph does not reach get their zero gradient
    /// where they need one (with `find_unused`, agreed by one small all-reduce, whose traffic
    /// this returns), and the gate opens with them ready, the others ready once their hooks
    /// report.
    fn open_gate(&mut self, loss: Option<&Tensor>) -> Result<Traffic> {
        let Overlap { hooks, gate } = self.overlap.as_ref().expect("an overlapped step has hooks");
        let weights: Vec<&Tensor> = self.opt.params().iter().map(|p| &p.tensor).collect();
        let in_graph = match loss {
            Some(l) => hooks
                .reached(l)
                .map_err(|e| Error::Model(format!("cannot walk the backward graph: {e}")))?,
            None => vec![false; weights.len()],
        };
        // What the sequential step sees as a gradient after its backward pass.
        let reached: Vec<bool> = in_graph
            .iter()
            .zip(&weights)
            .map(|(&g, w)| g || w.grad().defined())
            .collect();
        let found = self
            .gradients
            .zero_unreached(self.world, &weights, &reached)?;
        let not_in_graph: Vec<bool> = in_graph.iter().map(|g| !g).collect();
        gate.open(&not_in_graph);
        Ok(found)
    }

    /// Forward and backward of every micro-batch but the last, then the last one's forward
    /// pass: its loss, for the backward pass that overlaps the exchange.
    fn all_but_last_backward(
        &mut self,
        batch: &Batch,
        epsilon: f32,
        loss_sum: &mut Tensor,
    ) -> Result<Tensor> {
        let (last, earlier) = batch.micro.split_last().expect("a batch has a micro-batch");
        let mut offset = 0;
        for &m in earlier {
            let (scaled, sum) = self.micro_loss(batch, offset, m, epsilon, 1.0)?;
            self.backward(&scaled)?;
            *loss_sum += sum;
            offset += m;
        }
        let (scaled, sum) = self.micro_loss(batch, offset, *last, epsilon, 1.0)?;
        *loss_sum += sum;
        Ok(scaled)
    }

    /// A fault of the model on some rank (`failure`: this rank's), once the exchange is
    /// through: with several ranks and a TorchScript model, agreed as in `model_pass` (one
    /// flag per step); then the codec state is rolled back and the module's buffers put back,
    /// so that the checkpoint holds the state before the step.
    fn model_fault_after_exchange(
        &mut self,
        failure: Option<Error>,
        buffers: Option<Vec<Tensor>>,
    ) -> Result<()> {
        let scripted = matches!(self.model, Model::Script(_));
        let failed = if scripted && self.agrees() {
            self.world.agree_failure(failure.is_some())?.is_some()
        } else {
            failure.is_some()
        };
        if !failed {
            return Ok(());
        }
        self.gradients.rollback();
        if let (Model::Script(script), Some(buffers)) = (&self.model, &buffers) {
            script.restore_buffers(buffers);
        }
        match failure {
            Some(fault) if !scripted => Err(fault),
            // The agreement again, now to stop every rank with the faulting rank's message.
            failure => self.agreed("model", failure.map_or(Ok(()), Err)),
        }
    }
}
