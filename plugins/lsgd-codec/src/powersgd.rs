//! `powersgd`: PowerSGD (Vogels et al. 2019), rank-r compression of every matrix in the bucket
//! by one step of power iteration, in two summable rounds.
//!
//! A tensor slice is compressed when its shape has at least two dimensions (viewed as a
//! matrix M of rows = len / cols by cols = prod(shape[1..])), r < min(rows, cols) and
//! r·(rows + cols) < rows·cols. For each such slice, in `meta.tensors` order:
//!
//! - round 0: Q (cols × r) is the previous step's agreed Q (the warm start of the paper and of
//!   PyTorch's `powerSGD_hook`, carried in the bucket's state: contract 0.4) or, at the first
//!   step and with `warm_start=false`, Q₀ drawn from `meta.shared_seed` (standard normals from
//!   a stream seeded with `mix(shared_seed ^ slice index)`, so every rank draws the same Q₀).
//!   Q is orthonormalised, as PyTorch does, and the payload carries P = M·Q (rows × r);
//! - round 1: the host has summed every rank's P; P̂ = orthonormalise(ΣP) by modified
//!   Gram–Schmidt, and the payload carries Q = Mᵀ·P̂ (cols × r);
//! - decode([ΣP, last]) recomputes P̂ from ΣP and returns P̂·Qᵀ, Q read from `last`;
//! - next-state([ΣP, ΣQ]) keeps the Q part of ΣQ: the agreed Q, the next step's start.
//!
//! Every element outside a compressed slice (vectors, biases, matrices too small to gain) is
//! sent as raw binary32 after the Q matrices in round 1's payload. Decode is linear in the
//! last payload, so decoding this rank's own last payload gives this rank's share: P̂·P̂ᵀ·M for
//! the matrices and the exact values of the raw part, whose error-feedback residual is 0.
//!
//! Payloads are binary32, little-endian, summed by the host as f32 vectors (gradients arrive
//! divided by the world size, so the sums are means; nothing is divided here). Matrices are
//! stored column by column: round 0 is, per compressed slice, r columns of `rows` floats;
//! round 1 is, per compressed slice, r columns of `cols` floats, then the raw elements in
//! bucket order. A compressed slice costs r·(rows + cols) floats instead of rows·cols.
//!
//! Arithmetic is in a fixed order (dot products in eight binary32 lanes, Gram–Schmidt in
//! binary64, no fused multiply-add), so native and wasm builds agree bit for bit.

use core::ops::Range;

use crate::rng::{Rng, mix};
use crate::wire::check_len;
use crate::wire::{expect_rounds, f32s_from_le, put_f32s};
use crate::{Codec, Combine, Element, Info, Meta, ParamSpec, Params, Policy, Properties};

/// Largest accepted `rank`: far beyond any useful value, and keeps r·(rows + cols) in range.
const MAX_RANK: i64 = 1 << 16;

/// A column keeping less than this fraction of its norm after the earlier columns are
/// removed is numerically dependent on them; normalising it would only amplify rounding noise.
const DEPENDENT: f64 = 1e-4;

/// Rank-r power-iteration compression of the bucket's matrices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PowerSgd {
    /// The rank r of each approximation, ≥ 1.
    pub rank: u32,
    /// Whether each step starts from the previous step's agreed Q (the bucket's state) rather
    /// than a fresh random Q₀.
    pub warm_start: bool,
    /// The first step that compresses: earlier steps send every element raw (PyTorch's
    /// `start_powerSGD_iter`, whose vanilla all-reduce steps these are).
    pub start_step: u64,
}

impl PowerSgd {
    /// Which slices of `meta`'s bucket this step compresses.
    fn plan(&self, meta: &Meta) -> Result<Plan, String> {
        Plan::new(meta, self.rank as usize, meta.step >= self.start_step)
    }
}

impl Policy for PowerSgd {
    fn info() -> Info {
        // 2.0.0: warm start (contract 0.4), and Q₀ orthonormalised as PyTorch does.
        let info = Info::new(
            "powersgd",
            "PowerSGD: rank-r approximation of each matrix by one power iteration per step, started from the previous step's agreed Q (warm start), two all-reduced rounds (P = M Q, then Q = M^T P-hat)",
            vec![
                ParamSpec::integer("rank", 2, "rank r of each matrix's approximation (>= 1)"),
                ParamSpec::boolean(
                    "warm_start",
                    true,
                    "start each step's power iteration from the previous step's agreed Q (false: a fresh random Q every step)",
                ),
                ParamSpec::integer(
                    "start_step",
                    0,
                    "first step that compresses; earlier steps send the bucket uncompressed (PyTorch's start_powerSGD_iter)",
                ),
            ],
        );
        Info {
            version: "2.0.0".into(),
            ..info
        }
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let v = p.integer("rank")?;
        if !(1..=MAX_RANK).contains(&v) {
            return Err(format!("rank must be in [1, {MAX_RANK}], got {v}"));
        }
        let start = p.integer("start_step")?;
        if start < 0 {
            return Err(format!("start_step must be 0 or more, got {start}"));
        }
        Ok(PowerSgd {
            rank: v as u32,
            warm_start: p.boolean("warm_start")?,
            start_step: start as u64,
        })
    }
}

