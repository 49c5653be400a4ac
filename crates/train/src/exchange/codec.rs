//! The gradient exchange through a codec plugin (`--codec`), with the host's error feedback
//! (`--error-feedback`, [`super::feedback`]).
//!
//! Each bucket goes through the one exchange ([`lsgd_runtime::exchange`]: the rounds, the
//! length agreement, the sum or gather, the decodes, the next codec state) over the world, a
//! summed payload all-reduced with `--allreduce`. What is the trainer's is here: the buckets'
//! metadata and seeds, the error-feedback memory, the codec state between steps, and the
//! errors, which name the codec, the step, the bucket and the round.
//!
//! Error feedback is GRACE's residual memory: p = g + e; c = C(p); e ← p − D(c), where D(c) is
//! the decode of this rank's own payload (or, in `mean` mode, PyTorch's e ← p − D(Σ)/k); or
//! DGC's momentum correction, which accumulates the velocity instead of the gradient and zeroes
//! it where the payload sent ([`Memory`]). Its state is per bucket and per rank, and goes into
//! every checkpoint. A stateful codec's own state (contract 0.4) is per bucket and the same on
//! every rank ([`Carried`]); `next-state` is called after each bucket's decode.

use lsgd_codec::wire::{f32s_from_le, put_f32s};
use lsgd_codec::{Element, Meta, Properties};
use lsgd_collective::{Agreement, Algorithm, Traffic, World};
use lsgd_runtime::codec::{bucket_meta, check_properties};
use lsgd_runtime::exchange::{Decoded, Lengths, Mover, Own, Plan, Stop, exchange};
use lsgd_runtime::plugin::{Plugin, PluginError};
use tch::{Kind, Tensor};

use super::Exchanged;
use super::buckets::Bucket;
use super::carry::Carried;
use super::feedback::{ErrorFeedback, Memory};
use crate::{Error, Result};

/// Largest bucket handed to a codec call, in floats (4 MiB of binary32).
pub const MAX_BUCKET_FLOATS: usize = 1 << 20;

/// Prefix of the error-feedback residuals in checkpoints: `ef.rank{r}.bucket{b}` (the
/// accumulation v with `--error-feedback momentum`).
pub const RESIDUAL_PREFIX: &str = "ef.";

/// Prefix of the momentum-correction velocities in checkpoints: `ef.velocity.rank{r}.bucket{b}`.
pub const VELOCITY_PREFIX: &str = "ef.velocity.";

/// The codec side of a run's exchange: the codec's properties and the error-feedback state.
pub struct Compressor {
    properties: Properties,
    /// Per bucket residual (and velocity), with error feedback; it also keeps the state before
    /// the last exchange, which [`Compressor::rollback`] puts back when the step that
    /// exchanged stops before its update.
    memory: Option<Memory>,
    /// `--error-feedback`: which reconstruction the residual is taken against.
    error_feedback: ErrorFeedback,
    /// A stateful codec's per-bucket state (`None` for a codec that keeps none).
    carried: Option<Carried>,
    seed: u64,
    label: String,
}

/// The trainer's collectives for the one exchange ([`lsgd_runtime::exchange`]): the world,
/// with `--allreduce`'s algorithm for summed payloads, and the traffic they made.
struct Link<'a> {
    world: &'a mut World,
    algo: Algorithm,
    traffic: Traffic,
}

impl Mover for Link<'_> {
    type Error = lsgd_collective::Error;
    fn rank(&self) -> usize {
        self.world.rank()
    }
    fn size(&self) -> usize {
        self.world.size()
    }
    fn agree_lengths(&mut self, mine: Option<u64>) -> lsgd_collective::Result<Lengths> {
        Ok(match self.world.agree_lengths(mine)? {
            Agreement::Lengths(lengths) => Lengths::Agreed(lengths),
            Agreement::Failed { rank } => Lengths::Failed { rank },
        })
    }
    fn sum(&mut self, element: Element, payload: &[u8]) -> lsgd_collective::Result<Vec<u8>> {
        let (sum, t) = self.world.all_reduce_payload(self.algo, element, payload)?;
        self.traffic += t;
        Ok(sum)
    }
    fn gather(&mut self, payload: &[u8]) -> lsgd_collective::Result<Vec<Vec<u8>>> {
        let (all, t) = self.world.all_gather_bytes(payload)?;
        self.traffic += t;
        Ok(all)
    }
}

