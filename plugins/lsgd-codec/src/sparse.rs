//! The index+value payload that top-k, threshold and random-k (per-rank seeds) share, and the
//! magnitude scan behind top-k and threshold.
//!
//! Layout, all little-endian:
//!
//! | bytes | content |
//! | --- | --- |
//! | 4 | `count`: u32 |
//! | 4·count | indices: u32, strictly ascending, each < `meta.len` |
//! | 4·count | values: binary32, `values[i]` belongs at `indices[i]` |
//!
//! Decoding scatters the values into zeros. Ascending indices make the format canonical (one
//! payload per set of kept elements) and let decode reject duplicates in the same pass.
//!
//! Magnitudes are compared as integers: for a binary32 `x`, `x.to_bits() & 0x7fff_ffff` (the
//! *key*) orders non-NaN values exactly as `|x|` does, needs no float compare (so no `fmaxf`
//! calls in wasm), and vectorises as plain i32 compares. Every NaN key lies above infinity's, so
//! the codecs built on keys treat a NaN as larger than any number.

use crate::Params;
use crate::wire::Reader;

/// Bytes of a sparse payload holding `count` elements.
pub fn encoded_len(count: usize) -> usize {
    4 + 8 * count
}

/// The magnitude key of `x`: its bits without the sign.
#[inline(always)]
pub fn key(x: f32) -> u32 {
    x.to_bits() & 0x7fff_ffff
}

/// How many elements a `density` keeps of `n`: max(1, ceil(density·n)), never more than `n`.
pub fn count_for(density: f64, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    // The product is exact enough: n < 2^32 and density ≤ 1, so ceil sees at most one rounding.
    ((density * n as f64).ceil() as usize).clamp(1, n)
}

/// Reads the float parameter `name` and checks that it lies in (0, 1].
pub fn density_param(p: &Params, name: &str) -> Result<f64, String> {
    let v = p.float(name)?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("{name} must be in (0, 1], got {v}"))
    }
}

/// The sparse payload of `data[i] · scale` for every `i` in `indices` (ascending, in range).
/// `scale == 1.0` copies the values bit for bit.
pub fn encode(data: &[f32], indices: &[u32], scale: f32) -> Vec<u8> {
    let count = indices.len();
    let mut out = vec![0u8; encoded_len(count)];
    let (head, rest) = out.split_at_mut(4);
    head.copy_from_slice(&(count as u32).to_le_bytes());
    let (idx_bytes, val_bytes) = rest.split_at_mut(4 * count);
    for (b, &i) in idx_bytes.chunks_exact_mut(4).zip(indices) {
        b.copy_from_slice(&i.to_le_bytes());
    }
    if scale == 1.0 {
        for (b, &i) in val_bytes.chunks_exact_mut(4).zip(indices) {
            b.copy_from_slice(&data[i as usize].to_le_bytes());
        }
    } else {
        for (b, &i) in val_bytes.chunks_exact_mut(4).zip(indices) {
            b.copy_from_slice(&(data[i as usize] * scale).to_le_bytes());
        }
    }
    out
}

/// Checks a sparse payload for a bucket of `len` floats and scatters it into zeros.
pub fn decode(payload: &[u8], len: u32) -> Result<Vec<f32>, String> {
    let mut r = Reader::new(payload);
    let count = r.u32("the element count")?;
    if count > len {
        return Err(format!(
            "malformed payload: {count} elements for a bucket of {len}"
        ));
    }
    let count = count as usize;
    let idx = r.take(4 * count, "the indices")?;
    let val = r.take(4 * count, "the values")?;
    r.finish()?;
    let mut out = vec![0.0f32; len as usize];
    let mut next = 0u32; // the smallest index the next entry may have
    for (k, (i, v)) in idx.chunks_exact(4).zip(val.chunks_exact(4)).enumerate() {
        let i = u32::from_le_bytes([i[0], i[1], i[2], i[3]]);
        if i >= len {
            return Err(format!(
                "malformed payload: index {i} (entry {k}) is outside the bucket of {len}"
            ));
        }
        if i < next {
            return Err(format!(
                "malformed payload: index {i} (entry {k}) is not above the previous index {}",
                next - 1
            ));
        }
        next = i + 1;
        out[i as usize] = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
    }
    Ok(out)
}

/// Appends to `out` the index of every element of `data` whose key is `>= lo`, ascending.
/// `lo` must not exceed `0x7fff_ffff`. Both paths test 16 elements at a time and only walk
/// the set bits of a group that has a hit, so a sparse hit pattern costs one compare pass.
pub fn collect_at_least(data: &[f32], lo: u32, out: &mut Vec<u32>) {
    debug_assert!(lo <= 0x7fff_ffff);
    let groups = data.chunks_exact(16);
    let tail = groups.remainder();
    let tail_at = data.len() - tail.len();
    for (g, chunk) in groups.enumerate() {
        let mut bits = group_mask(chunk, lo);
        while bits != 0 {
            out.push((g * 16) as u32 + bits.trailing_zeros());
            bits &= bits - 1;
        }
    }
    for (j, &x) in tail.iter().enumerate() {
        if key(x) >= lo {
            out.push((tail_at + j) as u32);
        }
    }
}

