//! Asynchronous SGD with a parameter server (`--mode async`), the other half of the
//! Hitchhiker's guide's data parallelism: workers do not wait for each other.
//!
//! Rank 0 is the server. It holds the weights, the optimizer, the policies, the clock, the
//! metrics and the checkpoints, and never computes a gradient. Every other rank is a worker
//! that loops: receive the weights and a batch, compute the gradient, send it back. The server
//! applies each gradient as it arrives (the policies decide with the server's step count, so a
//! schedule sees one step per applied gradient, and with world size 1, since an update's batch
//! is one worker's), then sends that worker the new weights and its next batch. A gradient applied at step s was computed on the weights of step v ≤ s:
//! its *staleness* s − v is recorded per step (with W workers of equal speed, about W − 1).
//!
//! - **Data**: the server hands out the shared sample order in the order it assigns work, so
//!   each gradient is the mean over `global_batch` samples (the decision's batch: in async mode
//!   the batch of one gradient) that no other gradient of the epoch saw.
//! - **BatchNorm**: running statistics travel back with each gradient; the server keeps those
//!   of the gradient it applied last (as DDP keeps rank 0's).
//! - **Checkpoints** are the server's state. Gradients in flight when the run stops are
//!   dropped; a resume hands their samples out again.
//! - **Faults**: a policy fault on the server saves its checkpoint as in sync mode; the server
//!   then collects the work in flight and tells every worker to stop, so no rank hangs.
//!
//! The messages are MPI point to point; between two ranks MPI keeps them in order. Server →
//! worker: `TASK` (`[WORK or STOP, version, ε bits, samples, stream position]`), `INDICES`, `WEIGHTS` (every
//! model variable in name order, as f32). Worker → server: `RESULT` (`[version, samples, loss
//! sum bits, micro-batches]`) and `GRADIENT` (the gradients in the optimizer's order, then the
//! buffers in name order).

use std::collections::BTreeMap;
use std::time::Instant;

use lsgd_collective::Traffic;
use lsgd_runtime::plugin::PolicyKind;
use lsgd_runtime::policy::Decision;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::{Batch, Stepped, Trainer};
use crate::exchange::Exchanged;
use crate::optim::Param;
use crate::order::micro_batches;
use crate::precision::Precision;
use crate::{Error, Result, Summary};

const TASK: i32 = 0x1a50;
const INDICES: i32 = 0x1a51;
const WEIGHTS: i32 = 0x1a52;
const RESULT: i32 = 0x1a53;
const GRADIENT: i32 = 0x1a54;

/// The first word of a `TASK`.
const STOP: u64 = 0;
const WORK: u64 = 1;

/// The server's rank.
const SERVER: usize = 0;

/// Where the flat messages go in the model: every variable (weights), the trainable ones in
/// the optimizer's order (gradients) and the others (BatchNorm's running statistics).
struct Layout {
    variables: Vec<Tensor>,
    buffers: Vec<Tensor>,
    params: Vec<Tensor>,
}

impl Layout {
    fn new(vs: &VarStore, params: &[Param]) -> Self {
        let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let trainable = |n: &str| params.iter().any(|p| p.name == n);
        Layout {
            buffers: named
                .iter()
                .filter(|(n, _)| !trainable(n))
                .map(|(_, t)| t.shallow_clone())
                .collect(),
            variables: named.into_iter().map(|(_, t)| t).collect(),
            params: params.iter().map(|p| p.tensor.shallow_clone()).collect(),
        }
    }

    /// What a `GRADIENT` message holds: the gradients, then the buffers.
    fn gradient_parts(&self) -> Vec<Tensor> {
        let grads = self.params.iter().map(Tensor::grad);
        grads
            .chain(self.buffers.iter().map(Tensor::shallow_clone))
            .collect()
    }

    /// The worker's message.
    fn gradient_message(&self) -> Result<Vec<f32>> {
        flatten(&self.gradient_parts())
    }

    /// The server's side of [`Layout::gradient_message`].
    fn apply_gradient_message(&self, flat: &[f32]) -> Result<()> {
        unflatten(flat, &self.gradient_parts())
    }
}

