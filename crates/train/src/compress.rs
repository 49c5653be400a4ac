//! The gradient exchange through a codec plugin (`--codec`), with the host's error feedback
//! (`--error-feedback`).
//!
//! The gradients are cut into codec buckets of at most [`MAX_BUCKET_FLOATS`] floats (whole
//! tensors in the optimiser's order; a larger tensor is split at row boundaries), so what
//! crosses the sandbox boundary stays cache-sized. For each bucket and round the codec encodes
//! this rank's data; the host then moves the payloads as the codec declared:
//!
//! - `sum(element)`: one all-reduce of the payloads in that element type with `--allreduce`,
//!   then one `decode` of the sum;
//! - `gather`: an all-gather of every rank's payload, a `decode` of each, and a sum of the
//!   decoded floats in rank order (so every rank adds the same numbers in the same order).
//!
//! Error feedback is GRACE's residual memory: p = g + e; c = C(p); e ← p − D(c), where D(c) is
//! the decode of this rank's own payload. Residuals are per bucket and per rank, and go into
//! every checkpoint.
//!
//! Before each collective the ranks agree on every payload's length (and on any fault), so a
//! codec that misbehaves on one rank stops all ranks with an error instead of a hang.

use anyhow::{Context, Result, bail};
use lsgd_codec::rng::mix;
use lsgd_codec::wire::{f32s_from_le, put_f32s};
use lsgd_codec::{Combine, Element, Meta, Properties, TensorSlice};
use tch::{Device, Kind, Tensor};

use crate::collective::{Algorithm, Half, Traffic, World};
use crate::plugin::{Plugin, PluginError};

/// Largest bucket handed to a codec call, in floats (4 MiB of binary32).
pub const MAX_BUCKET_FLOATS: usize = 1 << 20;

/// Prefix of the error-feedback residuals in checkpoints: `ef.rank{r}.bucket{b}`.
pub const RESIDUAL_PREFIX: &str = "ef.";

/// One contiguous run of a tensor's elements inside a bucket.
#[derive(Debug, Clone, PartialEq)]
struct Piece {
    /// Index of the tensor in the optimiser's order.
    tensor: usize,
    /// First element within the flattened tensor.
    start: usize,
    /// Elements.
    len: usize,
}

/// The tensors (or row ranges of tensors) one codec call sees.
#[derive(Debug, Clone, PartialEq)]
struct Bucket {
    pieces: Vec<Piece>,
    /// What the codec is told about them.
    slices: Vec<TensorSlice>,
    len: usize,
}

/// Cuts tensors of the given names and shapes into buckets of at most `cap` floats, in order:
/// a tensor that does not fit the current bucket starts a new one, and a tensor larger than
/// `cap` is split into runs of whole rows (a single row larger than `cap` stays whole).
fn layout(tensors: &[(String, Vec<i64>)], cap: usize) -> Vec<Bucket> {
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut open = Bucket {
        pieces: Vec::new(),
        slices: Vec::new(),
        len: 0,
    };
    for (i, (name, shape)) in tensors.iter().enumerate() {
        let numel: usize = shape.iter().map(|d| *d as usize).product();
        let row: usize = shape
            .iter()
            .skip(1)
            .map(|d| *d as usize)
            .product::<usize>()
            .max(1);
        let mut start = 0;
        while start < numel {
            let room = cap.saturating_sub(open.len);
            let left = numel - start;
            let take = if left <= room {
                left
            } else {
                let rows = room / row;
                if rows == 0 && open.len > 0 {
                    buckets.push(std::mem::replace(
                        &mut open,
                        Bucket {
                            pieces: Vec::new(),
                            slices: Vec::new(),
                            len: 0,
                        },
                    ));
                    continue;
                }
                (rows.max(1) * row).min(left)
            };
            open.slices.push(TensorSlice {
                name: name.clone(),
                shape: shape.iter().map(|d| *d as u32).collect(),
                tensor_offset: start as u32,
                bucket_offset: open.len as u32,
                len: take as u32,
            });
            open.pieces.push(Piece {
                tensor: i,
                start,
                len: take,
            });
            open.len += take;
            start += take;
        }
    }
    if open.len > 0 {
        buckets.push(open);
    }
    buckets
}