/// Bit j set when `key(chunk[j]) >= lo`, for a chunk of 16.
#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
fn group_mask(chunk: &[f32], lo: u32) -> u32 {
    // Keys and `lo` are below 2^31, so a signed compare is exact and maps to SSE2's pcmpgtd.
    let lo = lo as i32;
    let any = chunk.iter().fold(false, |a, &x| a | (key(x) as i32 >= lo));
    if !any {
        return 0;
    }
    let mut bits = 0u32;
    for (j, &x) in chunk.iter().enumerate() {
        bits |= u32::from(key(x) as i32 >= lo) << j;
    }
    bits
}

/// Bit j set when `key(chunk[j]) >= lo`, for a chunk of 16 (wasm simd128).
#[cfg(target_arch = "wasm32")]
#[inline(always)]
fn group_mask(chunk: &[f32], lo: u32) -> u32 {
    use core::arch::wasm32::*;
    assert!(chunk.len() == 16);
    let p = chunk.as_ptr() as *const v128;
    // SAFETY: the chunk holds 16 floats = 4 v128, and wasm loads need no alignment.
    let (a, b, c, d) = unsafe {
        (
            v128_load(p),
            v128_load(p.add(1)),
            v128_load(p.add(2)),
            v128_load(p.add(3)),
        )
    };
    let m = u32x4_splat(0x7fff_ffff);
    let l = u32x4_splat(lo);
    let ge = |v: v128| u32x4_ge(v128_and(v, m), l);
    let (a, b, c, d) = (ge(a), ge(b), ge(c), ge(d));
    if !v128_any_true(v128_or(v128_or(a, b), v128_or(c, d))) {
        return 0;
    }
    u32::from(i32x4_bitmask(a))
        | u32::from(i32x4_bitmask(b)) << 4
        | u32::from(i32x4_bitmask(c)) << 8
        | u32::from(i32x4_bitmask(d)) << 12
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;

    #[test]
    fn round_trips_and_scatters_into_zeros() {
        let data = [0.5f32, -1.0, 2.0, 0.0, -3.5];
        let p = encode(&data, &[1, 4], 1.0);
        assert_eq!(p.len(), encoded_len(2));
        assert_eq!(decode(&p, 5).unwrap(), vec![0.0, -1.0, 0.0, 0.0, -3.5]);
        let p = encode(&data, &[2], 0.5);
        assert_eq!(decode(&p, 5).unwrap(), vec![0.0, 0.0, 1.0, 0.0, 0.0]);
        assert_eq!(decode(&encode(&data, &[], 1.0), 5).unwrap(), vec![0.0; 5]);
    }

    fn raw(count: u32, idx: &[u32], val: &[f32]) -> Vec<u8> {
        let mut p = count.to_le_bytes().to_vec();
        crate::wire::put_u32s(&mut p, idx);
        crate::wire::put_f32s(&mut p, val);
        p
    }

    #[test]
    fn rejects_malformed_payloads() {
        let err = |p: &[u8]| decode(p, 10).unwrap_err();
        for (p, want) in [
            (vec![], "element count"),
            (raw(11, &[], &[]), "11 elements for a bucket of 10"),
            (raw(2, &[1, 2], &[1.0]), "the values"),
            (raw(1, &[10], &[1.0]), "index 10 (entry 0) is outside"),
            (
                raw(2, &[3, 2], &[1.0, 1.0]),
                "index 2 (entry 1) is not above",
            ),
            (
                raw(2, &[3, 3], &[1.0, 1.0]),
                "index 3 (entry 1) is not above",
            ),
        ] {
            let e = err(&p);
            assert!(
                e.starts_with("malformed payload") && e.contains(want),
                "{e}"
            );
        }
        let mut p = raw(1, &[3], &[1.0]);
        p.push(0);
        assert!(err(&p).contains("trailing"));
    }

    #[test]
    fn collects_exactly_the_keys_at_least_lo_in_index_order() {
        let mut rng = crate::rng::Rng::new(3);
        let data: Vec<f32> = (0..1000)
            .map(|i| match i % 97 {
                0 => f32::NAN,
                1 => -f32::INFINITY,
                2 => -0.0,
                _ => rng.normal(),
            })
            .collect();
        for lo in [0u32, key(0.5), key(2.0), key(f32::INFINITY), 0x7fff_ffff] {
            let mut got = Vec::new();
            collect_at_least(&data, lo, &mut got);
            let want: Vec<u32> = (0..data.len() as u32)
                .filter(|&i| key(data[i as usize]) >= lo)
                .collect();
            assert_eq!(got, want, "lo = {lo:#x}");
        }
    }

    #[test]
    fn counts_and_densities() {
        assert_eq!(count_for(0.01, 1000), 10);
        assert_eq!(count_for(0.01, 1001), 11);
        assert_eq!(count_for(1e-9, 1000), 1);
        assert_eq!(count_for(1.0, 7), 7);
        assert_eq!(count_for(0.5, 0), 0);
        let p = |v: f64| Params(vec![("density".into(), Value::Float(v))]);
        assert_eq!(density_param(&p(0.25), "density"), Ok(0.25));
        for bad in [0.0, -0.1, 1.5, f64::NAN] {
            let e = density_param(&p(bad), "density").unwrap_err();
            assert_eq!(e, format!("density must be in (0, 1], got {bad}"));
        }
    }
}
