//! The gradient's way between backward and update: one bucket layout ([`buckets`]) for every
//! run, and either the plain all-reduce of each bucket in binary32 (with more than one rank)
//! or the exchange through a codec plugin ([`codec`]), which also runs on one process so that
//! compression is visible without mpirun. Gradients arrive pre-divided by the number of ranks
//! (the loss is scaled by micro/global), so the collective's sum is the mean over the global
//! batch (Goyal et al. §3).

pub mod buckets;
pub mod codec;

use lsgd_collective::{Algorithm, Traffic, World};
use lsgd_runtime::plugin::Plugin;
use tch::Tensor;

use crate::Result;
use buckets::Bucket;
use codec::{Compressor, MAX_BUCKET_FLOATS};

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

/// The gradient exchange of a run: its bucket layout, the all-reduce algorithm and, with a
/// codec, the codec's state.
pub struct GradientExchange {
    buckets: Vec<Bucket>,
    algo: Algorithm,
    compressor: Option<Compressor>,
    params: u64,
}

impl GradientExchange {
    /// Lays out `weights` (name and shape, optimizer order) in buckets of `bucket_floats`
    /// (at most [`MAX_BUCKET_FLOATS`] with a codec, whose calls cross the sandbox boundary).
    pub fn new(
        weights: &[(String, Vec<i64>)],
        bucket_floats: usize,
        algo: Algorithm,
        codec: Option<&mut Plugin>,
        error_feedback: bool,
        seed: u64,
    ) -> Result<Self> {
        let params = weights
            .iter()
            .map(|(_, s)| s.iter().product::<i64>() as u64)
            .sum();
        let Some(codec) = codec else {
            if error_feedback {
                return Err(crate::Error::Config(
                    "--error-feedback keeps a codec's compression error: it needs --codec".into(),
                ));
            }
            let buckets = buckets::layout(weights, bucket_floats);
            return Ok(GradientExchange {
                buckets,
                algo,
                compressor: None,
                params,
            });
        };
        let buckets = buckets::layout(weights, bucket_floats.clamp(1, MAX_BUCKET_FLOATS));
        let compressor = Compressor::new(codec, &buckets, error_feedback, seed)?;
        Ok(GradientExchange {
            buckets,
            algo,
            compressor: Some(compressor),
            params,
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

    /// The codec's side, if the run has a codec.
    pub fn compressor(&self) -> Option<&Compressor> {
        self.compressor.as_ref()
    }

    /// Replaces every gradient of `weights` by its sum over the ranks (through the codec, if
    /// any); a single process without a codec has nothing to do.
    pub fn exchange(
        &mut self,
        world: &mut World,
        codec: Option<&mut Plugin>,
        weights: &[&Tensor],
        step: u64,
    ) -> Result<Exchanged> {
        let plain = |traffic| Exchanged {
            traffic,
            payload_bytes: 4 * self.params,
            floats: self.params,
        };
        match (&mut self.compressor, codec) {
            (Some(c), Some(codec)) => {
                c.exchange(world, self.algo, codec, &self.buckets, weights, step)
            }
            _ if world.size() > 1 => {
                let _guard = tch::no_grad_guard();
                let mut traffic = Traffic::default();
                for bucket in &self.buckets {
                    let mut data = bucket.gather(weights)?;
                    traffic += world.all_reduce_sum(self.algo, &mut data)?;
                    bucket.scatter(weights, &data);
                }
                Ok(plain(traffic))
            }
            _ => Ok(plain(Traffic::default())),
        }
    }

    /// Every rank's codec state (error-feedback residuals) as named tensors for a checkpoint;
    /// a collective that every rank calls.
    pub fn checkpoint_tensors(&self, world: &World) -> Result<Vec<(String, Tensor)>> {
        match &self.compressor {
            Some(c) => c.checkpoint_tensors(world),
            None => Ok(Vec::new()),
        }
    }

    /// Undoes the last exchange's update of the codec state, for a step that stops after its
    /// exchange and before its update (a layer-rate fault): the checkpoint then holds the
    /// state before that step.
    pub fn rollback(&mut self) {
        if let Some(c) = &mut self.compressor {
            c.rollback();
        }
    }

    /// Restores this rank's codec state from a checkpoint's tensors.
    pub fn restore(&mut self, tensors: &[(String, Tensor)], rank: usize) -> Result<()> {
        match &mut self.compressor {
            Some(c) => c.restore(tensors, rank),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    fn a_single_process_without_a_codec_leaves_gradients_unchanged() {
        let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).set_requires_grad(true);
        (&w * 2.0).sum(Kind::Float).backward();
        let shapes = [("w".to_string(), vec![3])];
        let mut x = GradientExchange::new(&shapes, 2, Algorithm::Ring, None, false, 0).unwrap();
        assert_eq!(x.len(), 2);
        let e = x.exchange(&mut World::single(), None, &[&w], 0).unwrap();
        assert_eq!(e.traffic.bytes_sent, 0);
        assert_eq!((e.floats, e.compression_ratio()), (3, 1.0));
        assert_eq!(Vec::<f32>::try_from(&w.grad()).unwrap(), [2.0, 2.0, 2.0]);
    }

    #[test]
    fn error_feedback_without_a_codec_is_refused() {
        let shapes = [("w".to_string(), vec![3])];
        let e = GradientExchange::new(&shapes, 8, Algorithm::Mpi, None, true, 0)
            .err()
            .unwrap();
        assert!(e.to_string().contains("it needs --codec"), "{e}");
    }
}
