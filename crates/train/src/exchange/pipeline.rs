//! The plain all-reduce's buckets in a pipeline: a helper thread waits for each bucket's
//! gradients and copies them into a buffer, and copies each summed buffer back out, while this
//! thread (the one that makes the MPI calls) all-reduces the bucket in between.
//!
//! Done one after the other on one thread, the copies left the link idle: on the lab's 105 MB
//! MLP, the 67 MB bucket was copied in after the 25 MB one had been sent and copied out, and
//! copied out before the next could start. Two buffers take turns; the copies and the sums are
//! those of the sequential loop, so the bits do not change.

use std::sync::mpsc;

use lsgd_collective::{Algorithm, Computing, Traffic, World};
use tch::Tensor;

use super::buckets::Bucket;
use crate::{Error, Result};

/// Sums every bucket of `weights`' gradients over the ranks of `world`, in order, each once
/// `ready` has returned for it (on the helper thread), with `buffers` (two, kept from step to
/// step) taking turns. Returns the traffic.
pub(super) fn all_reduce(
    world: &mut World,
    algo: Algorithm,
    buckets: &[Bucket],
    weights: &[&Tensor],
    buffers: &mut Vec<Vec<f32>>,
    ready: &mut (dyn FnMut(&Bucket) + Send),
) -> Result<Traffic> {
    buffers.resize_with(2, Vec::new);
    let free: Vec<Vec<f32>> = std::mem::take(buffers);
    // The helper's own handles on the tensors (a `Tensor` may move between threads, a
    // reference to one may not).
    let owned: Vec<Tensor> = weights.iter().map(|w| w.shallow_clone()).collect();
    let (gathered_tx, gathered) = mpsc::sync_channel::<(usize, Vec<f32>)>(1);
    let (summed_tx, summed) = mpsc::channel::<(usize, Vec<f32>)>();
    std::thread::scope(|s| {
        let helper = s.spawn(move || copies(buckets, owned, free, ready, gathered_tx, summed));
        let mut traffic = Traffic::default();
        let mut failed = None;
        for (i, mut data) in gathered.iter() {
            match world.all_reduce_sum(algo, &mut data) {
                Ok(t) => traffic += t,
                Err(e) => {
                    failed = Some(Error::from(e));
                    break;
                }
            }
            if summed_tx.send((i, data)).is_err() {
                break;
            }
        }
        // The helper copies out what was summed, then ends: its senders see us gone.
        drop(summed_tx);
        drop(gathered);
        let (kept, copied) = helper
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        *buffers = kept;
        match (failed, copied) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(traffic),
        }
    })
}

/// The helper's side: for each bucket in order, its gradients waited for and copied into a
/// free buffer, which goes to the all-reduce; each summed buffer copied back out (as soon as
/// one is back, and all of them at the end) and reused. Returns the buffers.
fn copies(
    buckets: &[Bucket],
    owned: Vec<Tensor>,
    mut free: Vec<Vec<f32>>,
    ready: &mut (dyn FnMut(&Bucket) + Send),
    gathered: mpsc::SyncSender<(usize, Vec<f32>)>,
    summed: mpsc::Receiver<(usize, Vec<f32>)>,
) -> (Vec<Vec<f32>>, Result<()>) {
    let _no_grad = tch::no_grad_guard();
    let weights: Vec<&Tensor> = owned.iter().collect();
    // While it copies, the all-reduce's waits leave it the core.
    let scatter = |(j, data): (usize, Vec<f32>)| {
        let _copying = Computing::begin();
        buckets[j].scatter(&weights, &data);
        data
    };
    let mut result = Ok(());
    for (i, bucket) in buckets.iter().enumerate() {
        free.extend(summed.try_iter().map(scatter));
        ready(bucket);
        let Some(mut data) = free.pop().or_else(|| summed.recv().ok().map(scatter)) else {
            break;
        };
        let copied = {
            let _copying = Computing::begin();
            bucket.gather_into(&weights, &mut data)
        };
        if let Err(e) = copied {
            free.push(data);
            result = Err(e);
            break;
        }
        if let Err(mpsc::SendError((_, data))) = gathered.send((i, data)) {
            free.push(data);
            break;
        }
    }
    drop(gathered);
    free.extend(summed.iter().map(scatter));
    (free, result)
}