impl Codec for PowerSgd {
    fn properties(&self) -> Properties {
        Properties {
            combine: Combine::Sum(Element::F32),
            rounds: 2,
            stateful: self.warm_start,
        }
    }

    fn encode(&self, meta: &Meta, data: &[f32], agreed: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        check_len(meta, data)?;
        let plan = self.plan(meta)?;
        let r = self.rank as usize;
        if agreed.len() != meta.round as usize {
            return Err(format!(
                "round {} needs {} agreed payload(s), got {}",
                meta.round,
                meta.round,
                agreed.len()
            ));
        }
        match meta.round {
            0 => {
                let mut out = Vec::with_capacity(4 * plan.p_len);
                let warm = self.warm_start && !meta.state.is_empty();
                let mut kept = match warm {
                    true => plan.read_q(&meta.state)?,
                    false => Vec::new(),
                }
                .into_iter();
                for m in &plan.mats {
                    let q = start_q(kept.next(), meta.shared_seed, m, r);
                    let mut p = vec![0f32; m.rows * r];
                    for (pc, qc) in p.chunks_exact_mut(m.rows).zip(q.chunks_exact(m.cols)) {
                        for (pi, row) in pc.iter_mut().zip(data[m.at..m.end()].chunks_exact(m.cols))
                        {
                            *pi = dot(row, qc);
                        }
                    }
                    put_f32s(&mut out, &p);
                }
                Ok(out)
            }
            1 => {
                let ps = plan.read_p(&agreed[0])?;
                let mut out = Vec::with_capacity(4 * (plan.q_len + plan.raw_len));
                for (m, p) in plan.mats.iter().zip(&ps) {
                    let p_hat = orthonormalise(p, m.rows, r);
                    let mut q = vec![0f32; m.cols * r];
                    for (i, row) in data[m.at..m.end()].chunks_exact(m.cols).enumerate() {
                        for (qc, pc) in q.chunks_exact_mut(m.cols).zip(p_hat.chunks_exact(m.rows)) {
                            axpy(qc, pc[i], row);
                        }
                    }
                    put_f32s(&mut out, &q);
                }
                for range in &plan.raw {
                    put_f32s(&mut out, &data[range.clone()]);
                }
                Ok(out)
            }
            other => Err(format!("powersgd has rounds 0 and 1, got round {other}")),
        }
    }

    fn next_state(&self, meta: &Meta, agreed: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        if !self.warm_start {
            return Ok(Vec::new());
        }
        if agreed.len() != 2 {
            return Err(format!(
                "next-state needs 2 agreed payloads (one per round), got {}",
                agreed.len()
            ));
        }
        let plan = self.plan(meta)?;
        let last = &agreed[1];
        if last.len() != 4 * (plan.q_len + plan.raw_len) {
            return Err(format!(
                "malformed payload: the last round has {} bytes, expected {} ({} Q floats + {} raw floats)",
                last.len(),
                4 * (plan.q_len + plan.raw_len),
                plan.q_len,
                plan.raw_len
            ));
        }
        Ok(last[..4 * plan.q_len].to_vec())
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        expect_rounds(payloads, 2)?;
        let plan = self.plan(meta)?;
        let r = self.rank as usize;
        let ps = plan.read_p(&payloads[0])?;
        let last = &payloads[1];
        let want = 4 * (plan.q_len + plan.raw_len);
        if last.len() != want {
            return Err(format!(
                "malformed payload: the last round has {} bytes, expected {want} ({} Q floats + {} raw floats)",
                last.len(),
                plan.q_len,
                plan.raw_len
            ));
        }
        let floats = f32s_from_le(last);
        let (mut qs, mut raw) = floats.split_at(plan.q_len);
        let mut out = vec![0f32; meta.len as usize];
        for (m, p) in plan.mats.iter().zip(&ps) {
            let p_hat = orthonormalise(p, m.rows, r);
            let q;
            (q, qs) = qs.split_at(m.cols * r);
            for (i, row) in out[m.at..m.end()].chunks_exact_mut(m.cols).enumerate() {
                for (qc, pc) in q.chunks_exact(m.cols).zip(p_hat.chunks_exact(m.rows)) {
                    axpy(row, pc[i], qc);
                }
            }
        }
        for range in &plan.raw {
            let v;
            (v, raw) = raw.split_at(range.len());
            out[range.clone()].copy_from_slice(v);
        }
        Ok(out)
    }
}

