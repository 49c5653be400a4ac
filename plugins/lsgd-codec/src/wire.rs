//! Payload bytes: little-endian writers, a bounds-checked reader whose errors say what was
//! malformed, and the 16-bit float conversions (round to nearest, ties to even) that fp16,
//! bf16 and the host's 16-bit all-reduce share.

/// Appends `xs` as little-endian binary32: one copy on a little-endian target (wasm32 and
/// x86-64), which matters for the summable codecs that ship whole buckets.
pub fn put_f32s(out: &mut Vec<u8>, xs: &[f32]) {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: f32 has no padding and every byte is a valid u8; the length is in bytes.
        let bytes = unsafe { core::slice::from_raw_parts(xs.as_ptr().cast::<u8>(), xs.len() * 4) };
        out.extend_from_slice(bytes);
    }
    #[cfg(not(target_endian = "little"))]
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Appends `xs` as little-endian u32.
pub fn put_u32s(out: &mut Vec<u8>, xs: &[u32]) {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: as in `put_f32s`.
        let bytes = unsafe { core::slice::from_raw_parts(xs.as_ptr().cast::<u8>(), xs.len() * 4) };
        out.extend_from_slice(bytes);
    }
    #[cfg(not(target_endian = "little"))]
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Little-endian binary32 bytes (a multiple of 4) as floats, in one copy on a little-endian
/// target.
pub fn f32s_from_le(b: &[u8]) -> Vec<f32> {
    let n = b.len() / 4;
    let mut out: Vec<f32> = Vec::with_capacity(n);
    #[cfg(target_endian = "little")]
    // SAFETY: `out` has capacity for n floats, the source holds 4·n bytes, the regions are
    // distinct allocations, and every bit pattern is a valid f32; the length is set after the
    // copy initialised all n elements.
    unsafe {
        core::ptr::copy_nonoverlapping(b.as_ptr(), out.as_mut_ptr().cast::<u8>(), n * 4);
        out.set_len(n);
    }
    #[cfg(not(target_endian = "little"))]
    out.extend(
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    );
    out
}

/// Reads a payload front to back; every read checks the length first.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        match end {
            Some(end) => {
                let out = &self.bytes[self.at..end];
                self.at = end;
                Ok(out)
            }
            None => Err(format!(
                "malformed payload: {what} needs {n} bytes at offset {}, but the payload has {}",
                self.at,
                self.bytes.len()
            )),
        }
    }

    /// A little-endian u32.
    pub fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A little-endian binary32.
    pub fn f32(&mut self, what: &str) -> Result<f32, String> {
        Ok(f32::from_bits(self.u32(what)?))
    }

    /// `n` little-endian binary32 values.
    pub fn f32s(&mut self, n: usize, what: &str) -> Result<Vec<f32>, String> {
        let b = self.take(n.checked_mul(4).ok_or("length overflow")?, what)?;
        Ok(f32s_from_le(b))
    }

    /// `n` little-endian u32 values.
    pub fn u32s(&mut self, n: usize, what: &str) -> Result<Vec<u32>, String> {
        let b = self.take(n.checked_mul(4).ok_or("length overflow")?, what)?;
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Errors unless every byte was read.
    pub fn finish(self) -> Result<(), String> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(format!(
                "malformed payload: {} trailing bytes after offset {}",
                self.bytes.len() - self.at,
                self.at
            ))
        }
    }
}

/// `data.len()`, after checking it is the bucket length `meta.len` (every codec's encode does).
pub fn check_len(meta: &crate::Meta, data: &[f32]) -> Result<usize, String> {
    if data.len() == meta.len as usize {
        Ok(data.len())
    } else {
        Err(format!(
            "encode got {} floats for a bucket of {}",
            data.len(),
            meta.len
        ))
    }
}

/// Errors unless `payloads` holds exactly `rounds` payloads.
pub fn expect_rounds(payloads: &[Vec<u8>], rounds: usize) -> Result<(), String> {
    if payloads.len() == rounds {
        Ok(())
    } else {
        Err(format!(
            "decode needs {rounds} payload(s), one per round, but got {}",
            payloads.len()
        ))
    }
}

