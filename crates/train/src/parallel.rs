//! Data parallelism inside a step: which part of the global batch this rank trains on, the
//! gradient buckets that cross the collective, and the hashes of the cross-rank consistency
//! check.
//!
//! Every rank computes the same global batch from the shared sample order and takes its
//! contiguous `1/k` shard. Its loss is scaled by `micro/global` rather than `micro/worker`, so
//! its gradients arrive pre-divided by k (Goyal et al. §3: sum with pre-division), and the
//! collective's plain sum is the mean over the global batch. Gradients are fused into buckets
//! of about `--bucket-mb` (Horovod's tensor fusion, DDP's buckets) so a model of many small
//! tensors costs a few large messages, not one per tensor.

use anyhow::Result;
use tch::{Device, Kind, Tensor};

use crate::collective::{Algorithm, Traffic, World};

/// Rank `rank`'s shard of a global batch's sample indices (`len` divisible by `size`).
pub fn shard(indices: &[i64], rank: usize, size: usize) -> &[i64] {
    let per = indices.len() / size;
    &indices[rank * per..(rank + 1) * per]
}

/// Groups of trainable tensors whose gradients are reduced together.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    /// Tensor indices of each bucket, in the optimiser's (name) order.
    groups: Vec<Vec<usize>>,
}

impl Buckets {
    /// Packs tensors of `numels` elements greedily, in order, into buckets of at most
    /// `bucket_bytes` (a larger tensor gets a bucket of its own).
    pub fn new(numels: &[usize], bucket_bytes: usize) -> Self {
        let cap = (bucket_bytes / 4).max(1);
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut fill = 0;
        for (i, &n) in numels.iter().enumerate() {
            match groups.last_mut() {
                Some(g) if fill + n <= cap => {
                    g.push(i);
                    fill += n;
                }
                _ => {
                    groups.push(vec![i]);
                    fill = n;
                }
            }
        }
        Buckets { groups }
    }

    /// Number of buckets.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// True when there is nothing to reduce.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Sums the gradients of `weights` across ranks in place, bucket by bucket, with `algo`.
    pub fn all_reduce(
        &self,
        world: &mut World,
        algo: Algorithm,
        weights: &[&Tensor],
    ) -> Result<Traffic> {
        let mut total = Traffic {
            bytes_sent: 0,
            seconds: 0.0,
        };
        let _guard = tch::no_grad_guard();
        for group in &self.groups {
            let grads: Vec<Tensor> = group.iter().map(|&i| weights[i].grad()).collect();
            let flat = Tensor::cat(
                &grads
                    .iter()
                    .map(|g| g.to_device(Device::Cpu).to_kind(Kind::Float).flatten(0, -1))
                    .collect::<Vec<_>>(),
                0,
            );
            let mut buf = Vec::<f32>::try_from(&flat)?;
            let t = world.all_reduce_sum(algo, &mut buf)?;
            total.bytes_sent += t.bytes_sent;
            total.seconds += t.seconds;
            let mut offset = 0;
            for g in &grads {
                let n = g.numel();
                let reduced = Tensor::from_slice(&buf[offset..offset + n])
                    .view(g.size().as_slice())
                    .to_device(g.device())
                    .to_kind(g.kind());
                g.shallow_clone().copy_(&reduced);
                offset += n;
            }
        }
        Ok(total)
    }
}

/// blake3 over each tensor's name and f32 bytes, in the given order: equal iff the tensors
/// are bit-identical (for the consistency check and the run summary).
pub fn tensors_hash<'a>(named: impl Iterator<Item = (&'a str, &'a Tensor)>) -> blake3::Hasher {
    let mut h = blake3::Hasher::new();
    for (name, t) in named {
        let v = Vec::<f32>::try_from(t.to_device(Device::Cpu).to_kind(Kind::Float).flatten(0, -1))
            .expect("float tensor");
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        h.update(name.as_bytes());
        h.update(&bytes);
    }
    h
}

/// A 64-bit digest of named tensors, in the given order, for the consistency check.
pub fn tensors_digest<'a>(named: impl Iterator<Item = (&'a str, &'a Tensor)>) -> u64 {
    digest64(&tensors_hash(named))
}

/// A 64-bit digest of one step's policy outputs.
pub fn decision_digest(lr: f64, global_batch: u32, epsilon: f32) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&lr.to_le_bytes());
    h.update(&global_batch.to_le_bytes());
    h.update(&epsilon.to_le_bytes());
    digest64(&h)
}

fn digest64(h: &blake3::Hasher) -> u64 {
    let bytes = h.finalize();
    u64::from_le_bytes(bytes.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// Compares every rank's digest with rank 0's; the error names the step, what differed and
/// the ranks that disagree.
pub fn check_consistent(world: &World, step: u64, what: &str, digest: u64) -> Result<()> {
    let all = world.all_gather_u64(digest)?;
    let odd: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, d)| **d != all[0])
        .map(|(r, d)| format!("rank {r} ({d:016x})"))
        .collect();
    if odd.is_empty() {
        Ok(())
    } else {
        anyhow::bail!(
            "consistency check failed at step {step}: the {what} of {} differ from rank 0's ({:016x}); the ranks no longer train the same model",
            odd.join(", "),
            all[0]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_global_batch() {
        let idx: Vec<i64> = (0..12).collect();
        let parts: Vec<i64> = (0..4).flat_map(|r| shard(&idx, r, 4).to_vec()).collect();
        assert_eq!(parts, idx);
        assert_eq!(shard(&idx, 1, 3), &[4, 5, 6, 7]);
    }

    #[test]
    fn buckets_pack_in_order_up_to_the_cap() {
        // 4-byte floats: a 40-byte cap holds 10 elements.
        let b = Buckets::new(&[4, 4, 4, 20, 1, 1], 40);
        assert_eq!(b.groups, vec![vec![0, 1], vec![2], vec![3], vec![4, 5]]);
        assert_eq!(Buckets::new(&[1, 2, 3], 1 << 20).len(), 1);
    }

    #[test]
    fn a_single_process_reduce_leaves_gradients_unchanged() {
        let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).set_requires_grad(true);
        (&w * 2.0).sum(Kind::Float).backward();
        let b = Buckets::new(&[3], 8);
        let t = b
            .all_reduce(&mut World::single(), Algorithm::Ring, &[&w])
            .unwrap();
        assert_eq!(t.bytes_sent, 0);
        assert_eq!(Vec::<f32>::try_from(&w.grad()).unwrap(), [2.0, 2.0, 2.0]);
    }
}