impl Compressor {
    /// Asks the codec for its properties and checks them; `buckets` is the run's layout,
    /// `momentum` the m of `--error-feedback momentum`.
    pub fn new(
        codec: &mut Plugin,
        buckets: &[Bucket],
        error_feedback: ErrorFeedback,
        momentum: f64,
        seed: u64,
    ) -> Result<Self> {
        let properties = codec.properties()?;
        let label = codec.label().to_string();
        check_properties(&label, properties).map_err(Error::Config)?;
        let lens: Vec<usize> = buckets.iter().map(|b| b.len).collect();
        Ok(Compressor {
            properties,
            memory: Memory::new(error_feedback, momentum, &lens),
            error_feedback,
            carried: properties.stateful.then(|| Carried::new(buckets.len())),
            seed,
            label,
        })
    }

    /// The codec's properties.
    pub fn properties(&self) -> Properties {
        self.properties
    }

    /// A stateful codec's per-bucket state, as it stands between steps.
    pub fn carried(&self) -> Option<&Carried> {
        self.carried.as_ref()
    }

    /// The bucket's metadata at `step`: seeds differ per run, step and bucket, and the rank
    /// seed also per rank; a stateful codec's state for the bucket.
    fn meta(&self, bucket: &Bucket, b: usize, step: u64, rank: usize) -> Meta {
        let mut meta = bucket_meta(
            self.seed,
            step,
            b as u32,
            rank,
            bucket.len as u32,
            bucket.slices.clone(),
        );
        if let Some(c) = &self.carried {
            meta.state = c.get(b).to_vec();
        }
        meta
    }

    /// Replaces the gradients of `weights` by the sum over ranks of what the codec makes of
    /// them, bucket by bucket, each once `ready` has returned for it (the gradient-ready wait
    /// of the overlapped step); with error feedback, updates its state once every bucket is
    /// through.
    #[allow(clippy::too_many_arguments)]
    pub fn exchange(
        &mut self,
        world: &mut World,
        algo: Algorithm,
        codec: &mut Plugin,
        buckets: &[Bucket],
        weights: &[&Tensor],
        step: u64,
        ready: &mut dyn FnMut(&Bucket),
    ) -> Result<Exchanged> {
        let _guard = tch::no_grad_guard();
        let mut link = Link {
            world,
            algo,
            traffic: Traffic::default(),
        };
        let mut out = Exchanged::default();
        // A decode that failed here, told to the others at the next agreement.
        let mut failed: Option<PluginError> = None;
        let mut staged = Vec::with_capacity(buckets.len());
        let mut next_states = Vec::with_capacity(buckets.len());
        for (b, bucket) in buckets.iter().enumerate() {
            ready(bucket);
            let mut data = bucket.gather(weights)?;
            let velocity = self.memory.as_ref().map(|m| m.compensate(b, &mut data));
            out.floats += data.len() as u64;
            let meta = self.meta(bucket, b, step, link.world.rank());
            let plan = Plan {
                properties: self.properties,
                own: self.own(),
                failed: failed.is_some(),
            };
            let done = exchange(codec, &mut link, &meta, &data, plan)
                .map_err(|stop| self.stopped(stop, failed.take(), &meta))?;
            out.payload_bytes += done.payloads.iter().map(|p| p.len() as u64).sum::<u64>();
            match done.decoded {
                Ok(Decoded { sum, own, next }) => {
                    if let (Some(m), Some(u)) = (&self.memory, velocity) {
                        staged.push(m.settle(&data, &own, u));
                    }
                    next_states.extend(next);
                    bucket.scatter(weights, &sum);
                }
                // The next agreement (a later bucket's, or the final one) tells the others.
                Err(e) => failed = Some(e),
            }
        }
        out.traffic = link.traffic;
        // A decode that failed only here (the own payload, for the residual) must stop every
        // rank, as must one in the last bucket, which no later agreement would see.
        match (link.world.agree_failure(failed.is_some())?, failed) {
            (_, Some(e)) => return Err(Error::Plugin(e)),
            (Some(r), None) => {
                return Err(Error::Exchange(format!(
                    "codec {} failed on rank {r} at step {step}; see that rank's error",
                    self.label
                )));
            }
            (None, None) => {}
        }
        if let Some(m) = &mut self.memory {
            m.commit(staged);
        }
        if let Some(c) = &mut self.carried {
            c.commit(next_states);
        }
        Ok(out)
    }

    /// Error feedback's reconstruction of this rank's share: the decode of its own payload,
    /// or in `mean` mode the sum divided by the ranks; none without error feedback.
    fn own(&self) -> Own {
        match (&self.memory, self.error_feedback) {
            (None, _) => Own::Skip,
            (Some(_), ErrorFeedback::Mean) => Own::Mean,
            (Some(_), _) => Own::Decode,
        }
    }