/// What one exchange did on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Exchanged {
    /// Collective traffic.
    pub traffic: Traffic,
    /// Bytes of this rank's payloads over all buckets and rounds.
    pub payload_bytes: u64,
    /// Floats exchanged (the gradient's size).
    pub floats: u64,
}

impl Exchanged {
    /// Gradient bytes in binary32 over payload bytes.
    pub fn compression_ratio(&self) -> f64 {
        if self.payload_bytes == 0 {
            1.0
        } else {
            (self.floats * 4) as f64 / self.payload_bytes as f64
        }
    }
}

/// Why an exchange failed; every rank returns one when any rank failed.
#[derive(Debug)]
pub enum ExchangeError {
    /// The codec failed on this rank.
    Plugin(PluginError),
    /// It failed elsewhere, or the ranks disagree; the message names the codec and the step.
    Other(anyhow::Error),
}

impl std::fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExchangeError::Plugin(e) => e.fmt(f),
            ExchangeError::Other(e) => write!(f, "{e:#}"),
        }
    }
}

impl std::error::Error for ExchangeError {}

/// The codec exchange of one run: the bucket layout, the codec's properties and the residuals.
pub struct Compressor {
    buckets: Vec<Bucket>,
    properties: Properties,
    /// One residual per bucket, with error feedback.
    residuals: Option<Vec<Vec<f32>>>,
    seed: u64,
    label: String,
}

/// A length reported by a rank that failed before the collective.
const FAILED: u64 = u64::MAX;

/// How one bucket's exchange ended on this rank.
enum Outcome {
    /// The sum over ranks, and this rank's own reconstruction (empty without error feedback).
    Done { sum: Vec<f32>, own: Vec<f32> },
    /// A decode failed here, after the bucket's collectives: carry on to the next agreement.
    Skipped,
    /// An agreement showed this rank failed: every rank stops now.
    Stop,
}

impl Compressor {
    /// Lays out the buckets of `weights` (name and shape, optimiser order) and asks the codec
    /// for its properties; `cap` floats per bucket at most.
    pub fn new(
        codec: &mut Plugin,
        weights: &[(String, Vec<i64>)],
        cap: usize,
        error_feedback: bool,
        seed: u64,
    ) -> Result<Self> {
        let properties = codec.properties()?;
        let label = codec.label().to_string();
        if properties.rounds == 0 {
            bail!("codec {label}: properties declare 0 rounds; a codec runs at least one");
        }
        if properties.rounds > 1 && properties.combine == Combine::Gather {
            bail!(
                "codec {label}: declares {} rounds with `gather`; only summable codecs can run \
                 several rounds (a gathered payload has no combined form)",
                properties.rounds
            );
        }
        let buckets = layout(weights, cap.clamp(1, MAX_BUCKET_FLOATS));
        let residuals =
            error_feedback.then(|| buckets.iter().map(|b| vec![0.0f32; b.len]).collect());
        Ok(Compressor {
            buckets,
            properties,
            residuals,
            seed,
            label,
        })
    }

    /// Number of buckets.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// True when there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The codec's properties.
    pub fn properties(&self) -> Properties {
        self.properties
    }

    /// The bucket's metadata at `step`: seeds differ per run, step and bucket, and the rank
    /// seed also per rank.
    fn meta(&self, b: usize, step: u64, rank: usize) -> Meta {
        let shared = mix(mix(mix(self.seed) ^ step) ^ b as u64);
        Meta {
            bucket: b as u32,
            step,
            round: 0,
            len: self.buckets[b].len as u32,
            tensors: self.buckets[b].slices.clone(),
            shared_seed: shared,
            rank_seed: mix(shared ^ mix(rank as u64 + 1)),
        }
    }