/// One compressed slice.
#[derive(Clone, Debug, PartialEq)]
struct Mat {
    /// Position in `meta.tensors`, which seeds its Q₀.
    slice: usize,
    /// First element in the bucket.
    at: usize,
    rows: usize,
    cols: usize,
}

impl Mat {
    fn end(&self) -> usize {
        self.at + self.rows * self.cols
    }
}

/// Which slices of a bucket are compressed, and the payload sizes that follow.
#[derive(Debug)]
struct Plan {
    /// The rank.
    r: usize,
    mats: Vec<Mat>,
    /// Bucket ranges sent raw: everything outside `mats`, in order.
    raw: Vec<Range<usize>>,
    /// Floats of round 0: Σ rows·r.
    p_len: usize,
    /// Floats of the Q part of round 1: Σ cols·r.
    q_len: usize,
    /// Floats of the raw part of round 1.
    raw_len: usize,
}

impl Plan {
    /// The plan of `meta`'s bucket at rank `r`; with `compress` false every slice goes raw.
    fn new(meta: &Meta, r: usize, compress: bool) -> Result<Plan, String> {
        let n = meta.len as usize;
        let mut mats = Vec::new();
        let mut raw = Vec::new();
        let mut done = 0; // end of the last compressed slice
        for (slice, t) in meta.tensors.iter().enumerate() {
            let (at, len) = (t.bucket_offset as usize, t.len as usize);
            if at as u64 + len as u64 > n as u64 {
                return Err(format!(
                    "tensor slice '{}' ({len} floats at {at}) lies outside the bucket of {n}",
                    t.name
                ));
            }
            let cols = t.cols() as usize;
            let rows = len / cols;
            let worth = compress
                && t.shape.len() >= 2
                && len % cols == 0
                && r < rows.min(cols)
                && (r as u64) * (rows as u64 + cols as u64) < (rows as u64) * (cols as u64);
            if !worth {
                continue;
            }
            if at < done {
                return Err(format!(
                    "tensor slice '{}' at {at} overlaps the slice before it, which ends at {done}",
                    t.name
                ));
            }
            if at > done {
                raw.push(done..at);
            }
            done = at + len;
            mats.push(Mat {
                slice,
                at,
                rows,
                cols,
            });
        }
        if done < n {
            raw.push(done..n);
        }
        Ok(Plan {
            r,
            p_len: mats.iter().map(|m| m.rows * r).sum(),
            q_len: mats.iter().map(|m| m.cols * r).sum(),
            raw_len: raw.iter().map(|x| x.len()).sum(),
            mats,
            raw,
        })
    }

    /// The Q matrices of a state (each step's agreed Q, back to back), one per compressed
    /// slice.
    fn read_q(&self, state: &[u8]) -> Result<Vec<Vec<f32>>, String> {
        self.split(state, |m| m.cols).map_err(|got| {
            format!(
                "the state (the previous step's Q) has {got} bytes, expected {} ({} Q floats): was it written for another bucket layout or rank?",
                4 * self.q_len,
                self.q_len
            )
        })
    }

    /// The P matrices of a (summed) round-0 payload, one per compressed slice.
    fn read_p(&self, payload: &[u8]) -> Result<Vec<Vec<f32>>, String> {
        self.split(payload, |m| m.rows).map_err(|got| {
            format!(
                "malformed payload: round 0 has {got} bytes, expected {} ({} P floats)",
                4 * self.p_len,
                self.p_len
            )
        })
    }

    /// `bytes` cut into one r-column matrix per compressed slice, each column `side(slice)`
    /// floats long; the length of `bytes` as the error when it does not hold exactly those.
    fn split(&self, bytes: &[u8], side: impl Fn(&Mat) -> usize) -> Result<Vec<Vec<f32>>, usize> {
        let want: usize = self.mats.iter().map(|m| 4 * side(m) * self.r).sum();
        if bytes.len() != want {
            return Err(bytes.len());
        }
        let mut rest = bytes;
        Ok(self
            .mats
            .iter()
            .map(|m| {
                let (x, tail) = rest.split_at(4 * side(m) * self.r);
                rest = tail;
                f32s_from_le(x)
            })
            .collect())
    }
}