/// Every tensor's elements in order, as f32 (integer buffers are small counts, exact in f32).
fn flatten(tensors: &[Tensor]) -> Result<Vec<f32>> {
    let _guard = tch::no_grad_guard();
    let parts: Vec<Tensor> = tensors
        .iter()
        .map(|t| t.detach().to_kind(Kind::Float).reshape([-1]))
        .collect();
    let flat = Tensor::cat(&parts, 0).to_device(Device::Cpu);
    Ok(Vec::<f32>::try_from(&flat)?)
}

/// Copies `flat` into `tensors` (each in its own kind and device); the lengths must match.
fn unflatten(flat: &[f32], tensors: &[Tensor]) -> Result<()> {
    let need: usize = tensors.iter().map(Tensor::numel).sum();
    if need != flat.len() {
        return Err(Error::Config(format!(
            "--mode async: a message of {} floats for {need} model elements (do all ranks run \
             the same model?)",
            flat.len()
        )));
    }
    let _guard = tch::no_grad_guard();
    let mut offset = 0;
    for t in tensors {
        let n = t.numel();
        let part = Tensor::from_slice(&flat[offset..offset + n])
            .reshape(t.size())
            .to_kind(t.kind())
            .to_device(t.device());
        t.shallow_clone().copy_(&part);
        offset += n;
    }
    Ok(())
}

/// What a worker sent back with its gradient.
struct Computed {
    version: u64,
    samples: usize,
    loss_sum: f64,
    micro: usize,
}

impl<'w> Trainer<'w> {
    /// Trains in `--mode async`: the server's loop on rank 0, a worker's on the others.
    pub(super) fn run_async(mut self) -> Result<Summary> {
        self.check_async()?;
        let layout = Layout::new(&self.vs, self.opt.params());
        self.materialize_grads();
        if !self.world.is_root() {
            return self.work(&layout);
        }
        self.announce_async();
        self.started = std::time::Instant::now();
        let workers: Vec<usize> = (1..self.world.size()).collect();
        let mut busy = vec![false; self.world.size()];
        let served = self.serve(&layout, &workers, &mut busy);
        let released = self.release(&workers, &busy);
        served?;
        released?;
        self.finish()
    }

