//! The gradient exchange through a codec plugin (`--codec`), with the host's error feedback
//! (`--error-feedback`, [`super::feedback`]).
//!
//! For each bucket and round the codec encodes this rank's data; the host then moves the
//! payloads as the codec declared:
//!
//! - `sum(element)`: one all-reduce of the payloads in that element type with `--allreduce`,
//!   then one `decode` of the sum;
//! - `gather`: an all-gather of every rank's payload, a `decode` of each, and a sum of the
//!   decoded floats in rank order (so every rank adds the same numbers in the same order).
//!
//! Error feedback is GRACE's residual memory: p = g + e; c = C(p); e ← p − D(c), where D(c) is
//! the decode of this rank's own payload (or, in `mean` mode, PyTorch's e ← p − D(Σ)/k); or
//! DGC's momentum correction, which accumulates the velocity instead of the gradient and zeroes
//! it where the payload sent ([`Memory`]). Its state is per bucket and per rank, and goes into
//! every checkpoint. A stateful codec's own state (contract 0.4) is per bucket and the same on
//! every rank ([`Carried`]); `next-state` is called after each bucket's decode.
//!
//! Before each collective the ranks agree on every payload's length (and on any fault), so a
//! codec that misbehaves on one rank stops all ranks with an error instead of a hang.

use lsgd_codec::wire::{f32s_from_le, put_f32s};
use lsgd_codec::{Combine, Meta, Properties};
use lsgd_collective::{Agreement, Algorithm, World};
use lsgd_runtime::codec::{bucket_meta, check_properties};
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

/// How one bucket's exchange ended on this rank.
enum Outcome {
    /// The sum over ranks, this rank's own reconstruction (empty without error feedback) and,
    /// for a stateful codec, the bucket's state for the next step.
    Done {
        sum: Vec<f32>,
        own: Vec<f32>,
        next: Option<Vec<u8>>,
    },
    /// A decode failed here, after the bucket's collectives: carry on to the next agreement.
    Skipped,
}

/// What one exchange talks to: the ranks, the collective algorithm and the codec.
struct Link<'a> {
    world: &'a mut World,
    algo: Algorithm,
    codec: &'a mut Plugin,
}

/// One exchange's running totals on this rank, and the codec fault it met, if any.
#[derive(Default)]
struct Tally {
    out: Exchanged,
    failed: Option<PluginError>,
}