/// The orthonormal Q that round 0 multiplies a slice by: the kept one (warm start), or Q₀ at
/// the first step, without warm start, and when the kept Q has lost a column (a gradient that
/// was zero in some direction), from which power iteration could never recover it.
fn start_q(kept: Option<Vec<f32>>, shared_seed: u64, m: &Mat, r: usize) -> Vec<f32> {
    if let Some(q) = kept {
        let q = orthonormalise(&q, m.cols, r);
        if q.chunks_exact(m.cols).all(|c| c.iter().any(|&x| x != 0.0)) {
            return q;
        }
    }
    orthonormalise(&initial_q(shared_seed, m, r), m.cols, r)
}

/// Q₀ of one slice, column by column: r columns of `cols` standard normals, equal on every
/// rank because the seed is.
fn initial_q(shared_seed: u64, m: &Mat, r: usize) -> Vec<f32> {
    let mut rng = Rng::new(mix(shared_seed ^ m.slice as u64));
    (0..m.cols * r).map(|_| rng.normal()).collect()
}

/// The r columns of `p` (each `rows` long) made orthonormal by modified Gram–Schmidt in
/// binary64; a zero or dependent column becomes zero, so it contributes nothing to P̂·Qᵀ.
fn orthonormalise(p: &[f32], rows: usize, r: usize) -> Vec<f32> {
    let mut cols: Vec<Vec<f64>> = p
        .chunks_exact(rows)
        .take(r)
        .map(|c| c.iter().map(|&x| f64::from(x)).collect())
        .collect();
    for j in 0..cols.len() {
        let (done, rest) = cols.split_at_mut(j);
        let c = &mut rest[0];
        let before = norm(c);
        for e in done.iter() {
            let d: f64 = e.iter().zip(c.iter()).map(|(a, b)| a * b).sum();
            for (x, y) in c.iter_mut().zip(e) {
                *x -= d * y;
            }
        }
        let after = norm(c);
        // NaN norms fail the test too, which zeroes a column that came from non-finite data
        // rather than spreading NaN into every other column through the projections.
        if after > DEPENDENT * before {
            c.iter_mut().for_each(|x| *x /= after);
        } else {
            c.iter_mut().for_each(|x| *x = 0.0);
        }
    }
    cols.iter().flatten().map(|&x| x as f32).collect()
}

fn norm(c: &[f64]) -> f64 {
    c.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// Σ a[i]·b[i] in eight binary32 lanes combined in a fixed order: vectorisable without
/// reassociation, and the same bits in every build.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let whole = a.len().min(b.len()) / 8 * 8;
    let l = lanes(&a[..whole], &b[..whole]);
    let mut s = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
    for (x, y) in a[whole..].iter().zip(&b[whole..]) {
        s += x * y;
    }
    s
}