    /// Replaces the gradients of `weights` by the sum over ranks of what the codec makes of
    /// them, bucket by bucket; with error feedback, updates the residuals.
    pub fn exchange(
        &mut self,
        world: &mut World,
        algo: Algorithm,
        codec: &mut Plugin,
        weights: &[&Tensor],
        step: u64,
    ) -> Result<Exchanged, ExchangeError> {
        let _guard = tch::no_grad_guard();
        let mut out = Exchanged::default();
        let mut failed: Option<PluginError> = None;
        let mut new_residuals = Vec::with_capacity(self.buckets.len());
        for b in 0..self.buckets.len() {
            let mut data = gather_grads(&self.buckets[b], weights).map_err(ExchangeError::Other)?;
            if let Some(r) = &self.residuals {
                for (x, e) in data.iter_mut().zip(&r[b]) {
                    *x += e;
                }
            }
            out.floats += data.len() as u64;
            let meta = self.meta(b, step, world.rank());
            let (sum, own) =
                match self.bucket(world, algo, codec, meta, &data, &mut out, &mut failed)? {
                    Outcome::Done { sum, own } => (sum, own),
                    // The next agreement (a later bucket's, or the final one) tells the others.
                    Outcome::Skipped => continue,
                    Outcome::Stop => {
                        return Err(ExchangeError::Plugin(failed.expect("this rank failed")));
                    }
                };
            if self.residuals.is_some() {
                new_residuals.push(data.iter().zip(&own).map(|(p, d)| p - d).collect());
            }
            scatter_grads(&self.buckets[b], weights, &sum).map_err(ExchangeError::Other)?;
        }
        // A decode that failed only here (the own payload, for the residual) must stop every
        // rank, as must one in the last bucket, which no later agreement would see.
        agree(world, &self.label, step, failed.is_some())?;
        if let Some(e) = failed {
            return Err(ExchangeError::Plugin(e));
        }
        if let Some(r) = &mut self.residuals {
            *r = new_residuals;
        }
        Ok(out)
    }

    /// Encodes, moves and decodes one bucket. A rank that has failed still takes part in the
    /// length agreement, reporting [`FAILED`], so that the other ranks stop with it.
    #[allow(clippy::too_many_arguments)]
    fn bucket(
        &self,
        world: &mut World,
        algo: Algorithm,
        codec: &mut Plugin,
        mut meta: Meta,
        data: &[f32],
        out: &mut Exchanged,
        failed: &mut Option<PluginError>,
    ) -> Result<Outcome, ExchangeError> {
        let rounds = self.properties.rounds;
        let mut agreed: Vec<Vec<u8>> = Vec::new();
        let mut own_last = Vec::new();
        let mut gathered = Vec::new();
        for round in 0..rounds {
            meta.round = round;
            let mine = match failed {
                Some(_) => None,
                None => match codec.encode(&meta, data, &agreed) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        *failed = Some(e);
                        None
                    }
                },
            };
            let len = mine.as_ref().map_or(FAILED, |p| p.len() as u64);
            let lens = world.all_gather_u64(len).map_err(ExchangeError::Other)?;
            if let Some(r) = lens.iter().position(|l| *l == FAILED) {
                return if failed.is_some() {
                    Ok(Outcome::Stop)
                } else {
                    Err(ExchangeError::Other(anyhow::anyhow!(
                        "codec {} failed on rank {r} at step {} (bucket {}, round {round}); see that rank's error",
                        self.label,
                        meta.step,
                        meta.bucket
                    )))
                };
            }
            let mine = mine.expect("no rank failed");
            out.payload_bytes += mine.len() as u64;
            match self.properties.combine {
                Combine::Sum(element) => {
                    if lens.iter().any(|l| *l != lens[0])
                        || !(lens[0] as usize).is_multiple_of(element.size())
                    {
                        return Err(ExchangeError::Other(anyhow::anyhow!(
                            "codec {} at step {} (bucket {}, round {round}): a summable payload must have the same length on every rank and hold whole {element:?} elements, but the lengths are {lens:?}",
                            self.label,
                            meta.step,
                            meta.bucket
                        )));
                    }
                    let (sum, t) = all_reduce_payload(world, algo, element, &mine)
                        .map_err(ExchangeError::Other)?;
                    add(&mut out.traffic, t);
                    agreed.push(sum);
                    own_last = mine;
                }
                Combine::Gather => {
                    let (all, t) = world
                        .all_gather_bytes(&mine)
                        .map_err(ExchangeError::Other)?;
                    add(&mut out.traffic, t);
                    gathered = all;
                }
            }
        }
        let len = meta.len as usize;
        let mut decode = |payloads: &[Vec<u8>]| codec.decode(&meta, payloads);
        let decoded = match self.properties.combine {
            Combine::Sum(_) => decode(&agreed).and_then(|sum| {
                let own = if self.residuals.is_some() {
                    let mut mine = agreed[..agreed.len() - 1].to_vec();
                    mine.push(std::mem::take(&mut own_last));
                    decode(&mine)?
                } else {
                    Vec::new()
                };
                Ok((sum, own))
            }),
            Combine::Gather => {
                let mut sum = vec![0.0f32; len];
                let mut own = Vec::new();
                let mut result = Ok(());
                for (r, p) in gathered.into_iter().enumerate() {
                    match decode(std::slice::from_ref(&p)) {
                        Ok(v) => {
                            for (s, x) in sum.iter_mut().zip(&v) {
                                *s += x;
                            }
                            if r == world.rank() {
                                own = v;
                            }
                        }
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    }
                }
                result.map(|()| (sum, own))
            }
        };
        match decoded {
            Ok((sum, own)) => Ok(Outcome::Done { sum, own }),
            Err(e) => {
                *failed = Some(e);
                Ok(Outcome::Skipped)
            }
        }
    }

    /// Every rank's residuals as named tensors for the checkpoint (a collective: every rank
    /// calls it, rank 0 writes them); empty without error feedback.
    pub fn checkpoint_tensors(&self, world: &World) -> Result<Vec<(String, Tensor)>> {
        let Some(residuals) = &self.residuals else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (b, r) in residuals.iter().enumerate() {
            let mut bytes = Vec::new();
            put_f32s(&mut bytes, r);
            let (all, _) = world.all_gather_bytes(&bytes)?;
            for (rank, bytes) in all.iter().enumerate() {
                let floats = f32s_from_le(bytes);
                out.push((
                    format!("{RESIDUAL_PREFIX}rank{rank}.bucket{b}"),
                    Tensor::from_slice(&floats),
                ));
            }
        }
        Ok(out)
    }

    /// Restores this rank's residuals from a checkpoint's tensors.
    pub fn restore(&mut self, tensors: &[(String, Tensor)], rank: usize) -> Result<()> {
        let Some(residuals) = &mut self.residuals else {
            return Ok(());
        };
        for (b, r) in residuals.iter_mut().enumerate() {
            let key = format!("{RESIDUAL_PREFIX}rank{rank}.bucket{b}");
            let t = tensors
                .iter()
                .find(|(n, _)| *n == key)
                .map(|(_, t)| t)
                .with_context(|| {
                    format!(
                        "no error-feedback residual `{key}`: the checkpoint was written without \
                         --error-feedback, with fewer ranks or another bucket layout"
                    )
                })?;
            let v = Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1))?;
            if v.len() != r.len() {
                bail!(
                    "error-feedback residual `{key}` has {} floats, bucket {b} has {}",
                    v.len(),
                    r.len()
                );
            }
            *r = v;
        }
        Ok(())
    }
}

