//! Which samples each step trains on. The training set is read as an endless stream of epochs,
//! each a fresh permutation derived from `(seed, epoch)` alone; step `t` takes the next
//! `global_batch` positions of the stream (a batch may straddle two epochs, which keeps every
//! step's batch at the size the policies decided). Because the order is a pure function of
//! the seed and the stream position, a checkpoint needs only `samples_seen` to resume it, and
//! every worker computes the same global batch without communicating.

/// SplitMix64 (Steele, Lea and Flood 2014): a tiny, well-mixed generator whose whole state is
/// one `u64`, so the order needs no RNG state in checkpoints.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` by multiply-shift; the bias is below bound / 2⁶⁴, far below
    /// anything a training run could detect.
    fn below(&mut self, bound: usize) -> usize {
        ((u128::from(self.next()) * bound as u128) >> 64) as usize
    }
}

/// The sample order of a training set of `len` samples.
#[derive(Debug, Clone)]
pub struct SampleOrder {
    seed: u64,
    len: usize,
    cached: Option<(u64, Vec<u32>)>,
}

impl SampleOrder {
    /// The order for `len` samples under `seed`.
    pub fn new(seed: u64, len: usize) -> Self {
        assert!(
            len > 0 && len <= u32::MAX as usize,
            "training set size {len}"
        );
        SampleOrder {
            seed,
            len,
            cached: None,
        }
    }

    /// Epoch `epoch`'s permutation of `0..len` (Fisher–Yates).
    pub fn permutation(&self, epoch: u64) -> Vec<u32> {
        let mut rng = SplitMix64(self.seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
        let mut p: Vec<u32> = (0..self.len as u32).collect();
        for i in (1..self.len).rev() {
            p.swap(i, rng.below(i + 1));
        }
        p
    }

    /// The sample indices at stream positions `start .. start + count`.
    pub fn take(&mut self, start: u64, count: usize) -> Vec<i64> {
        let len = self.len as u64;
        let mut out = Vec::with_capacity(count);
        let mut pos = start;
        while out.len() < count {
            let epoch = pos / len;
            if self.cached.as_ref().is_none_or(|(e, _)| *e != epoch) {
                self.cached = Some((epoch, self.permutation(epoch)));
            }
            let perm = &self.cached.as_ref().expect("just cached").1;
            let from = (pos % len) as usize;
            let n = (count - out.len()).min(self.len - from);
            out.extend(perm[from..from + n].iter().map(|&i| i64::from(i)));
            pos += n as u64;
        }
        out
    }
}

/// Splits a worker's batch into the fewest micro-batches of at most `max_micro` samples, as
/// even as possible (sizes differ by at most one), for gradient accumulation.
pub fn micro_batches(worker_batch: usize, max_micro: usize) -> Vec<usize> {
    let count = worker_batch.div_ceil(max_micro.max(1)).max(1);
    let (base, extra) = (worker_batch / count, worker_batch % count);
    (0..count).map(|i| base + usize::from(i < extra)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_epoch_is_a_permutation_and_epochs_differ() {
        let order = SampleOrder::new(7, 1000);
        let (a, b) = (order.permutation(0), order.permutation(1));
        for p in [&a, &b] {
            let mut s = p.clone();
            s.sort_unstable();
            assert_eq!(s, (0..1000).collect::<Vec<u32>>());
        }
        assert_ne!(a, b);
        assert_ne!(a, SampleOrder::new(8, 1000).permutation(0));
        assert_eq!(a, SampleOrder::new(7, 1000).permutation(0));
    }

    #[test]
    fn batches_straddle_epochs_in_stream_order() {
        let mut order = SampleOrder::new(3, 10);
        let (e0, e1) = (order.permutation(0), order.permutation(1));
        let got = order.take(8, 5);
        let want: Vec<i64> = e0[8..]
            .iter()
            .chain(&e1[..3])
            .map(|&i| i64::from(i))
            .collect();
        assert_eq!(got, want);
        // Taking the stream in other chunk sizes gives the same sequence.
        let whole = SampleOrder::new(3, 10).take(0, 25);
        let mut parts = Vec::new();
        let mut o = SampleOrder::new(3, 10);
        for (s, c) in [(0, 7), (7, 11), (18, 7)] {
            parts.extend(o.take(s, c));
        }
        assert_eq!(whole, parts);
    }

    #[test]
    fn micro_batches_are_even_and_capped() {
        assert_eq!(micro_batches(256, 256), vec![256]);
        assert_eq!(micro_batches(256, 100), vec![86, 85, 85]);
        assert_eq!(micro_batches(10, 1), vec![1; 10]);
        assert_eq!(micro_batches(7, 1000), vec![7]);
        assert_eq!(micro_batches(1024, 256).iter().sum::<usize>(), 1024);
    }
}