    /// The error a bucket's exchange stopped every rank with; `pending` is this rank's decode
    /// fault of an earlier bucket, if it had one.
    fn stopped(
        &self,
        stop: Stop<lsgd_collective::Error, PluginError>,
        pending: Option<PluginError>,
        meta: &Meta,
    ) -> Error {
        match stop {
            Stop::Move(e) => Error::Collective(e),
            Stop::Codec { rank, round, here } => match here.or(pending) {
                Some(e) => Error::Plugin(e),
                None => Error::Exchange(format!(
                    "codec {} failed on rank {rank} at step {} (bucket {}, round {round}); see that rank's error",
                    self.label, meta.step, meta.bucket
                )),
            },
            Stop::Lengths {
                round,
                lengths,
                element,
            } => Error::Exchange(format!(
                "codec {} at step {} (bucket {}, round {round}): a summable payload must have the same length on every rank and hold whole {element:?} elements, but the lengths are {lengths:?}",
                self.label, meta.step, meta.bucket
            )),
        }
    }

    /// Puts back the error-feedback state and the codec's own state from before the last
    /// exchange (once).
    pub fn rollback(&mut self) {
        if let Some(m) = &mut self.memory {
            m.rollback();
        }
        if let Some(c) = &mut self.carried {
            c.rollback();
        }
    }

    /// Every rank's error-feedback state (residuals, and velocities with `--error-feedback
    /// momentum`) and a stateful codec's state as named tensors for the checkpoint (a
    /// collective: every rank calls it, rank 0 writes them).
    pub fn checkpoint_tensors(&self, world: &World) -> Result<Vec<(String, Tensor)>> {
        let mut out = self
            .carried
            .as_ref()
            .map(Carried::tensors)
            .unwrap_or_default();
        let Some(m) = &self.memory else {
            return Ok(out);
        };
        for (prefix, state) in [
            (RESIDUAL_PREFIX, m.residuals()),
            (VELOCITY_PREFIX, m.velocities()),
        ] {
            for (b, r) in state.iter().enumerate() {
                let mut bytes = Vec::new();
                put_f32s(&mut bytes, r);
                let (all, _) = world.all_gather_bytes(&bytes)?;
                for (rank, bytes) in all.iter().enumerate() {
                    out.push((
                        format!("{prefix}rank{rank}.bucket{b}"),
                        Tensor::from_slice(&f32s_from_le(bytes)),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Restores this rank's error-feedback state from a checkpoint's tensors, written by any
    /// number of ranks: on `size` ranks, rank r takes the sum of the saved ranks r, r + size,
    /// r + 2·size …, and a rank the checkpoint did not have starts from zero. Residuals and
    /// velocities enter the update only through their sum over the ranks, so that sum (what is
    /// still owed to the model) survives a resume on fewer or more ranks, as after a lost rank.
    /// A stateful codec's state is the same on every rank, so every rank takes it as saved.
    pub fn restore(
        &mut self,
        tensors: &[(String, Tensor)],
        rank: usize,
        size: usize,
    ) -> Result<()> {
        if let Some(c) = &mut self.carried {
            c.restore(tensors)?;
        }
        let Some(m) = &mut self.memory else {
            return Ok(());
        };
        let saved_ranks = (0..)
            .take_while(|r| {
                let key = format!("{RESIDUAL_PREFIX}rank{r}.bucket0");
                tensors.iter().any(|(n, _)| *n == key)
            })
            .count()
            .max(1);
        let (residuals, velocities) = m.state_mut();
        for (prefix, what, state) in [
            (RESIDUAL_PREFIX, "error-feedback residual", residuals),
            (VELOCITY_PREFIX, "momentum-correction velocity", velocities),
        ] {
            for (b, r) in state.iter_mut().enumerate() {
                let mut sum = vec![0.0f32; r.len()];
                for saved in (rank..saved_ranks).step_by(size.max(1)) {
                    let key = format!("{prefix}rank{saved}.bucket{b}");
                    for (s, v) in sum
                        .iter_mut()
                        .zip(saved_bucket(tensors, &key, what, r.len())?)
                    {
                        *s += v;
                    }
                }
                *r = sum;
            }
        }
        Ok(())
    }
}

/// The `len` floats a checkpoint saved under `key` (a `what` of one bucket).
pub(super) fn saved_bucket(
    tensors: &[(String, Tensor)],
    key: &str,
    what: &str,
    len: usize,
) -> Result<Vec<f32>> {
    let t = tensors
        .iter()
        .find(|(n, _)| *n == key)
        .map(|(_, t)| t)
        .ok_or_else(|| {
            Error::Checkpoint(format!(
                "no {what} `{key}`: the checkpoint was written with another --error-feedback \
                 or another bucket layout"
            ))
        })?;
    let v = Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1))?;
    if v.len() != len {
        return Err(Error::Checkpoint(format!(
            "{what} `{key}` has {} floats, its bucket has {len}",
            v.len()
        )));
    }
    Ok(v)
}