    /// Refuses what asynchronous SGD cannot do, on every rank alike (before any message).
    fn check_async(&self) -> Result<()> {
        let size = self.world.size();
        if size < 2 {
            return Err(Error::Config(format!(
                "--mode async needs at least 2 ranks under mpirun (rank 0 serves, the others \
                 compute gradients); this run has {size}"
            )));
        }
        if let Some(codec) = self.policies.get(PolicyKind::Codec) {
            return Err(Error::Config(format!(
                "--mode async sends whole gradients point to point; --codec {} compresses the \
                 synchronous all-reduce",
                codec.label()
            )));
        }
        if self.config.run.mixed_precision.precision == Precision::Fp16 {
            return Err(Error::Config(
                "--mode async takes --precision fp32 or bf16: fp16's skipped steps are agreed by \
                 all ranks, which asynchronous workers never do"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Every parameter gets a gradient tensor of its own (zeros): on the server, what each
    /// arriving gradient is copied into; on a worker, what a message sends even for a
    /// parameter its backward pass never reached (a TorchScript head its forward skips).
    fn materialize_grads(&mut self) {
        let params: Vec<&Tensor> = self.opt.params().iter().map(|p| &p.tensor).collect();
        crate::exchange::zero_grads(&params);
    }

    /// The server's loop: hands out work, applies each gradient as it arrives, until the run
    /// ends or `--stop-after-steps`. `busy[w]` tells which workers have work in flight.
    fn serve(&mut self, layout: &Layout, workers: &[usize], busy: &mut [bool]) -> Result<()> {
        let stop_at = self.config.invocation.stop_after_steps.unwrap_or(u64::MAX);
        let done = |t: &Self| t.clock.finished() || t.clock.step() >= stop_at;
        let mut cursor = self.clock.state().samples_seen;
        let t = Instant::now();
        let mut decision = self.decide()?;
        let mut policy_s = t.elapsed().as_secs_f64();
        // The weights and batches sent after a step go into the next step's traffic.
        let mut sent = Traffic::default();
        for &w in workers {
            if done(self) {
                break;
            }
            sent += self.assign(w, &decision, &mut cursor, layout)?;
            busy[w] = true;
        }
        let mut next = 0;
        while !done(self) {
            let started = Instant::now();
            let w = self.next_result(workers, &mut next)?;
            let computed = self.collect(w, layout)?;
            busy[w] = false;
            let waited = Traffic {
                bytes_sent: 0,
                seconds: started.elapsed().as_secs_f64(),
            };
            let traffic = std::mem::take(&mut sent) + waited;
            self.apply(w, computed, decision, (started, policy_s, traffic), layout)?;
            if done(self) {
                break;
            }
            let t = Instant::now();
            decision = self.decide()?;
            policy_s = t.elapsed().as_secs_f64();
            sent = self.assign(w, &decision, &mut cursor, layout)?;
            busy[w] = true;
        }
        Ok(())
    }

    /// Waits for the first worker with a result, polling from the one after the worker served
    /// last (`next`, advanced here) so that none is starved.
    fn next_result(&self, workers: &[usize], next: &mut usize) -> Result<usize> {
        let order: Vec<usize> = workers[*next..]
            .iter()
            .chain(&workers[..*next])
            .copied()
            .collect();
        let w = self.world.wait_any(&order, RESULT)?;
        *next = workers
            .iter()
            .position(|&x| x == w)
            .map_or(0, |i| (i + 1) % workers.len());
        Ok(w)
    }

    /// Applies worker `w`'s gradient (already in the parameters' `grad`) at the decided rate
    /// and observes the step; `(started, policy_s, traffic)` are the step's timings.
    fn apply(
        &mut self,
        w: usize,
        computed: Computed,
        mut decision: Decision,
        (started, policy_s, traffic): (Instant, f64, Traffic),
        layout: &Layout,
    ) -> Result<()> {
        let t = Instant::now();
        let scales = self.layer_rates(&decision)?;
        self.update(&decision, &scales);
        let compute_s = t.elapsed().as_secs_f64();
        let staleness = decision.state.step.saturating_sub(computed.version);
        *self.staleness.entry(staleness).or_default() += 1;
        // The clock counts the samples this gradient was computed on.
        decision.global_batch = computed.samples as u32;
        let floats: u64 = layout.params.iter().map(|p| p.numel() as u64).sum();
        self.observe(Stepped {
            decision,
            scales,
            batch: Batch {
                indices: Vec::new(),
                micro: vec![computed.samples.div_ceil(computed.micro.max(1)); computed.micro],
                global: computed.samples,
                mean_over: computed.samples,
                first: 0,
            },
            loss: computed.loss_sum / computed.samples.max(1) as f64,
            own_loss_sum: None,
            loss_scale: None,
            applied: Some((w as u32, staleness)),
            skipped: false,
            exchanged: Exchanged {
                traffic,
                payload_bytes: 4 * floats,
                floats,
            },
            started,
            policy_s,
            compute_s,
            exposed_s: traffic.seconds,
            // The server runs no backward pass; the workers' are theirs.
            backward_s: 0.0,
        })
    }

    /// Sends worker `w` the current weights and the next `decision.global_batch` samples from
    /// `cursor` (the samples handed out so far).
    fn assign(
        &mut self,
        w: usize,
        decision: &Decision,
        cursor: &mut u64,
        layout: &Layout,
    ) -> Result<Traffic> {
        let n = decision.global_batch as usize;
        let indices = self.order.take(*cursor, n);
        let first = *cursor;
        *cursor += n as u64;
        let epsilon = u64::from(decision.label_smoothing.to_bits());
        let task = [WORK, decision.state.step, epsilon, n as u64, first];
        let mut traffic = self.world.send(w, TASK, &task)?;
        traffic += self.world.send(w, INDICES, &indices)?;
        traffic += self.world.send(w, WEIGHTS, &flatten(&layout.variables)?)?;
        Ok(traffic)
    }

    /// Receives worker `w`'s result and puts its gradient and buffers into the server's model.
    fn collect(&mut self, w: usize, layout: &Layout) -> Result<Computed> {
        let header: Vec<u64> = self.world.receive(w, RESULT)?;
        let flat: Vec<f32> = self.world.receive(w, GRADIENT)?;
        let &[version, samples, loss_bits, micro] = header.as_slice() else {
            return Err(Error::Config(format!(
                "--mode async: rank {w} sent a result header of {} words, not 4",
                header.len()
            )));
        };
        layout.apply_gradient_message(&flat)?;
        Ok(Computed {
            version,
            samples: samples as usize,
            loss_sum: f64::from_bits(loss_bits),
            micro: micro as usize,
        })
    }

    /// Ends every worker's loop: waits for the work still in flight (dropped) and sends STOP.
    fn release(&mut self, workers: &[usize], busy: &[bool]) -> Result<()> {
        for &w in workers {
            if busy[w] {
                let _: Vec<u64> = self.world.receive(w, RESULT)?;
                let _: Vec<f32> = self.world.receive(w, GRADIENT)?;
            }
            self.world.send(w, TASK, &[STOP, 0, 0, 0, 0])?;
        }
        Ok(())
    }

    /// A worker's loop: until the server says stop, load the weights it sent, compute the
    /// gradient of the batch it assigned and send it back.
    fn work(mut self, layout: &Layout) -> Result<Summary> {
        let started = Instant::now();
        let (mut gradients, mut samples) = (0u64, 0u64);
        let max_micro = self.config.run.max_micro_batch as usize;
        loop {
            // Polled, not blocked on: Open MPI's blocking receive spins on a core.
            self.world.wait_any(&[SERVER], TASK)?;
            let task: Vec<u64> = self.world.receive(SERVER, TASK)?;
            let &[kind, version, epsilon, n, first] = task.as_slice() else {
                return Err(Error::Config(format!(
                    "--mode async: the server sent a task of {} words, not 5",
                    task.len()
                )));
            };
            if kind == STOP {
                break;
            }
            debug_assert_eq!(kind, WORK);
            let indices: Vec<i64> = self.world.receive(SERVER, INDICES)?;
            let weights: Vec<f32> = self.world.receive(SERVER, WEIGHTS)?;
            unflatten(&weights, &layout.variables)?;
            self.straggle();
            let batch = Batch {
                micro: micro_batches(indices.len(), max_micro),
                global: n as usize,
                mean_over: n as usize,
                indices,
                first,
            };
            let loss_sum = self
                .forward_backward(&batch, f32::from_bits(epsilon as u32))?
                .loss_sum;
            let header = [
                version,
                n,
                loss_sum.double_value(&[]).to_bits(),
                batch.micro.len() as u64,
            ];
            self.world.send(SERVER, RESULT, &header)?;
            self.world
                .send(SERVER, GRADIENT, &layout.gradient_message()?)?;
            gradients += 1;
            samples += n;
        }
        Ok(Summary {
            steps: gradients,
            last_eval: None,
            last_loss: None,
            weights_blake3: crate::weights_blake3(&self.vs),
            checkpoint: self
                .config
                .invocation
                .out
                .join(crate::checkpoint::JSON_NAME),
            loss_scaler: None,
            staleness: BTreeMap::new(),
            samples_per_s: super::per_second(samples, started.elapsed().as_secs_f64()),
        })
    }

    /// The line that opens an asynchronous run, on the server.
    fn announce_async(&mut self) {
        let params: usize = self.opt.params().iter().map(|p| p.tensor.numel()).sum();
        self.progress.line(&format!(
            "training {} ({params} parameters) on {} samples, device {:?}, {} epochs from step {}, \
             asynchronous SGD: rank 0 serves {} worker(s), {} samples per gradient",
            self.config.run.model.arch,
            self.data.train.len,
            self.device,
            self.config.run.epochs,
            self.clock.step(),
            self.world.size() - 1,
            self.config.run.global_batch,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_every_tensor_in_its_own_kind_and_refuse_a_wrong_length() {
        let a = Tensor::from_slice(&[1.5f32, -2.0, 3.25, 0.0]).reshape([2, 2]);
        let b = Tensor::from_slice(&[7i64]);
        let flat = flatten(&[a.shallow_clone(), b.shallow_clone()]).unwrap();
        assert_eq!(flat, [1.5, -2.0, 3.25, 0.0, 7.0]);
        let (x, y) = (
            Tensor::zeros([2, 2], (Kind::Float, Device::Cpu)),
            Tensor::zeros([1], (Kind::Int64, Device::Cpu)),
        );
        unflatten(&flat, &[x.shallow_clone(), y.shallow_clone()]).unwrap();
        assert!(x.equal(&a) && y.equal(&b) && y.kind() == Kind::Int64);
        let e = unflatten(&flat[1..], &[x, y]).unwrap_err().to_string();
        assert!(
            e.contains("a message of 4 floats for 5 model elements"),
            "{e}"
        );
    }
}
