//! `lsgd-host bench codecs`: encode+decode throughput of each codec plugin through the sandbox
//! next to the same algorithm (the `lsgd-codec` crate the plugins are built from) compiled
//! natively into the host, as a ratio from one run, with the compression ratio each achieves.
//!
//! Both sides get the same bucket (a layer's weight and bias from
//! [`crate::codec::sample_bucket`]) and must produce the same payload bytes, which the table
//! shows: a ratio between two different computations would mean nothing. The WASM side
//! includes what the sandbox costs, copying the bucket into the instance and the payload and
//! reconstruction out. Rounds alternate between the two sides and the median is reported.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::codec::{native_round_trip, round_trip, sample_bucket};
use crate::plugin::Runtime;

/// The reference codecs: plugin file `codec-<name>`, describe() name `<name>`.
pub const REFERENCE_CODECS: [&str; 14] = lsgd_codec::NAMES;

/// The goal the issue sets: WASM at least this fraction of native on 1M-float buckets...
pub const GOAL: f64 = 0.9;
/// ... for these codecs.
pub const GOAL_CODECS: [&str; 2] = ["int8", "top-k"];

/// One codec at one bucket size.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// describe() name.
    pub codec: String,
    /// Floats per bucket.
    pub floats: usize,
    /// Native encode+decode throughput, GB/s of binary32 input.
    pub native_gb_s: f64,
    /// The same through the sandbox.
    pub wasm_gb_s: f64,
    /// wasm_gb_s / native_gb_s.
    pub ratio: f64,
    /// Input bytes / payload bytes.
    pub compression: f64,
    /// Payload bytes (all rounds).
    pub payload_bytes: usize,
    /// Whether the plugin's payload bytes equal the native build's.
    pub same_payload: bool,
}

/// The weight shape of a bucket of about `floats` floats: cols the largest power of two up to
/// √floats, so PowerSGD sees a near-square matrix, and rows such that weight plus bias (cols
/// more floats) make `floats` (exactly, for powers of two).
fn shape(floats: usize) -> (u32, u32) {
    let root = (floats as f64).sqrt().max(1.0) as u32;
    let cols = 1u32 << (31 - root.leading_zeros());
    let rows = ((floats as u32) / cols).saturating_sub(1).max(1);
    (rows, cols)
}

/// Measures every codec in `codecs` (describe() names of reference codecs) at each size.
pub fn run(
    runtime: &Runtime,
    codecs: &[String],
    sizes: &[usize],
    rounds: usize,
) -> Result<Vec<Measurement>> {
    // The allocator settings of `run`: without them every 4 MiB vector is a fresh mmap, and
    // page faults, not codecs, would dominate both sides.
    crate::train::tune_malloc();
    let mut out = Vec::new();
    for name in codecs {
        let file = format!("codec-{name}");
        let mut plugin = runtime.load_configured(&file, None, &[])?;
        let native = lsgd_codec::native(name, Vec::new())
            .with_context(|| format!("no native build of codec `{name}`"))?
            .map_err(anyhow::Error::msg)?;
        for &floats in sizes {
            let (rows, cols) = shape(floats);
            let (meta, data) = sample_bucket(rows, cols, 0, 1);
            let bytes = data.len() as f64 * 4.0;
            let (wasm_payloads, _) = round_trip(&mut plugin, &meta, &data)?;
            let (native_payloads, _) = native_round_trip(native.as_ref(), &meta, &data)?;
            let (mut t_native, mut t_wasm) = (Vec::new(), Vec::new());
            for _ in 0..rounds.max(1) {
                let start = Instant::now();
                std::hint::black_box(native_round_trip(native.as_ref(), &meta, &data)?);
                t_native.push(start.elapsed().as_secs_f64());
                let start = Instant::now();
                std::hint::black_box(round_trip(&mut plugin, &meta, &data)?);
                t_wasm.push(start.elapsed().as_secs_f64());
            }
            let (native_s, wasm_s) = (median(&mut t_native), median(&mut t_wasm));
            let payload_bytes = native_payloads.iter().map(Vec::len).sum::<usize>();
            out.push(Measurement {
                codec: name.clone(),
                floats: data.len(),
                native_gb_s: bytes / native_s / 1e9,
                wasm_gb_s: bytes / wasm_s / 1e9,
                ratio: native_s / wasm_s,
                compression: bytes / payload_bytes.max(1) as f64,
                payload_bytes,
                same_payload: wasm_payloads == native_payloads,
            });
        }
    }
    Ok(out)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Prints the table and the goal's verdict.
pub fn print_table(rows: &[Measurement], mut out: impl Write) -> Result<()> {
    writeln!(
        out,
        "{:<10} {:>10} {:>12} {:>12} {:>11} {:>12} {:>13}  same payload",
        "codec",
        "floats",
        "native GB/s",
        "wasm GB/s",
        "wasm/native",
        "compression",
        "payload bytes"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:<10} {:>10} {:>12.2} {:>12.2} {:>10.2}x {:>11.2}x {:>13}  {}",
            r.codec,
            r.floats,
            r.native_gb_s,
            r.wasm_gb_s,
            r.ratio,
            r.compression,
            r.payload_bytes,
            if r.same_payload { "yes" } else { "NO" }
        )?;
    }
    for name in GOAL_CODECS {
        // The goal is stated for 1M-float buckets: the size nearest 2^20 measured.
        let near = rows
            .iter()
            .filter(|r| r.codec == name)
            .min_by_key(|r| r.floats.abs_diff(1 << 20));
        if let Some(r) = near {
            writeln!(
                out,
                "goal: {name} at {} floats: wasm {:.2}x native ({} {GOAL}x)",
                r.floats,
                r.ratio,
                if r.ratio >= GOAL { "meets" } else { "below" }
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_shapes_are_near_square_and_near_the_size() {
        assert_eq!(shape(1 << 20), (1023, 1024));
        assert_eq!(shape(1 << 24), (4095, 4096));
        for floats in [1usize << 10, 1 << 21, 1000, 5_000_000] {
            let (rows, cols) = shape(floats);
            let total = (rows * cols + cols) as usize;
            assert!(
                total <= floats && total * 10 >= floats * 9,
                "{floats}: {rows}x{cols}"
            );
            assert!(
                rows + 1 >= cols && rows < cols * 4,
                "{floats}: {rows}x{cols}"
            );
        }
    }
}
