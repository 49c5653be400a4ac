//! The bucket layout of a run's gradients: whole tensors in the optimizer's order, fused up to
//! a cap (Horovod's tensor fusion, DDP's buckets), a tensor larger than the cap split at row
//! boundaries so that a codec such as PowerSGD still sees matrices; the overlapped exchange
//! visits the tensors in the order their gradients become ready ([`layout_in`]). The plain
//! all-reduce and the codec exchange use the same layout.

use lsgd_codec::TensorSlice;
use tch::{Device, Kind, Tensor};

use crate::Result;

/// One contiguous run of a tensor's elements inside a bucket.
#[derive(Debug, Clone, PartialEq)]
struct Piece {
    /// Index of the tensor in the optimizer's order.
    tensor: usize,
    /// First element within the flattened tensor.
    start: usize,
    /// Elements.
    len: usize,
}

/// The tensors (or row ranges of tensors) that cross one collective call together.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Bucket {
    pieces: Vec<Piece>,
    /// What a codec is told about them.
    pub slices: Vec<TensorSlice>,
    /// Elements.
    pub len: usize,
}

impl Bucket {
    fn push(&mut self, tensor: usize, name: &str, shape: &[i64], start: usize, len: usize) {
        self.slices.push(TensorSlice {
            name: name.to_string(),
            shape: shape.iter().map(|d| *d as u32).collect(),
            tensor_offset: start as u32,
            bucket_offset: self.len as u32,
            len: len as u32,
        });
        self.pieces.push(Piece { tensor, start, len });
        self.len += len;
    }

    /// The tensors (indices in the optimizer's order) the bucket holds elements of.
    pub fn tensors(&self) -> impl Iterator<Item = usize> + '_ {
        self.pieces.iter().map(|p| p.tensor)
    }

    /// The bucket's gradient elements as one binary32 vector; a tensor without a gradient
    /// (no backward pass reached it) gives zeros, so that every rank sends the same length.
    pub fn gather(&self, weights: &[&Tensor]) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.gather_into(weights, &mut out)?;
        Ok(out)
    }

    /// [`Bucket::gather`] into `out`, which keeps its allocation from bucket to bucket and
    /// step to step: each element is copied once, and no fresh pages are faulted in per step
    /// (on a 100 MB gradient those two were a tenth of a second a step, much of it while an
    /// overlapped backward pass shared the core).
    pub fn gather_into(&self, weights: &[&Tensor], out: &mut Vec<f32>) -> Result<()> {
        out.resize(self.len, 0.0);
        let mut offset = 0;
        for p in &self.pieces {
            let dst = &mut out[offset..offset + p.len];
            offset += p.len;
            let grad = weights[p.tensor].grad();
            if !grad.defined() {
                dst.fill(0.0);
                continue;
            }
            grad.reshape([-1])
                .narrow(0, p.start as i64, p.len as i64)
                .to_device(Device::Cpu)
                .to_kind(Kind::Float)
                .contiguous()
                .f_copy_data(dst, p.len)?;
        }
        Ok(())
    }

    /// Writes `values` back into the bucket's gradient elements; a tensor without a gradient
    /// keeps none (the ranks agreed that none of them used it, see
    /// [`super::GradientExchange::exchange`]).
    pub fn scatter(&self, weights: &[&Tensor], values: &[f32]) {
        assert_eq!(values.len(), self.len, "a bucket's values");
        let mut offset = 0;
        for p in &self.pieces {
            let part = &values[offset..offset + p.len];
            offset += p.len;
            let grad = weights[p.tensor].grad();
            if !grad.defined() {
                continue;
            }
            // SAFETY: the tensor views `part` (binary32, `p.len` elements, contiguous) only
            // for the copy below, which has finished reading it when `copy_` returns (CPU, or
            // a copy to a GPU from unpinned memory, which is synchronous), and is dropped
            // before `part`'s borrow ends; nothing writes through it.
            let src = unsafe {
                Tensor::from_blob(
                    part.as_ptr().cast(),
                    &[p.len as i64],
                    &[1],
                    Kind::Float,
                    Device::Cpu,
                )
            };
            grad.view([-1])
                .narrow(0, p.start as i64, p.len as i64)
                .copy_(&src);
        }
    }
}