/// Lane l: Σ over the groups of 8 floats of x[l]·y[l], in group order (`x` and `y` hold
/// whole groups).
#[cfg(not(target_arch = "wasm32"))]
fn lanes(x: &[f32], y: &[f32]) -> [f32; 8] {
    let mut lanes = [0f32; 8];
    for (x, y) in x.chunks_exact(8).zip(y.chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes
}

/// Lane l: Σ over the groups of x[l]·y[l], in group order (wasm simd128: lanes 0–3 in one
/// vector, 4–7 in the other). Four groups a loop iteration: the sums keep their order, and
/// the engine's deadline check at each loop header runs a quarter as often.
#[cfg(target_arch = "wasm32")]
fn lanes(x: &[f32], y: &[f32]) -> [f32; 8] {
    use core::arch::wasm32::*;
    let (mut lo, mut hi) = (f32x4_splat(0.0), f32x4_splat(0.0));
    let n = x.len().min(y.len()) / 8;
    let (px, py) = (x.as_ptr() as *const v128, y.as_ptr() as *const v128);
    // SAFETY: group g is the v128s 2g and 2g + 1 of both slices, and g < n; wasm loads need no
    // alignment.
    let mut group = |g: usize| unsafe {
        lo = f32x4_add(
            lo,
            f32x4_mul(v128_load(px.add(2 * g)), v128_load(py.add(2 * g))),
        );
        hi = f32x4_add(
            hi,
            f32x4_mul(v128_load(px.add(2 * g + 1)), v128_load(py.add(2 * g + 1))),
        );
    };
    let mut g = 0;
    while g + 4 <= n {
        group(g);
        group(g + 1);
        group(g + 2);
        group(g + 3);
        g += 4;
    }
    while g < n {
        group(g);
        g += 1;
    }
    [
        f32x4_extract_lane::<0>(lo),
        f32x4_extract_lane::<1>(lo),
        f32x4_extract_lane::<2>(lo),
        f32x4_extract_lane::<3>(lo),
        f32x4_extract_lane::<0>(hi),
        f32x4_extract_lane::<1>(hi),
        f32x4_extract_lane::<2>(hi),
        f32x4_extract_lane::<3>(hi),
    ]
}

/// y += a·x, element-wise (each element is one multiply and one add, so the order is fixed).
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let (y, x) = (&mut y[..n], &x[..n]);
    #[cfg(target_arch = "wasm32")]
    let done = {
        use core::arch::wasm32::*;
        let av = f32x4_splat(a);
        let whole = n / 16 * 16;
        // Four vectors a loop iteration, for the same reason as in `lanes`.
        for (yc, xc) in y[..whole].chunks_exact_mut(16).zip(x.chunks_exact(16)) {
            let (py, px) = (yc.as_mut_ptr() as *mut v128, xc.as_ptr() as *const v128);
            for k in 0..4 {
                // SAFETY: both chunks hold 16 floats = 4 v128; wasm memory needs no alignment.
                unsafe {
                    let (py, px) = (py.add(k), px.add(k));
                    v128_store(py, f32x4_add(v128_load(py), f32x4_mul(av, v128_load(px))));
                }
            }
        }
        whole
    };
    #[cfg(not(target_arch = "wasm32"))]
    let done = 0;
    for (y, x) in y[done..].iter_mut().zip(&x[done..]) {
        *y += a * x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TensorSlice, Value, dynamic, round_trip};

    fn codec(rank: i64) -> Result<PowerSgd, String> {
        let given = vec![("rank".into(), Value::Integer(rank))];
        PowerSgd::configure(&Params::resolve(&PowerSgd::info().params, given)?)
    }

    fn cold(rank: i64) -> PowerSgd {
        PowerSgd {
            warm_start: false,
            ..codec(rank).unwrap()
        }
    }

    /// A bucket of the given tensors, back to back.
    fn bucket(shapes: &[(&str, &[u32])]) -> Meta {
        let mut at = 0;
        let mut tensors = Vec::new();
        for (name, shape) in shapes {
            let t = TensorSlice::whole(name, shape, at);
            at += t.len;
            tensors.push(t);
        }
        Meta {
            len: at,
            tensors,
            ..Meta::flat("x", at, 4, 1234)
        }
    }

    /// Σ_k σ_k · u_k v_kᵀ with random u, v: rank `terms`, spectrum set by `sigma`.
    fn low_rank(rows: usize, cols: usize, sigma: &[f32], seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        let mut m = vec![0f32; rows * cols];
        for &s in sigma {
            let u: Vec<f32> = (0..rows).map(|_| rng.normal()).collect();
            let v: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
            for i in 0..rows {
                for j in 0..cols {
                    m[i * cols + j] += s * u[i] * v[j];
                }
            }
        }
        m
    }

    fn max_err(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    fn rel_err(a: &[f32], b: &[f32]) -> f64 {
        let d: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (d / n).sqrt()
    }

    fn add(a: &[u8], b: &[u8]) -> Vec<u8> {
        assert_eq!(a.len(), b.len(), "summable payloads have equal lengths");
        let mut out = Vec::new();
        let s: Vec<f32> = f32s_from_le(a)
            .iter()
            .zip(f32s_from_le(b))
            .map(|(x, y)| x + y)
            .collect();
        put_f32s(&mut out, &s);
        out
    }

    #[test]
    fn recovers_a_rank_r_matrix_exactly() {
        let (rows, cols) = (40, 30);
        let m = low_rank(rows, cols, &[1.0, 0.5, 0.25], 1);
        let meta = bucket(&[("w", &[rows as u32, cols as u32])]);
        for r in [3, 4, 8] {
            let (payloads, out) =
                round_trip(dynamic(codec(r).unwrap()).as_ref(), &meta, &m).unwrap();
            let r = r as usize;
            assert_eq!(payloads[0].len(), 4 * rows * r);
            assert_eq!(payloads[1].len(), 4 * cols * r);
            let scale = m.iter().fold(0f32, |a, x| a.max(x.abs()));
            assert!(
                max_err(&out, &m) <= 1e-4 * scale,
                "rank {r}: {}",
                max_err(&out, &m)
            );
        }
        let out = round_trip(dynamic(codec(2).unwrap()).as_ref(), &meta, &m)
            .unwrap()
            .1;
        assert!(
            rel_err(&out, &m) > 1e-3,
            "rank 2 cannot hold a rank-3 matrix"
        );
    }

    #[test]
    fn error_falls_as_the_rank_grows() {
        let (rows, cols) = (64, 48);
        let sigma: Vec<f32> = (0..12).map(|k| 0.5f32.powi(k)).collect();
        let m = low_rank(rows, cols, &sigma, 2);
        let meta = bucket(&[("w", &[rows as u32, 4, 12])]);
        let mut prev = f64::INFINITY;
        for r in [1, 2, 4, 8, 12] {
            let out = round_trip(dynamic(codec(r).unwrap()).as_ref(), &meta, &m)
                .unwrap()
                .1;
            let e = rel_err(&out, &m);
            assert!(e < prev, "rank {r}: {e} after {prev}");
            prev = e;
        }
        assert!(prev < 1e-4, "rank 12 holds all 12 terms: {prev}");
    }

    #[test]
    fn vectors_and_small_matrices_are_sent_raw_and_exact() {
        // w: 20×16 (compressed at r = 2: 72 < 320); b: a vector; s: 3×3 (2·6 > 9, raw);
        // t: 4×2 (r ≥ min(rows, cols), raw).
        let meta = bucket(&[
            ("w", &[20, 16]),
            ("b", &[16]),
            ("s", &[3, 3]),
            ("t", &[4, 2]),
        ]);
        let n = meta.len as usize;
        let data: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 113) as f32 * 0.01 - 0.5)
            .collect();
        let c = codec(2).unwrap();
        let (payloads, out) = round_trip(dynamic(c).as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0].len(), 4 * 20 * 2);
        assert_eq!(payloads[1].len(), 4 * (16 * 2 + 16 + 9 + 8));
        assert_eq!(&out[320..], &data[320..], "raw slices are exact");
        assert!(out[..320] != data[..320], "the matrix is approximated");
        let floats = 20 * 2 + 16 * 2 + 16 + 9 + 8;
        assert_eq!(payloads.iter().map(Vec::len).sum::<usize>(), 4 * floats);
    }

    #[test]
    fn two_ranks_sum_p_then_q() {
        let meta = bucket(&[
            ("b0", &[5]),
            ("w", &[24, 18]),
            ("b", &[18]),
            ("v", &[16, 20]),
        ]);
        let n = meta.len as usize;
        let mut rng = Rng::new(9);
        let a: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let b: Vec<f32> = (0..n).map(|_| rng.normal() * 0.3).collect();
        let c = codec(3).unwrap();
        let mut m = meta.clone();
        let p_sum = add(
            &c.encode(&m, &a, &[]).unwrap(),
            &c.encode(&m, &b, &[]).unwrap(),
        );
        m.round = 1;
        let agreed = vec![p_sum.clone()];
        let (qa, qb) = (
            c.encode(&m, &a, &agreed).unwrap(),
            c.encode(&m, &b, &agreed).unwrap(),
        );
        let q_sum = add(&qa, &qb);
        let out = c.decode(&m, &[p_sum.clone(), q_sum]).unwrap();

        // Expected: raw parts summed; each matrix P̂·P̂ᵀ·(A + B) with P̂ from the summed P.
        let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let p = f32s_from_le(&p_sum);
        let mut p_at = 0;
        for (t, (rows, cols)) in [(1usize, (24usize, 18usize)), (3, (16, 20))] {
            let r = 3;
            let at = meta.tensors[t].bucket_offset as usize;
            let p_hat = orthonormalise(&p[p_at..p_at + rows * r], rows, r);
            p_at += rows * r;
            for i in 0..rows {
                for j in 0..cols {
                    let mut want = 0f64;
                    for k in 0..r {
                        let mut qk = 0f64; // (Mᵀ p̂_k)[j]
                        for l in 0..rows {
                            qk +=
                                f64::from(sum[at + l * cols + j]) * f64::from(p_hat[k * rows + l]);
                        }
                        want += f64::from(p_hat[k * rows + i]) * qk;
                    }
                    let got = f64::from(out[at + i * cols + j]);
                    assert!(
                        (got - want).abs() < 1e-4,
                        "tensor {t} ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
        for range in [0..5, 5 + 24 * 18..5 + 24 * 18 + 18] {
            for i in range {
                assert_eq!(out[i], a[i] + b[i], "raw element {i}");
            }
        }

        // Decode is linear in the last payload: each rank's own share adds up to the result,
        // and the raw part of a rank's own share is exactly its own data (zero EF residual).
        let own_a = c.decode(&m, &[p_sum.clone(), qa]).unwrap();
        let own_b = c.decode(&m, &[p_sum, qb]).unwrap();
        for i in 0..n {
            assert!((own_a[i] + own_b[i] - out[i]).abs() < 1e-5, "{i}");
        }
        assert_eq!(&own_a[..5], &a[..5]);
    }

    #[test]
    fn the_initial_q_is_shared_and_seeded() {
        let meta = bucket(&[("w", &[10, 8])]);
        let data: Vec<f32> = (0..80).map(|i| (i as f32).sin()).collect();
        let c = codec(2).unwrap();
        let p = c.encode(&meta, &data, &[]).unwrap();
        assert_eq!(
            p,
            c.encode(
                &Meta {
                    rank_seed: 5,
                    ..meta.clone()
                },
                &data,
                &[]
            )
            .unwrap()
        );
        assert_ne!(
            p,
            c.encode(
                &Meta {
                    shared_seed: 5,
                    ..meta.clone()
                },
                &data,
                &[]
            )
            .unwrap()
        );
    }

    #[test]
    fn orthonormalise_leaves_zero_and_dependent_columns_zero() {
        // Columns: e0 direction, zero, 2·first, an independent one.
        let rows = 4;
        let p = [
            1.0f32, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0,
        ];
        let q = orthonormalise(&p, rows, 4);
        let h = std::f32::consts::FRAC_1_SQRT_2;
        assert_eq!(&q[..4], &[h, h, 0.0, 0.0]);
        assert_eq!(&q[4..12], &[0.0; 8]);
        let last = &q[12..];
        let dot0: f32 = last.iter().zip(&q[..4]).map(|(x, y)| x * y).sum();
        let len: f32 = last.iter().map(|x| x * x).sum();
        assert!(dot0.abs() < 1e-6 && (len - 1.0).abs() < 1e-6, "{last:?}");
    }

    #[test]
    fn rejects_bad_rounds_payloads_and_parameters() {
        let meta = bucket(&[("w", &[10, 8]), ("b", &[3])]);
        let c = codec(2).unwrap();
        let data = vec![1.0f32; 83];
        assert!(
            c.encode(&meta, &data[1..], &[])
                .unwrap_err()
                .contains("82 floats")
        );
        let p = c.encode(&meta, &data, &[]).unwrap();
        let m1 = Meta {
            round: 1,
            ..meta.clone()
        };
        assert!(
            c.encode(&m1, &data, &[])
                .unwrap_err()
                .contains("needs 1 agreed")
        );
        let e = c.encode(&m1, &data, &[p[4..].to_vec()]).unwrap_err();
        assert!(
            e.starts_with("malformed payload: round 0 has 76 bytes, expected 80"),
            "{e}"
        );
        let m2 = Meta {
            round: 2,
            ..meta.clone()
        };
        let e = c.encode(&m2, &data, &[p.clone(), p.clone()]).unwrap_err();
        assert!(e.contains("rounds 0 and 1"), "{e}");
        let q = c.encode(&m1, &data, std::slice::from_ref(&p)).unwrap();
        assert_eq!(q.len(), 4 * (8 * 2 + 3));
        assert!(
            c.decode(&m1, std::slice::from_ref(&q))
                .unwrap_err()
                .contains("2 payload")
        );
        let e = c
            .decode(&m1, &[p.clone(), q[..q.len() - 4].to_vec()])
            .unwrap_err();
        assert!(e.starts_with("malformed payload: the last round"), "{e}");
        assert!(
            c.decode(&m1, &[p[..8].to_vec(), q.clone()])
                .unwrap_err()
                .starts_with("malformed payload")
        );
        let mut bad = m1.clone();
        bad.tensors[1].len = 4;
        assert!(
            c.decode(&bad, &[p, q])
                .unwrap_err()
                .contains("outside the bucket")
        );
        for r in [0, -1, MAX_RANK + 1] {
            assert_eq!(
                codec(r).unwrap_err(),
                format!("rank must be in [1, 65536], got {r}")
            );
        }
        assert_eq!(c.properties().rounds, 2);
    }

    /// `steps` single-rank steps of `c` on the same matrix `m`, the state carried from each
    /// step to the next; the relative error of each step's reconstruction.
    fn steps(c: PowerSgd, meta: &Meta, m: &[f32], steps: u64) -> Vec<f64> {
        let mut meta = meta.clone();
        let mut errors = Vec::new();
        for step in 0..steps {
            meta.step = step;
            meta.shared_seed = 1000 + step;
            let (payloads, out) = round_trip(dynamic(c).as_ref(), &meta, m).unwrap();
            errors.push(rel_err(&out, m));
            let mut last = meta.clone();
            last.round = 1;
            meta.state = c.next_state(&last, &payloads).unwrap();
        }
        errors
    }

    #[test]
    fn warm_start_iterates_towards_the_best_rank_r_approximation() {
        // On a fixed matrix, steps with warm start are subspace iteration: the error falls to
        // that of the best rank-1 approximation and stays; every cold step is one power
        // iteration from a random start, which stays worse.
        let (rows, cols) = (48, 40);
        let sigma: Vec<f32> = (0..10).map(|k| 0.5f32.powi(k)).collect();
        let m = low_rank(rows, cols, &sigma, 3);
        let meta = bucket(&[("w", &[rows as u32, cols as u32])]);
        let warm = steps(codec(1).unwrap(), &meta, &m, 12);
        let cold = steps(cold(1), &meta, &m, 12);
        assert!(warm.windows(2).all(|w| w[1] <= w[0] + 1e-6), "{warm:?}");
        assert!((warm[11] - warm[10]).abs() < 1e-5, "converged: {warm:?}");
        assert!(
            cold.iter().all(|&e| e > warm[11] * 1.01),
            "cold: {cold:?}, warm: {warm:?}"
        );
    }

    #[test]
    fn the_state_is_the_agreed_q_and_only_a_warm_start_keeps_one() {
        let meta = bucket(&[("b", &[3]), ("w", &[12, 10]), ("v", &[8, 6])]);
        let data: Vec<f32> = (0..meta.len).map(|i| (i as f32 * 0.37).cos()).collect();
        let c = codec(2).unwrap();
        assert!(c.properties().stateful && !cold(2).properties().stateful);
        let (payloads, _) = round_trip(dynamic(c).as_ref(), &meta, &data).unwrap();
        let last = Meta {
            round: 1,
            ..meta.clone()
        };
        let state = c.next_state(&last, &payloads).unwrap();
        assert_eq!(state.len(), 4 * (10 + 6) * 2, "the Q of both matrices");
        assert_eq!(&state[..], &payloads[1][..state.len()]);
        assert_eq!(
            cold(2).next_state(&last, &payloads).unwrap(),
            Vec::<u8>::new()
        );
        // The next step multiplies by the kept Q (orthonormalised), whatever the seed says.
        let next = Meta {
            state: state.clone(),
            shared_seed: 77,
            ..meta.clone()
        };
        let p = c.encode(&next, &data, &[]).unwrap();
        assert_eq!(
            p,
            c.encode(
                &Meta {
                    shared_seed: 78,
                    ..next.clone()
                },
                &data,
                &[]
            )
            .unwrap()
        );
        assert_ne!(
            p,
            c.encode(
                &Meta {
                    state: Vec::new(),
                    ..next.clone()
                },
                &data,
                &[]
            )
            .unwrap()
        );
        // Without warm start the state is ignored.
        assert_eq!(
            cold(2).encode(&next, &data, &[]).unwrap(),
            cold(2)
                .encode(
                    &Meta {
                        state: Vec::new(),
                        ..next.clone()
                    },
                    &data,
                    &[]
                )
                .unwrap()
        );
        let e = c
            .encode(
                &Meta {
                    state: state[4..].to_vec(),
                    ..next
                },
                &data,
                &[],
            )
            .unwrap_err();
        assert!(
            e.starts_with("the state (the previous step's Q) has 124 bytes, expected 128"),
            "{e}"
        );
        assert!(
            c.next_state(&last, &payloads[..1])
                .unwrap_err()
                .contains("2 agreed")
        );
    }

    #[test]
    fn a_kept_q_that_lost_a_column_starts_again_from_q0() {
        let meta = bucket(&[("w", &[12, 10])]);
        let data: Vec<f32> = (0..120).map(|i| (i as f32 * 0.11).sin()).collect();
        let c = codec(2).unwrap();
        let mut zero_column = Vec::new();
        put_f32s(&mut zero_column, &[[0.5f32; 10], [0.0; 10]].concat());
        let fresh = c.encode(&meta, &data, &[]).unwrap();
        let kept = Meta {
            state: zero_column,
            ..meta.clone()
        };
        assert_eq!(c.encode(&kept, &data, &[]).unwrap(), fresh);
    }

    #[test]
    fn steps_before_start_step_send_everything_raw_and_keep_no_state() {
        let meta = bucket(&[("w", &[12, 10]), ("b", &[10])]);
        let data: Vec<f32> = (0..130).map(|i| (i as f32 * 0.3).sin()).collect();
        let c = PowerSgd {
            start_step: 3,
            ..codec(2).unwrap()
        };
        let early = Meta {
            step: 2,
            ..meta.clone()
        };
        let (payloads, out) = round_trip(dynamic(c).as_ref(), &early, &data).unwrap();
        assert_eq!(payloads[0], Vec::<u8>::new(), "no P before the start");
        assert_eq!(out, data, "the bucket went raw");
        let last = Meta { round: 1, ..early };
        assert!(c.next_state(&last, &payloads).unwrap().is_empty());
        let from = Meta { step: 3, ..meta };
        let (payloads, _) = round_trip(dynamic(c).as_ref(), &from, &data).unwrap();
        assert_eq!(payloads[0].len(), 4 * 12 * 2, "compressed from step 3");
        assert_eq!(
            codec(2).map(|c| c.start_step).unwrap(),
            0,
            "compresses from the first step by default"
        );
    }
}
