//! Data parallelism inside a step: which part of the global batch this rank trains on, and
//! the hashes of the cross-rank consistency check.
//!
//! Every rank computes the same global batch from the shared sample order and takes its
//! contiguous `1/k` shard. Its loss is scaled by `micro/global` rather than `micro/worker`, so
//! its gradients arrive pre-divided by k (Goyal et al. §3: sum with pre-division), and the
//! collective's plain sum ([`crate::exchange`]) is the mean over the global batch.

use lsgd_collective::World;
use lsgd_runtime::policy::Decision;
use tch::{Device, Kind, Tensor};

use crate::{Error, Result};

/// Rank `rank`'s shard of a global batch's sample indices (`len` divisible by `size`).
pub fn shard(indices: &[i64], rank: usize, size: usize) -> &[i64] {
    let per = indices.len() / size;
    &indices[rank * per..(rank + 1) * per]
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

/// A 64-bit digest of one step's policy outputs: LR, momentum, batch, ε, the layer-rate
/// multipliers and a sync policy's plan with the window it saw.
pub fn decision_digest(d: &Decision, scales: &[f64]) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&d.lr.to_le_bytes());
    if let Some(m) = d.momentum {
        h.update(&m.to_le_bytes());
    }
    h.update(&d.global_batch.to_le_bytes());
    h.update(&d.label_smoothing.to_le_bytes());
    for s in scales {
        h.update(&s.to_le_bytes());
    }
    if let Some(plan) = d.plan {
        h.update(plan.name().as_bytes());
        h.update(&d.window.local_steps.to_le_bytes());
        h.update(&d.window.windows.to_le_bytes());
    }
    digest64(&h)
}

/// A 64-bit digest of a sync policy's outer step (its coefficients) and of the outer momentum
/// buffers it left.
pub fn outer_digest<'a>(
    step: Option<&lsgd_policy::OuterStep>,
    momentum: impl Iterator<Item = &'a Tensor>,
) -> u64 {
    let mut h = tensors_hash(momentum.map(|t| ("momentum", t)));
    if let Some(o) = step {
        h.update(&o.lr.to_le_bytes());
        h.update(&o.momentum.to_le_bytes());
        h.update(&[u8::from(o.nesterov)]);
        for s in &o.lr_scale {
            h.update(&s.to_le_bytes());
        }
    }
    digest64(&h)
}

/// A 64-bit digest of byte strings (stateful plugins' snapshots), each length-prefixed so that
/// different splits of the same bytes differ.
pub fn bytes_digest<'a>(parts: impl Iterator<Item = &'a [u8]>) -> u64 {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
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
        Err(Error::Inconsistent {
            step,
            what: what.to_string(),
            ranks: odd,
            root: all[0],
        })
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
}