/// `values` (one vector per bucket of `from`) laid out in `to`'s buckets instead; both layouts
/// cover the same tensors, whose element counts are `sizes`.
pub fn relayout(
    from: &[Bucket],
    to: &[Bucket],
    values: &[Vec<f32>],
    sizes: &[usize],
) -> Vec<Vec<f32>> {
    let mut flat: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
    for (bucket, v) in from.iter().zip(values) {
        let mut offset = 0;
        for p in &bucket.pieces {
            flat[p.tensor][p.start..p.start + p.len].copy_from_slice(&v[offset..offset + p.len]);
            offset += p.len;
        }
    }
    to.iter()
        .map(|b| {
            b.pieces
                .iter()
                .flat_map(|p| flat[p.tensor][p.start..p.start + p.len].iter().copied())
                .collect()
        })
        .collect()
}

/// Cuts tensors of the given names and shapes into buckets of at most `cap` floats, in order:
/// a tensor that does not fit the current bucket starts a new one, and a tensor larger than
/// `cap` is split into runs of whole rows (a single row larger than `cap` stays whole).
pub fn layout(tensors: &[(String, Vec<i64>)], cap: usize) -> Vec<Bucket> {
    let order: Vec<usize> = (0..tensors.len()).collect();
    layout_in(
        tensors,
        &order,
        Caps {
            first: cap,
            rest: cap,
        },
    )
    .expect("the identity is a permutation")
}

/// The caps of a layout's buckets, in floats: DDP's small first bucket (its
/// `first_bucket_bytes`), so that the first exchange starts early in the backward pass, then
/// `rest` (its `bucket_cap_mb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// The first bucket's cap.
    pub first: usize,
    /// Every later bucket's cap.
    pub rest: usize,
}

/// [`layout`] with the tensors visited in `order` (indices into `tensors`, each exactly once):
/// the overlapped exchange lays its buckets out in the order the gradients become ready, so
/// that each bucket fills, and can move, while autograd computes the rest. A piece still names
/// its tensor by its index in `tensors` (the optimizer's order), so gather and scatter are
/// unchanged.
pub fn layout_in(
    tensors: &[(String, Vec<i64>)],
    order: &[usize],
    caps: Caps,
) -> std::result::Result<Vec<Bucket>, String> {
    check_order(tensors, order)?;
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut open = Bucket::default();
    for &i in order {
        let (name, shape) = &tensors[i];
        let numel: usize = shape.iter().map(|d| *d as usize).product();
        let row: usize = shape
            .iter()
            .skip(1)
            .map(|d| *d as usize)
            .product::<usize>()
            .max(1);
        let mut start = 0;
        while start < numel {
            let cap = if buckets.is_empty() {
                caps.first
            } else {
                caps.rest
            }
            .max(1);
            let room = cap.saturating_sub(open.len);
            let left = numel - start;
            let take = if left <= room {
                left
            } else {
                let rows = room / row;
                if rows == 0 && open.len > 0 {
                    buckets.push(std::mem::take(&mut open));
                    continue;
                }
                (rows.max(1) * row).min(left)
            };
            open.push(i, name, shape, start, take);
            start += take;
        }
    }
    if open.len > 0 {
        buckets.push(open);
    }
    Ok(buckets)
}