/// What the rounds of one bucket moved: the combined payloads of a summable codec, or every
/// rank's payload of a gathered one, and this rank's last own payload.
#[derive(Default)]
struct Moved {
    agreed: Vec<Vec<u8>>,
    gathered: Vec<Vec<u8>>,
    own_last: Vec<u8>,
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
    /// them, bucket by bucket; with error feedback, updates its state once every bucket is
    /// through.
    pub fn exchange(
        &mut self,
        world: &mut World,
        algo: Algorithm,
        codec: &mut Plugin,
        buckets: &[Bucket],
        weights: &[&Tensor],
        step: u64,
    ) -> Result<Exchanged> {
        let _guard = tch::no_grad_guard();
        let mut link = Link { world, algo, codec };
        let mut tally = Tally::default();
        let mut staged = Vec::with_capacity(buckets.len());
        let mut next_states = Vec::with_capacity(buckets.len());
        for (b, bucket) in buckets.iter().enumerate() {
            let mut data = bucket.gather(weights)?;
            let velocity = self.memory.as_ref().map(|m| m.compensate(b, &mut data));
            tally.out.floats += data.len() as u64;
            let meta = self.meta(bucket, b, step, link.world.rank());
            match self.bucket(&mut link, meta, &data, &mut tally)? {
                Outcome::Done { sum, own, next } => {
                    if let (Some(m), Some(u)) = (&self.memory, velocity) {
                        staged.push(m.settle(&data, &own, u));
                    }
                    next_states.extend(next);
                    bucket.scatter(weights, &sum);
                }
                // The next agreement (a later bucket's, or the final one) tells the others.
                Outcome::Skipped => continue,
            }
        }
        // A decode that failed only here (the own payload, for the residual) must stop every
        // rank, as must one in the last bucket, which no later agreement would see.
        let Tally { out, failed } = tally;
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

    /// Encodes, moves and decodes one bucket. A rank that has failed still takes part in the
    /// length agreement, so that the other ranks stop with it.
    fn bucket(
        &self,
        link: &mut Link,
        mut meta: Meta,
        data: &[f32],
        tally: &mut Tally,
    ) -> Result<Outcome> {
        let mut moved = Moved::default();
        for round in 0..self.properties.rounds {
            meta.round = round;
            self.round(link, &meta, data, &mut moved, tally)?;
        }
        // What every rank received, for a stateful codec's `next-state`.
        let received = match (self.carried.is_some(), self.properties.combine) {
            (false, _) => None,
            (true, Combine::Sum(_)) => Some(moved.agreed.clone()),
            (true, Combine::Gather) => Some(moved.gathered.clone()),
        };
        let ranks = link.world.size();
        let done = self
            .decode(link.codec, &meta, moved, link.world.rank(), ranks)
            .and_then(|(sum, own)| {
                let next = received
                    .map(|agreed| link.codec.next_state(&meta, &agreed))
                    .transpose()?;
                Ok(Outcome::Done { sum, own, next })
            });
        Ok(done.unwrap_or_else(|e| {
            tally.failed = Some(e);
            Outcome::Skipped
        }))
    }

    /// One round of one bucket: encode (unless this rank already failed), agree on the
    /// lengths, then all-reduce or all-gather the payloads.
    fn round(
        &self,
        link: &mut Link,
        meta: &Meta,
        data: &[f32],
        moved: &mut Moved,
        tally: &mut Tally,
    ) -> Result<()> {
        let mine = match tally.failed {
            Some(_) => None,
            None => link
                .codec
                .encode(meta, data, &moved.agreed)
                .map_err(|e| tally.failed = Some(e))
                .ok(),
        };
        let lens = match link
            .world
            .agree_lengths(mine.as_ref().map(|p| p.len() as u64))?
        {
            Agreement::Lengths(lens) => lens,
            Agreement::Failed { rank } => {
                return Err(match tally.failed.take() {
                    Some(e) => Error::Plugin(e),
                    None => Error::Exchange(format!(
                        "codec {} failed on rank {rank} at step {} (bucket {}, round {}); see that rank's error",
                        self.label, meta.step, meta.bucket, meta.round
                    )),
                });
            }
        };
        let mine = mine.expect("no rank failed");
        tally.out.payload_bytes += mine.len() as u64;
        match self.properties.combine {
            Combine::Sum(element) => {
                if lens.iter().any(|l| *l != lens[0])
                    || !(lens[0] as usize).is_multiple_of(element.size())
                {
                    return Err(Error::Exchange(format!(
                        "codec {} at step {} (bucket {}, round {}): a summable payload must have the same length on every rank and hold whole {element:?} elements, but the lengths are {lens:?}",
                        self.label, meta.step, meta.bucket, meta.round
                    )));
                }
                let (sum, t) = link.world.all_reduce_payload(link.algo, element, &mine)?;
                tally.out.traffic += t;
                moved.agreed.push(sum);
                moved.own_last = mine;
            }
            Combine::Gather => {
                let (all, t) = link.world.all_gather_bytes(&mine)?;
                tally.out.traffic += t;
                moved.gathered = all;
            }
        }
        Ok(())
    }

    /// Decodes what the rounds moved into the sum over ranks and (with error feedback, or for
    /// a gathered codec) this rank's own reconstruction: the decode of its own payload, or in
    /// `mean` mode the sum divided by the `ranks`.
    fn decode(
        &self,
        codec: &mut Plugin,
        meta: &Meta,
        moved: Moved,
        rank: usize,
        ranks: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), PluginError> {
        let (sum, own) = self.sum_and_own(codec, meta, moved, rank)?;
        if self.error_feedback == ErrorFeedback::Mean {
            let k = ranks as f32;
            let mean = sum.iter().map(|x| x / k).collect();
            return Ok((sum, mean));
        }
        Ok((sum, own))
    }

    /// The sum over ranks and the decode of this rank's own payload (empty unless error
    /// feedback other than `mean` needs it or the codec is gathered, which decodes it anyway).
    fn sum_and_own(
        &self,
        codec: &mut Plugin,
        meta: &Meta,
        moved: Moved,
        rank: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), PluginError> {
        let Moved {
            mut agreed,
            gathered,
            own_last,
        } = moved;
        match self.properties.combine {
            Combine::Sum(_) => {
                let sum = codec.decode(meta, &agreed)?;
                let own = if self.memory.is_some() && self.error_feedback != ErrorFeedback::Mean {
                    agreed.pop();
                    agreed.push(own_last);
                    codec.decode(meta, &agreed)?
                } else {
                    Vec::new()
                };
                Ok((sum, own))
            }
            Combine::Gather => {
                let mut sum = vec![0.0f32; meta.len as usize];
                let mut own = Vec::new();
                for (r, p) in gathered.into_iter().enumerate() {
                    let v = codec.decode(meta, std::slice::from_ref(&p))?;
                    for (s, x) in sum.iter_mut().zip(&v) {
                        *s += x;
                    }
                    if r == rank {
                        own = v;
                    }
                }
                Ok((sum, own))
            }
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
fn saved_bucket(
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