/// binary32 → binary16 bits, round to nearest even; overflow gives ±inf, NaN stays NaN (quiet,
/// sign kept).
///
/// Every case is computed and one selected, without branches, so that a codec's loop over a
/// bucket compiles to SIMD (the guests build with simd128). The float addition rounds a
/// subnormal result; its operands and result are normal floats, so a flush-to-zero mode
/// cannot change it. Checked against the case-by-case `tests::reference_f16_bits`.
#[inline]
pub fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = (b >> 16) & 0x8000;
    let a = b & 0x7fff_ffff;
    // A normal result: rebias the exponent and round the 13 dropped bits to nearest even (a
    // carry into the exponent is the correct rounding, up to inf at the top).
    let odd = (a >> 13) & 1;
    let normal = a.wrapping_sub(112 << 23).wrapping_add(0xfff + odd) >> 13;
    // A subnormal one (|x| < 2^-14): 0.5 + |x| rounds |x| to nearest even at 2^-24, the
    // binary16 subnormal step, and holds the steps in its low bits.
    let tiny = (f32::from_bits(a) + 0.5)
        .to_bits()
        .wrapping_sub(0.5f32.to_bits());
    let finite = if a < 113 << 23 { tiny } else { normal };
    let huge = if a > 0x7f80_0000 { 0x7e00 } else { 0x7c00 };
    (sign | if a >= 143 << 23 { huge } else { finite }) as u16
}

/// binary16 bits → binary32 (exact); a NaN comes back quiet with its payload and sign.
/// Branch-free for the same reason as [`f16_bits`].
#[inline]
pub fn f16_value(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = (h & 0x7fff) << 13;
    let normal = em + (112 << 23);
    // man · 2^-24, exact in binary32.
    let tiny = ((h & 0x3ff) as f32 * f32::from_bits(0x3380_0000)).to_bits();
    let quiet = if em > 0x0f80_0000 { 0x0040_0000 } else { 0 };
    let v = if em >= 0x0f80_0000 {
        em | 0x7f80_0000 | quiet
    } else if em < 0x0080_0000 {
        tiny
    } else {
        normal
    };
    f32::from_bits(sign | v)
}