/// DDP's layout (its `compute_bucket_assignment_by_size`) of the plain all-reduce: whole
/// tensors visited in `order`, a bucket closed once it holds its cap or more. A cap is then a
/// threshold, not a bound: a tensor is never split, so no bucket holds back the rest of a
/// tensor whose gradient is ready until the next layer's is. [`layout_in`]'s exact caps fill
/// a bucket with the first rows of the next tensor, and on a model of large layers nearly
/// every bucket then waited for a later layer (a 105 MB MLP hid 24 ms of 0.9 s of
/// communication); a codec keeps them, since its calls cross the sandbox with bounded memory.
pub fn layout_whole(
    tensors: &[(String, Vec<i64>)],
    order: &[usize],
    caps: Caps,
) -> std::result::Result<Vec<Bucket>, String> {
    check_order(tensors, order)?;
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut open = Bucket::default();
    for &i in order {
        let (name, shape) = &tensors[i];
        let numel: usize = shape.iter().map(|d| *d as usize).product();
        open.push(i, name, shape, 0, numel);
        let cap = if buckets.is_empty() {
            caps.first
        } else {
            caps.rest
        };
        if open.len >= cap.max(1) {
            buckets.push(std::mem::take(&mut open));
        }
    }
    if open.len > 0 {
        buckets.push(open);
    }
    Ok(buckets)
}