fn add(total: &mut Traffic, t: Traffic) {
    total.bytes_sent += t.bytes_sent;
    total.seconds += t.seconds;
}

/// Stops every rank if any rank reports a failure.
fn agree(world: &World, label: &str, step: u64, failed_here: bool) -> Result<(), ExchangeError> {
    let flags = world
        .all_gather_u64(u64::from(failed_here))
        .map_err(ExchangeError::Other)?;
    match flags.iter().position(|f| *f != 0) {
        Some(r) if !failed_here => Err(ExchangeError::Other(anyhow::anyhow!(
            "codec {label} failed on rank {r} at step {step}; see that rank's error"
        ))),
        _ => Ok(()),
    }
}

/// Sums a payload of `element`s across ranks with `algo`.
fn all_reduce_payload(
    world: &mut World,
    algo: Algorithm,
    element: Element,
    payload: &[u8],
) -> Result<(Vec<u8>, Traffic)> {
    Ok(match element {
        Element::F32 => {
            let mut v = f32s_from_le(payload);
            let t = world.all_reduce_sum(algo, &mut v)?;
            let mut out = Vec::new();
            put_f32s(&mut out, &v);
            (out, t)
        }
        Element::F16 | Element::Bf16 => {
            let mut v: Vec<u16> = payload
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            let half = if element == Element::F16 {
                Half::F16
            } else {
                Half::Bf16
            };
            let t = world.all_reduce_sum_half(algo, half, &mut v)?;
            (v.iter().flat_map(|x| x.to_le_bytes()).collect(), t)
        }
    })
}