/// binary32 → bfloat16 bits, round to nearest even; NaN stays NaN.
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// bfloat16 bits → binary32 (exact).
pub fn bf16_value(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The case-by-case binary32 → binary16 that [`f16_bits`] must equal.
    fn reference_f16_bits(x: f32) -> u16 {
        let b = x.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32;
        let man = b & 0x7f_ffff;
        if exp == 0xff {
            return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
        }
        let e = exp - 127 + 15;
        if e >= 0x1f {
            return sign | 0x7c00;
        }
        if e <= 0 {
            // Subnormal (or zero) in binary16: shift the full significand into place, rounding.
            if e < -10 {
                return sign;
            }
            let m = man | 0x80_0000;
            let shift = (14 - e) as u32;
            let half = 1u32 << (shift - 1);
            let rest = m & ((1 << shift) - 1);
            let mut v = m >> shift;
            if rest > half || (rest == half && v & 1 == 1) {
                v += 1;
            }
            return sign | v as u16;
        }
        let mut v = ((e as u32) << 10) | (man >> 13);
        let rest = man & 0x1fff;
        if rest > 0x1000 || (rest == 0x1000 && v & 1 == 1) {
            // A carry into the exponent is the correct rounding (up to inf at the top).
            v += 1;
        }
        sign | v as u16
    }

    /// binary16 bits → binary32 (exact).
    pub fn f16_value(h: u16) -> f32 {
        let sign = u32::from(h & 0x8000) << 16;
        let exp = u32::from((h >> 10) & 0x1f);
        let man = u32::from(h & 0x3ff);
        let bits = match (exp, man) {
            (0, 0) => sign,
            (0, _) => {
                // Subnormal: man · 2^-24, exact in binary32.
                let v = man as f32 * f32::from_bits(0x3380_0000);
                return if sign != 0 { -v } else { v };
            }
            (0x1f, 0) => sign | 0x7f80_0000,
            (0x1f, _) => sign | 0x7fc0_0000 | (man << 13),
            _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
        };
        f32::from_bits(bits)
    }

    #[test]
    fn f16_bits_equals_the_case_by_case_conversion() {
        // Every exponent and sign with a spread of significands (the rounding bits, ties and
        // their neighbours included), then a stride over every other pattern.
        let mut checked = 0u64;
        for sign in [0u32, 0x8000_0000] {
            for exp in 0..=255u32 {
                for man in [
                    0, 1, 0xfff, 0x1000, 0x1001, 0x2000, 0x3000, 0x7f_e000, 0x7f_f000, 0x7f_ffff,
                    0x40_0000, 0x40_1000, 0x55_5555,
                ] {
                    let x = f32::from_bits(sign | exp << 23 | man);
                    assert_eq!(f16_bits(x), reference_f16_bits(x), "{:#010x}", x.to_bits());
                    checked += 1;
                }
            }
        }
        for bits in (0..=u32::MAX).step_by(4099) {
            let x = f32::from_bits(bits);
            assert_eq!(f16_bits(x), reference_f16_bits(x), "{bits:#010x}");
            checked += 1;
        }
        assert!(checked > 1_000_000);
    }

    #[test]
    fn f16_value_is_exact_for_every_half() {
        for h in 0..=u16::MAX {
            let (sign, exp, man) = (h >> 15, (h >> 10) & 0x1f, u32::from(h & 0x3ff));
            let want = match exp {
                0 => man as f64 * 2f64.powi(-24),
                0x1f => f64::NAN,
                _ => (1.0 + man as f64 / 1024.0) * 2f64.powi(i32::from(exp) - 15),
            };
            let got = f16_value(h);
            let want = if sign == 1 { -want } else { want };
            if exp == 0x1f && man == 0 {
                assert_eq!(
                    got,
                    if sign == 1 {
                        f32::NEG_INFINITY
                    } else {
                        f32::INFINITY
                    }
                );
            } else if exp == 0x1f {
                // Quiet, with the half's payload and sign.
                let b = got.to_bits();
                assert_eq!(
                    b,
                    (u32::from(sign) << 31) | 0x7fc0_0000 | man << 13,
                    "{h:#06x}"
                );
            } else {
                assert_eq!(f64::from(got), want, "{h:#06x}");
                assert_eq!(got.is_sign_negative(), sign == 1, "{h:#06x}");
            }
        }
    }

    #[test]
    fn f16_round_trips_every_finite_value_and_rounds_to_nearest_even() {
        for h in 0..=u16::MAX {
            let v = f16_value(h);
            if v.is_nan() {
                assert!(f16_value(f16_bits(v)).is_nan());
            } else {
                assert_eq!(f16_bits(v), h, "{h:#06x} -> {v}");
            }
        }
        assert_eq!(f16_value(f16_bits(1.0 + 1.0 / 2048.0)), 1.0); // tie, down to even
        assert_eq!(f16_value(f16_bits(1.0 + 3.0 / 2048.0)), 1.0 + 1.0 / 512.0); // tie, up to even
        assert_eq!(f16_value(f16_bits(65520.0)), f32::INFINITY);
        assert_eq!(f16_value(f16_bits(65504.0)), 65504.0);
        assert_eq!(f16_value(f16_bits(2.0f32.powi(-25))), 0.0); // tie to zero
        assert_eq!(
            f16_value(f16_bits(3.0 * 2.0f32.powi(-26))),
            2.0f32.powi(-24)
        );
    }

    #[test]
    fn bf16_round_trips_and_rounds_to_nearest_even() {
        for h in (0..=u16::MAX).step_by(7) {
            let v = bf16_value(h);
            if !v.is_nan() {
                assert_eq!(bf16_bits(v), h);
            }
        }
        assert_eq!(bf16_value(bf16_bits(1.0 + 2.0f32.powi(-8))), 1.0);
        assert_eq!(
            bf16_value(bf16_bits(1.0 + 3.0 * 2.0f32.powi(-8))),
            1.0 + 2.0f32.powi(-6)
        );
        assert!(bf16_value(bf16_bits(f32::NAN)).is_nan());
    }

    #[test]
    fn floats_and_words_round_trip_through_little_endian_bytes() {
        let xs = [1.5f32, -0.0, f32::MIN_POSITIVE, 3.0e38, -7.25];
        let mut b = Vec::new();
        put_f32s(&mut b, &xs);
        assert_eq!(&b[..4], &1.5f32.to_le_bytes());
        assert_eq!(b.len(), 20);
        let back = f32s_from_le(&b);
        assert!(
            back.iter()
                .zip(&xs)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        let mut w = Vec::new();
        put_u32s(&mut w, &[1, 0x0102_0304]);
        assert_eq!(w, [1, 0, 0, 0, 4, 3, 2, 1]);
    }

    #[test]
    fn the_reader_names_what_is_missing() {
        let mut r = Reader::new(&[1, 0, 0, 0, 9]);
        assert_eq!(r.u32("count").unwrap(), 1);
        let e = r.f32("scale").unwrap_err();
        assert!(e.contains("scale needs 4 bytes at offset 4"), "{e}");
        let r = Reader::new(&[0; 3]);
        assert!(r.finish().unwrap_err().contains("3 trailing bytes"));
    }
}