/// `order` names each of `tensors` exactly once.
fn check_order(tensors: &[(String, Vec<i64>)], order: &[usize]) -> std::result::Result<(), String> {
    let mut seen = vec![false; tensors.len()];
    for &i in order {
        match seen.get_mut(i) {
            Some(s) if !*s => *s = true,
            Some(_) => {
                return Err(format!(
                    "tensor {} ({i}) appears twice in the order",
                    tensors[i].0
                ));
            }
            None => return Err(format!("the order names tensor {i} of {}", tensors.len())),
        }
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(format!(
            "tensor {} ({i}) is missing from the order",
            tensors[i].0
        ));
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
    fn the_plain_layout_keeps_tensors_whole_and_closes_a_bucket_at_its_cap() {
        // Readiness order d, c, b, a: d (2) and c (20) reach the first cap of 4, b (4) and a
        // (6) the next of 10 only together.
        let t = shapes(&[("a", &[3, 2]), ("b", &[4]), ("c", &[5, 4]), ("d", &[2])]);
        let b = layout_whole(&t, &[3, 2, 1, 0], Caps { first: 4, rest: 10 }).unwrap();
        let names = |b: &Bucket| b.slices.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            b.iter().map(names).collect::<Vec<_>>(),
            [vec!["d", "c"], vec!["b", "a"]]
        );
        assert_eq!(b.iter().map(|b| b.len).collect::<Vec<_>>(), [22, 10]);
        // No tensor is split: each slice is a whole tensor.
        assert!(
            b.iter()
                .flat_map(|b| &b.slices)
                .all(|s| s.tensor_offset == 0)
        );
        // A last bucket under its cap is still a bucket; the order is checked as layout_in's.
        let short = layout_whole(
            &t,
            &[0, 1, 2, 3],
            Caps {
                first: 100,
                rest: 100,
            },
        )
        .unwrap();
        assert_eq!(short.iter().map(|b| b.len).collect::<Vec<_>>(), [32]);
        assert_eq!(
            layout_whole(&t, &[0, 1, 2], Caps { first: 4, rest: 4 }).unwrap_err(),
            "tensor d (3) is missing from the order"
        );
    }

    #[test]
    fn values_move_between_layouts_element_for_element() {
        let t = shapes(&[("a", &[3, 2]), ("b", &[4]), ("c", &[2])]);
        let old = layout(&t, 100);
        let new = layout_in(&t, &[2, 1, 0], Caps { first: 3, rest: 5 }).unwrap();
        let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let moved = relayout(&old, &new, &[values], &[6, 4, 2]);
        // c (10, 11) first, then b (6..10), then a's rows (0..6).
        assert_eq!(
            moved.concat(),
            [10.0, 11.0, 6.0, 7.0, 8.0, 9.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        );
        assert_eq!(
            relayout(&new, &old, &moved, &[6, 4, 2]).concat(),
            (0..12).map(|v| v as f32).collect::<Vec<_>>()
        );
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
    fn small_tensors_fuse_up_to_the_cap() {
        let t = shapes(&[
            ("a", &[4]),
            ("b", &[4]),
            ("c", &[4]),
            ("d", &[1]),
            ("e", &[1]),
        ]);
        let lens: Vec<usize> = layout(&t, 10).iter().map(|b| b.len).collect();
        assert_eq!(lens, [10, 4]);
        assert_eq!(layout(&t, 1 << 20).len(), 1);
    }

    #[test]
    fn a_layout_in_readiness_order_has_a_small_first_bucket_and_round_trips() {
        // Readiness runs from the last layer back: c, b, a.
        let t = shapes(&[("a", &[3, 2]), ("b", &[4]), ("c", &[2, 2])]);
        let caps = Caps { first: 4, rest: 10 };
        let b = layout_in(&t, &[2, 1, 0], caps).unwrap();
        let names = |b: &Bucket| b.slices.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
        assert_eq!(b.iter().map(|b| b.len).collect::<Vec<_>>(), [4, 10]);
        assert_eq!(names(&b[0]), ["c"]);
        assert_eq!(names(&b[1]), ["b", "a"]);
        // Pieces keep the optimizer's indices: gather and scatter see the same gradients.
        let a = Tensor::zeros([3, 2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let bb = Tensor::zeros([4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let c = Tensor::zeros([2, 2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        ((&a * 1.0).sum(Kind::Float) + (&bb * 2.0).sum(Kind::Float) + (&c * 3.0).sum(Kind::Float))
            .backward();
        let weights = [&a, &bb, &c];
        let got: Vec<Vec<f32>> = b.iter().map(|b| b.gather(&weights).unwrap()).collect();
        assert_eq!(got, [vec![3.; 4], [vec![2.; 4], vec![1.; 6]].concat()]);
        // The identity order with equal caps is `layout`.
        assert_eq!(
            layout_in(
                &t,
                &[0, 1, 2],
                Caps {
                    first: 10,
                    rest: 10
                }
            )
            .unwrap(),
            layout(&t, 10)
        );
    }

    #[test]
    fn an_order_that_is_not_a_permutation_is_refused_by_name() {
        let t = shapes(&[("a", &[2]), ("b", &[2])]);
        let caps = Caps { first: 4, rest: 4 };
        assert_eq!(
            layout_in(&t, &[0, 0], caps).unwrap_err(),
            "tensor a (0) appears twice in the order"
        );
        assert_eq!(
            layout_in(&t, &[1], caps).unwrap_err(),
            "tensor a (0) is missing from the order"
        );
        assert_eq!(
            layout_in(&t, &[0, 1, 2], caps).unwrap_err(),
            "the order names tensor 2 of 2"
        );
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
            let v = bucket.gather(&weights).unwrap();
            all.extend(v.iter().copied());
            let doubled: Vec<f32> = v.iter().map(|x| x * 2.0).collect();
            bucket.scatter(&weights, &doubled);
        }
        assert_eq!(all, [1., 2., 3., 4., 5., 6., 7., 7., 7., 7.]);
        assert_eq!(
            Vec::<f32>::try_from(a.grad().reshape([-1])).unwrap(),
            [2., 4., 6., 8., 10., 12.]
        );
        assert_eq!(Vec::<f32>::try_from(b.grad()).unwrap(), [14.; 4]);
    }

    #[test]
    fn a_tensor_without_a_gradient_gathers_as_zeros_and_keeps_none() {
        let a = Tensor::zeros([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let unused = Tensor::zeros([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        (&a * 5.0).sum(Kind::Float).backward();
        let buckets = layout(&shapes(&[("a", &[2]), ("unused", &[3])]), 8);
        let weights = [&a, &unused];
        let v = buckets[0].gather(&weights).unwrap();
        assert_eq!(v, [5., 5., 0., 0., 0.]);
        buckets[0].scatter(&weights, &[1., 2., 3., 4., 5.]);
        assert_eq!(Vec::<f32>::try_from(a.grad()).unwrap(), [1., 2.]);
        assert!(!unused.grad().defined());
    }
}
