//! The gradient's way between backward and update: one bucket layout ([`buckets`]) for every
//! run, and either the plain all-reduce of each bucket in binary32 (with more than one rank;
//! `pipeline.rs`) or the exchange through a codec plugin ([`codec`]), which also runs on one
//! process so that compression is visible without mpirun. Gradients arrive pre-divided by the number of ranks
//! (the loss is scaled by micro/global), so the collective's sum is the mean over the global
//! batch (Goyal et al. §3).
//!
//! Before anything moves, each rank may act on its own gradient ([`Local`]): clip it
//! (`--local-clip-norm`, DGC's local gradient clipping) and, with `--error-feedback momentum`,
//! add its weight decay, since the velocity that the exchange then accumulates
//! ([`feedback`]) replaces the optimizer's momentum.
//!
//! The buckets are laid out in the order the gradients become ready (recorded once, the same
//! on every rank, [`crate::overlap::order`]) and exchanged in that order, in either step: after
//! the backward pass ([`GradientExchange::exchange`]) or behind it, each bucket once its
//! gradients are ready ([`GradientExchange::exchange_ready`]). Both run the same operations on
//! the same buckets, so they end with the same bits.

pub mod buckets;
pub mod carry;
pub mod codec;
pub mod feedback;
mod pipeline;

use lsgd_collective::{Algorithm, Traffic, World};
use lsgd_runtime::plugin::Plugin;
use tch::{Kind, Tensor};

use crate::{Error, Result};
use buckets::{Bucket, Caps};
use codec::{Compressor, MAX_BUCKET_FLOATS};
pub use feedback::ErrorFeedback;

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

/// What each rank does to its own gradient around the exchange: error feedback and the
/// clipping before it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Local {
    /// `--error-feedback`.
    pub error_feedback: ErrorFeedback,
    /// SGD's m, which `--error-feedback momentum` applies to the velocity.
    pub momentum: f64,
    /// Each tensor's weight decay λ (optimizer order), added to the gradient before the
    /// velocity with `--error-feedback momentum`.
    pub weight_decays: Vec<f64>,
    /// `--local-clip-norm` C: each rank's gradient is clipped to a total L2 norm of C/√k.
    pub clip_norm: Option<f64>,
    /// The model may leave a parameter without a gradient (a TorchScript module whose forward
    /// pass skips a head): the ranks agree on which ones any of them used, as DDP's
    /// `find_unused_parameters` does (one small all-reduce per step).
    pub find_unused: bool,
}

/// The gradient exchange of a run: its bucket layout, the all-reduce algorithm, what each
/// rank does to its own gradient and, with a codec, the codec's state.
pub struct GradientExchange {
    buckets: Vec<Bucket>,
    /// The tensors' names and shapes, the order and the caps the buckets were laid out by.
    shapes: Vec<(String, Vec<i64>)>,
    order: Vec<usize>,
    caps: Caps,
    algo: Algorithm,
    local: Local,
    compressor: Option<Compressor>,
    params: u64,
    /// The plain all-reduce's two buffers, reused by every bucket of every step.
    scratch: Vec<Vec<f32>>,
}

/// The first bucket's cap in floats: DDP's `first_bucket_bytes` (1 MiB), so that the first
/// exchange starts early in the backward pass.
pub const FIRST_BUCKET_FLOATS: usize = 1 << 18;