/// The bucket's gradient elements as one binary32 vector.
fn gather_grads(bucket: &Bucket, weights: &[&Tensor]) -> Result<Vec<f32>> {
    let parts: Vec<Tensor> = bucket
        .pieces
        .iter()
        .map(|p| {
            weights[p.tensor]
                .grad()
                .reshape([-1])
                .narrow(0, p.start as i64, p.len as i64)
                .to_device(Device::Cpu)
                .to_kind(Kind::Float)
        })
        .collect();
    Ok(Vec::<f32>::try_from(Tensor::cat(&parts, 0))?)
}

/// Writes `values` back into the bucket's gradient elements.
fn scatter_grads(bucket: &Bucket, weights: &[&Tensor], values: &[f32]) -> Result<()> {
    let mut offset = 0;
    for p in &bucket.pieces {
        let grad = weights[p.tensor].grad();
        let src = Tensor::from_slice(&values[offset..offset + p.len])
            .to_device(grad.device())
            .to_kind(grad.kind());
        grad.view([-1])
            .narrow(0, p.start as i64, p.len as i64)
            .copy_(&src);
        offset += p.len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes(s: &[(&str, &[i64])]) -> Vec<(String, Vec<i64>)> {
        s.iter().map(|(n, d)| (n.to_string(), d.to_vec())).collect()
    }

    #[test]
    fn layout_packs_in_order_and_splits_large_tensors_at_rows() {
        let t = shapes(&[("a", &[3, 2]), ("b", &[4]), ("c", &[5, 4]), ("d", &[2])]);
        let b = layout(&t, 10);
        let lens: Vec<usize> = b.iter().map(|b| b.len).collect();
        assert_eq!(lens, [10, 8, 8, 6]);
        // a (6) + b (4) fill the first bucket; c (20 floats, rows of 4) is split into 8 + 8 + 4,
        // the last run sharing a bucket with d.
        assert_eq!(b[1].slices[0].name, "c");
        assert_eq!((b[1].slices[0].tensor_offset, b[1].slices[0].len), (0, 8));
        let c_runs: Vec<(u32, u32)> = b
            .iter()
            .flat_map(|b| b.slices.iter())
            .filter(|s| s.name == "c")
            .map(|s| (s.tensor_offset, s.len))
            .collect();
        assert_eq!(c_runs, [(0, 8), (8, 8), (16, 4)]);
        assert!(b.iter().all(|b| b.len <= 10));
        for bucket in &b {
            let mut at = 0;
            for s in &bucket.slices {
                assert_eq!(s.bucket_offset, at);
                assert_eq!(
                    s.tensor_offset % s.shape[1..].iter().product::<u32>().max(1),
                    0
                );
                at += s.len;
            }
            assert_eq!(at as usize, bucket.len);
        }
        // A row wider than the cap stays whole.
        let wide = layout(&shapes(&[("w", &[2, 7])]), 5);
        assert_eq!(wide.iter().map(|b| b.len).collect::<Vec<_>>(), [7, 7]);
    }

    #[test]
    fn gradients_round_trip_through_buckets() {
        let a = Tensor::zeros([3, 2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let b = Tensor::zeros([4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let x = Tensor::from_slice(&[1.0f32, 2., 3., 4., 5., 6.]).view([3, 2]);
        ((&a * &x).sum(Kind::Float) + (&b * 7.0).sum(Kind::Float)).backward();
        let buckets = layout(&shapes(&[("a", &[3, 2]), ("b", &[4])]), 4);
        let weights = [&a, &b];
        let mut all = Vec::new();
        for bucket in &buckets {
            let v = gather_grads(bucket, &weights).unwrap();
            all.extend(v.iter().copied());
            let doubled: Vec<f32> = v.iter().map(|x| x * 2.0).collect();
            scatter_grads(bucket, &weights, &doubled).unwrap();
        }
        assert_eq!(all, [1., 2., 3., 4., 5., 6., 7., 7., 7., 7.]);
        assert_eq!(
            Vec::<f32>::try_from(a.grad().reshape([-1])).unwrap(),
            [2., 4., 6., 8., 10., 12.]
        );
        assert_eq!(Vec::<f32>::try_from(b.grad()).unwrap(), [14.; 4]);
    }
}