impl GradientExchange {
    /// Lays out `weights` (name and shape, optimizer order), visited in `order` (the order
    /// their gradients become ready), in buckets of `bucket_floats` after a first one of
    /// [`FIRST_BUCKET_FLOATS`]: with a codec at most that (and [`MAX_BUCKET_FLOATS`], its
    /// calls crossing the sandbox boundary), tensors split at rows to fill them; without one
    /// whole tensors until a bucket holds that much, as DDP ([`buckets::layout_whole`]).
    pub fn new(
        weights: &[(String, Vec<i64>)],
        order: &[usize],
        bucket_floats: usize,
        algo: Algorithm,
        codec: Option<&mut Plugin>,
        local: Local,
        seed: u64,
    ) -> Result<Self> {
        let params = weights
            .iter()
            .map(|(_, s)| s.iter().product::<i64>() as u64)
            .sum();
        let rest = match codec {
            Some(_) => bucket_floats.clamp(1, MAX_BUCKET_FLOATS),
            None => bucket_floats.max(1),
        };
        let caps = Caps {
            first: rest.min(FIRST_BUCKET_FLOATS),
            rest,
        };
        // A codec's caps bound its buckets; the plain all-reduce's are DDP's thresholds.
        let lay = match codec {
            Some(_) => buckets::layout_in,
            None => buckets::layout_whole,
        };
        let buckets = lay(weights, order, caps).map_err(|e| {
            Error::Exchange(format!("the gradients' readiness order is not usable: {e}"))
        })?;
        let Some(codec) = codec else {
            if local.error_feedback != ErrorFeedback::Off {
                return Err(Error::Config(
                    "--error-feedback keeps a codec's compression error: it needs --codec".into(),
                ));
            }
            return Ok(GradientExchange {
                buckets,
                shapes: weights.to_vec(),
                order: order.to_vec(),
                caps,
                algo,
                local,
                compressor: None,
                params,
                scratch: Vec::new(),
            });
        };
        let compressor =
            Compressor::new(codec, &buckets, local.error_feedback, local.momentum, seed)?;
        Ok(GradientExchange {
            buckets,
            shapes: weights.to_vec(),
            order: order.to_vec(),
            caps,
            algo,
            local,
            compressor: Some(compressor),
            params,
            scratch: Vec::new(),
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

    /// The buckets, in the order they are exchanged.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// The order of the tensors the buckets were laid out in (their gradients' readiness
    /// order), for a checkpoint.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Replaces every gradient of `weights` by its sum over the ranks (through the codec, if
    /// any), after this rank's own clipping and, with `--error-feedback momentum`, weight
    /// decay; a single process without a codec or clipping has nothing to do. A parameter
    /// that no rank's backward pass reached keeps no gradient, on every rank, so the optimizer
    /// skips it as it does on one process; one that some rank's reached gets the sum on all
    /// (what DDP does, its other ranks adding zeros).
    pub fn exchange(
        &mut self,
        world: &mut World,
        codec: Option<&mut Plugin>,
        weights: &[&Tensor],
        step: u64,
    ) -> Result<Exchanged> {
        let reached: Vec<bool> = weights.iter().map(|w| w.grad().defined()).collect();
        let found = self.zero_unreached(world, weights, &reached)?;
        if let Some(c) = self.local.clip_norm {
            let _guard = tch::no_grad_guard();
            let grads: Vec<Tensor> = weights.iter().map(|w| w.grad()).collect();
            clip(&grads, c / (world.size() as f64).sqrt());
        }
        let mut exchanged = self.exchange_ready(world, codec, weights, step, &mut |_| {})?;
        exchanged.traffic += found;
        Ok(exchanged)
    }

    /// Gives a zero gradient, before the exchange, to the tensors of `weights` this rank's
    /// backward pass does not reach (`reached`) that need one: with `find_unused`, those
    /// another rank's reached (one small all-reduce), so that a parameter no rank used keeps no
    /// gradient; without it, every one not reached, so that every rank has a gradient for the
    /// same parameters.
    pub fn zero_unreached(
        &self,
        world: &mut World,
        weights: &[&Tensor],
        reached: &[bool],
    ) -> Result<Traffic> {
        let mut used: Vec<f32> = reached.iter().map(|&r| f32::from(u8::from(r))).collect();
        let mut traffic = Traffic::default();
        if self.local.find_unused && world.size() > 1 {
            traffic = world.all_reduce_sum(Algorithm::Mpi, &mut used)?;
        } else if !self.local.find_unused {
            used.fill(1.0);
        }
        let missing: Vec<&Tensor> = (0..reached.len())
            .filter(|&i| used[i] > 0.0 && !reached[i])
            .map(|i| weights[i])
            .collect();
        zero_grads(&missing);
        Ok(traffic)
    }

    /// The exchange of every bucket, in order, each once `ready` has returned for it: the
    /// overlapped step waits there for the bucket's gradients. The caller has already called
    /// [`GradientExchange::zero_unreached`], and there is no `--local-clip-norm`
    /// (`TrainConfig::overlap_refused`).
    pub fn exchange_ready(
        &mut self,
        world: &mut World,
        codec: Option<&mut Plugin>,
        weights: &[&Tensor],
        step: u64,
        ready: &mut (dyn FnMut(&Bucket) + Send),
    ) -> Result<Exchanged> {
        let plain = |traffic| Exchanged {
            traffic,
            payload_bytes: 4 * self.params,
            floats: self.params,
        };
        let (compressor, codec) = match (&mut self.compressor, codec) {
            (Some(c), Some(codec)) => (c, codec),
            // No codec, so no error feedback (`new` refuses it) and nothing to do to a
            // bucket's tensors once ready.
            _ if world.size() > 1 => {
                let traffic = pipeline::all_reduce(
                    world,
                    self.algo,
                    &self.buckets,
                    weights,
                    &mut self.scratch,
                    ready,
                )?;
                return Ok(plain(traffic));
            }
            _ => {
                // Nothing moves, but the caller's wait still sees every bucket.
                self.buckets.iter().for_each(ready);
                return Ok(plain(Traffic::default()));
            }
        };
        let mut decayed = vec![false; weights.len()];
        let local = &self.local;
        // A bucket's tensors once ready: with `--error-feedback momentum` each gets its weight
        // decay once (a tensor split over buckets too), before its first bucket is gathered.
        let mut ready = |bucket: &Bucket| {
            ready(bucket);
            if local.error_feedback.moves_momentum() {
                let _guard = tch::no_grad_guard();
                for t in bucket.tensors() {
                    if !std::mem::replace(&mut decayed[t], true) {
                        add_decay(weights[t], local.weight_decays[t]);
                    }
                }
            }
        };
        compressor.exchange(
            world,
            self.algo,
            codec,
            &self.buckets,
            weights,
            step,
            &mut ready,
        )
    }

    /// Every rank's codec state (error-feedback residuals, a stateful codec's state) as named
    /// tensors for a checkpoint; a collective that every rank calls.
    pub fn checkpoint_tensors(&self, world: &World) -> Result<Vec<(String, Tensor)>> {
        match &self.compressor {
            Some(c) => c.checkpoint_tensors(world),
            None => Ok(Vec::new()),
        }
    }

    /// A stateful codec's per-bucket state (the same on every rank), for the consistency
    /// check; `None` without one.
    pub fn codec_state(&self) -> Option<&[Vec<u8>]> {
        let carried = self.compressor.as_ref()?.carried()?;
        Some(carried.buckets())
    }

    /// Undoes the last exchange's update of the codec state, for a step that stops after its
    /// exchange and before its update (a layer-rate fault): the checkpoint then holds the
    /// state before that step.
    pub fn rollback(&mut self) {
        if let Some(c) = &mut self.compressor {
            c.rollback();
        }
    }

    /// Restores this rank's codec state from a checkpoint's tensors, written with the buckets
    /// laid out in `saved_order` (`None`: a checkpoint from before the readiness order, whose
    /// buckets followed the optimizer's order at one cap). Error-feedback state saved for
    /// another layout is moved to this run's buckets element for element; a stateful codec's
    /// own state cannot be, and is refused.
    pub fn restore(
        &mut self,
        tensors: &[(String, Tensor)],
        rank: usize,
        size: usize,
        saved_order: Option<&[usize]>,
    ) -> Result<()> {
        let Some(c) = &mut self.compressor else {
            return Ok(());
        };
        let identity: Vec<usize> = (0..self.shapes.len()).collect();
        let (order, caps) = match saved_order {
            Some(order) => (order, self.caps),
            None => (
                &identity[..],
                Caps {
                    first: self.caps.rest,
                    rest: self.caps.rest,
                },
            ),
        };
        let saved = buckets::layout_in(&self.shapes, order, caps).map_err(|e| {
            Error::Checkpoint(format!(
                "the checkpoint's bucket order is not this model's: {e}"
            ))
        })?;
        if saved == self.buckets {
            return c.restore(tensors, rank, size);
        }
        if tensors
            .iter()
            .any(|(n, _)| n.starts_with(carry::STATE_PREFIX))
        {
            return Err(Error::Checkpoint(format!(
                "the codec's own state was saved for {} bucket(s) laid out otherwise than this \
                 run's {}, and a codec's state cannot be moved between buckets",
                saved.len(),
                self.buckets.len()
            )));
        }
        let sizes: Vec<usize> = self
            .shapes
            .iter()
            .map(|(_, s)| s.iter().product::<i64>() as usize)
            .collect();
        let mut moved: Vec<(String, Tensor)> = tensors
            .iter()
            .filter(|(n, _)| !n.starts_with(codec::RESIDUAL_PREFIX))
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        for (prefix, what) in [
            (codec::RESIDUAL_PREFIX, "error-feedback residual"),
            (codec::VELOCITY_PREFIX, "momentum-correction velocity"),
        ] {
            for r in 0.. {
                let key = |b: usize| format!("{prefix}rank{r}.bucket{b}");
                if !tensors.iter().any(|(n, _)| *n == key(0)) {
                    break;
                }
                let values = saved
                    .iter()
                    .enumerate()
                    .map(|(b, bucket)| codec::saved_bucket(tensors, &key(b), what, bucket.len))
                    .collect::<Result<Vec<_>>>()?;
                let relaid = buckets::relayout(&saved, &self.buckets, &values, &sizes);
                for (b, v) in relaid.into_iter().enumerate() {
                    moved.push((key(b), Tensor::from_slice(&v)));
                }
            }
        }
        c.restore(&moved, rank, size)
    }
}

/// `--error-feedback momentum`: the tensor's weight decay λw added to its gradient, in place.
fn add_decay(w: &Tensor, decay: f64) {
    let g = w.grad();
    if decay != 0.0 && g.defined() {
        // The same binary32 product and sum as the optimizer's `d = g + λw`.
        let _ = g.shallow_clone().g_add_(&(w * decay));
    }
}

/// Gives each of `weights` (leaves that require grad) a zero gradient, as a backward pass
/// through `0 · Σw` does: autograd's own tensor, where a later backward pass accumulates.
pub(crate) fn zero_grads(weights: &[&Tensor]) {
    if weights.is_empty() {
        return;
    }
    tch::with_grad(|| {
        let zero = weights.iter().map(|w| w.sum(Kind::Float) * 0.0).fold(
            Tensor::zeros([], (Kind::Float, weights[0].device())),
            |a, b| a + b,
        );
        zero.backward();
    });
}

/// Scales `grads` (in place) so that their total L2 norm is at most `max`, as
/// `torch.nn.utils.clip_grad_norm_` does: by max / (norm + 1e-6) when that is below 1; returns
/// the norm before clipping. The norm is reduced in binary64 in tensor order, so it is the same
/// on every run.
pub fn clip(grads: &[Tensor], max: f64) -> f64 {
    let norm = grads
        .iter()
        .filter(|g| g.defined())
        .map(|g| {
            g.to_kind(Kind::Double)
                .square()
                .sum(Kind::Double)
                .double_value(&[])
        })
        .sum::<f64>()
        .sqrt();
    let coefficient = max / (norm + 1e-6);
    if coefficient < 1.0 {
        for g in grads.iter().filter(|g| g.defined()) {
            let _ = g.shallow_clone().g_mul_scalar_(coefficient);
        }
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_process_without_a_codec_leaves_gradients_unchanged() {
        let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).set_requires_grad(true);
        (&w * 2.0).sum(Kind::Float).backward();
        let shapes = [("w".to_string(), vec![3])];
        let mut x =
            GradientExchange::new(&shapes, &[0], 2, Algorithm::Ring, None, Local::default(), 0)
                .unwrap();
        // One bucket: the plain exchange never splits a tensor, whatever the cap.
        assert_eq!(x.len(), 1);
        let e = x.exchange(&mut World::single(), None, &[&w], 0).unwrap();
        assert_eq!(e.traffic.bytes_sent, 0);
        assert_eq!((e.floats, e.compression_ratio()), (3, 1.0));
        assert_eq!(Vec::<f32>::try_from(&w.grad()).unwrap(), [2.0, 2.0, 2.0]);
    }

    #[test]
    fn error_feedback_without_a_codec_is_refused() {
        let shapes = [("w".to_string(), vec![3])];
        for mode in [ErrorFeedback::Residual, ErrorFeedback::Momentum] {
            let local = Local {
                error_feedback: mode,
                ..Local::default()
            };
            let e = GradientExchange::new(&shapes, &[0], 8, Algorithm::Mpi, None, local, 0)
                .err()
                .unwrap();
            assert!(e.to_string().contains("it needs --codec"), "{e}");
        }
    }

    #[test]
    fn local_clipping_scales_the_whole_gradient_to_c_over_root_k() {
        let a = Tensor::from_slice(&[3.0f32]).set_requires_grad(true);
        let b = Tensor::from_slice(&[0.0f32, 0.0]).set_requires_grad(true);
        (&a + (&b * Tensor::from_slice(&[4.0f32, 0.0])).sum(Kind::Float))
            .sum(Kind::Float)
            .backward();
        // g = (1, 4, 0), ‖g‖ = √17: clipped to 1 on one rank.
        let local = Local {
            clip_norm: Some(1.0),
            ..Local::default()
        };
        let shapes = [("a".to_string(), vec![1]), ("b".to_string(), vec![2])];
        let mut x =
            GradientExchange::new(&shapes, &[0, 1], 8, Algorithm::Mpi, None, local, 0).unwrap();
        x.exchange(&mut World::single(), None, &[&a, &b], 0)
            .unwrap();
        let got: Vec<f32> = [a.grad(), b.grad()]
            .iter()
            .flat_map(|g| Vec::<f32>::try_from(g).unwrap())
            .collect();
        let s = 1.0 / (17f64.sqrt() + 1e-6);
        assert_eq!(got, [s as f32, (4.0 * s) as f32, 0.0]);
        // Within the bound (C/√k = 2/√2 for two ranks) nothing changes, bit for bit.
        let g = [Tensor::from_slice(&[0.3f32, 0.4])];
        assert!((clip(&g, 2.0 / 2f64.sqrt()) - 0.5).abs() < 1e-7);
        assert_eq!(Vec::<f32>::try_from(&g[0]).unwrap(), [0.3, 0.4]);
    }

    #[test]
    fn a_parameter_no_backward_reached_keeps_no_gradient_unless_the_model_cannot_say() {
        for find_unused in [true, false] {
            let used = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
            let head = Tensor::from_slice(&[3.0f32]).set_requires_grad(true);
            (&used * 2.0).sum(Kind::Float).backward();
            let shapes = [("used".to_string(), vec![2]), ("head".to_string(), vec![1])];
            let local = Local {
                find_unused,
                ..Local::default()
            };
            let mut x =
                GradientExchange::new(&shapes, &[0, 1], 8, Algorithm::Mpi, None, local, 0).unwrap();
            x.exchange(&mut World::single(), None, &[&used, &head], 0)
                .unwrap();
            assert_eq!(Vec::<f32>::try_from(used.grad()).unwrap(), [2.0, 2.0]);
            // With `find_unused` the ranks (here one) agree nobody used it: no gradient, and
            // the optimizer skips it; without, every rank gives it zeros alike.
            let head = head.grad();
            assert_eq!(head.defined(), !find_unused, "find_unused {find_unused}");
            if !find_unused {
                assert_eq!(Vec::<f32>::try_from(head).unwrap(), [0.0]);
            }
        }
    }
}
