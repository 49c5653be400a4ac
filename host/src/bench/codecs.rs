//! `lsgd-host bench codecs`: encode+decode throughput of each codec plugin through the sandbox
//! next to the same algorithm (the `lsgd-codec` crate the plugins are built from) compiled
//! natively into the host, as a ratio from one run, with the compression ratio each achieves.
//!
//! Both sides get the same bucket (a layer's weight and bias from
//! [`crate::codec::sample_bucket`]) and must produce the same payload bytes, which the table
//! shows: a ratio between two different computations would mean nothing. The WASM side
//! includes what the sandbox costs, copying the bucket into the instance and the payload and
//! reconstruction out. A stateful codec (PowerSGD's warm start) runs a whole step: from the
//! state one earlier step left (its Q), which every call copies in, through `next-state`.
//! Rounds alternate between the sides and the median is reported.
//!
//! More figures come from the same rounds: the plugin compiled with canonical NaNs (as
//! policies are, and codecs with `--codec-canonical-nans`); compiled with fuel and epoch
//! checks (the deterministic budget and its wall-clock backstop), with epoch checks only, and
//! with neither, which together say what bounding a call costs; the most fuel a call used per
//! float it handled, which `--codec-fuel-per-float`'s default is chosen from; and the ceiling
//! the canonical ABI's copies put on the ratio: each round trip copies the bucket in, the
//! payload out, the payload in and the reconstruction out, so even a guest as fast as native
//! code cannot beat native / (native + those copies), timed here as host memcpy into mapped
//! buffers.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

use super::stats::median;
use crate::codec::{native_step, sample_bucket, single_rank, step};
use crate::exchange::BucketCodec;
use crate::plugin::runtime::Metering;
use crate::plugin::{EngineOptions, Plugin, PluginError, Runtime};
use lsgd_codec::{DynCodec, Meta};

/// The reference codecs: plugin file `codec-<name>`, describe() name `<name>`.
pub const REFERENCE_CODECS: [&str; 14] = lsgd_codec::NAMES;

/// The goal for the codecs in [`FAST_CODECS`]: WASM at least this fraction of native...
pub const FAST_GOAL: f64 = 0.9;
/// ... for the baseline and the two codecs most used in practice.
pub const FAST_CODECS: [&str; 3] = ["identity", "int8", "top-k"];
/// The goal for every other codec.
pub const GOAL: f64 = 0.6;

/// The ratio a codec's row should reach.
pub fn goal(codec: &str) -> f64 {
    if FAST_CODECS.contains(&codec) {
        FAST_GOAL
    } else {
        GOAL
    }
}

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
    /// The same ratio with the plugin compiled with canonical NaNs.
    pub canonical_nan_ratio: f64,
    /// The same ratio with the plugin compiled with fuel and epoch checks.
    pub fuel_ratio: f64,
    /// The same ratio with the plugin compiled with epoch checks only.
    pub epoch_only_ratio: f64,
    /// The same ratio with the plugin compiled with neither.
    pub unmetered_ratio: f64,
    /// The most fuel an encode or decode call used per float it handled (bucket plus input
    /// payloads), over and above nothing: the base is not subtracted.
    pub fuel_per_float: f64,
    /// The best ratio the boundary's copies allow: native time over native time plus the
    /// time of copying the bucket twice, the payload twice and a stateful codec's state once
    /// per call and once out.
    pub copy_ceiling: f64,
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
    let variants = Variants::new(runtime)?;
    let mut out = Vec::new();
    for name in codecs {
        let mut builds = variants.load(name)?;
        for &floats in sizes {
            out.push(builds.measure(floats, rounds)?);
        }
    }
    Ok(out)
}

/// The runtimes a codec is loaded in: the given one (the plugin as training runs it), one
/// with canonical NaNs, and one per metering other than the given one's.
struct Variants<'a> {
    runtime: &'a Runtime,
    canonical: Runtime,
    metered: Vec<(Metering, Runtime)>,
}

impl<'a> Variants<'a> {
    fn new(runtime: &'a Runtime) -> Result<Self> {
        let variant =
            |options| Runtime::with_options(runtime.cache().clone(), runtime.limits(), options);
        let canonical = variant(EngineOptions {
            canonical_codec_nans: true,
            ..runtime.options()
        })?;
        // The meterings other than the runtime's own, which the plugin as training runs it
        // stands in for.
        let own = runtime.options().codec_metering;
        let meterings = [
            Metering::FuelAndDeadline,
            Metering::Deadline,
            Metering::Unmetered,
        ];
        let metered = meterings
            .iter()
            .filter(|&&m| m != own)
            .map(|&codec_metering| {
                let options = EngineOptions {
                    codec_metering,
                    ..runtime.options()
                };
                Ok((codec_metering, variant(options)?))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Variants {
            runtime,
            canonical,
            metered,
        })
    }

    /// Codec `name` in each runtime, and its native build.
    fn load(&self, name: &str) -> Result<Builds> {
        let file = format!("codec-{name}");
        let plugin = self.runtime.load_configured(&file, None, &[])?;
        let canonical = self.canonical.load_configured(&file, None, &[])?;
        let others = self
            .metered
            .iter()
            .map(|(m, rt)| Ok((*m, rt.load_configured(&file, None, &[])?)))
            .collect::<Result<Vec<_>>>()?;
        let native = lsgd_codec::native(name, Vec::new())
            .with_context(|| format!("no native build of codec `{name}`"))?
            .map_err(anyhow::Error::msg)?;
        Ok(Builds {
            name: name.to_string(),
            plugin,
            canonical,
            others,
            native,
        })
    }
}

/// One codec in every build that is timed.
struct Builds {
    name: String,
    /// As training runs it.
    plugin: Plugin,
    /// Compiled with canonical NaNs.
    canonical: Plugin,
    /// Under the other meterings.
    others: Vec<(Metering, Plugin)>,
    native: Box<dyn DynCodec>,
}

/// The seconds of each round, per build.
struct Times {
    native: Vec<f64>,
    wasm: Vec<f64>,
    canonical: Vec<f64>,
    /// In the order of [`Builds::others`].
    others: Vec<Vec<f64>>,
}

impl Builds {
    /// The codec on a bucket of about `floats` floats, timed over `rounds` rounds.
    fn measure(&mut self, floats: usize, rounds: usize) -> Result<Measurement> {
        let (rows, cols) = shape(floats);
        let (first, data) = sample_bucket(rows, cols, 0, 1);
        // A stateful codec starts from the state a step before left; others from none.
        let meta = Meta {
            state: native_step(self.native.as_ref(), &first, &data)?.1,
            ..first
        };
        let bytes = data.len() as f64 * 4.0;
        let ((wasm_payloads, _), _) = step(&mut self.plugin, &meta, &data)?;
        let ((canonical_payloads, _), _) = step(&mut self.canonical, &meta, &data)?;
        let mut payloads = vec![wasm_payloads, canonical_payloads];
        let mut fuel_per_float = fuel_round_trip(&mut self.plugin, &meta, &data)?;
        for (_, other) in &mut self.others {
            payloads.push(step(other, &meta, &data)?.0.0);
            fuel_per_float = fuel_per_float.max(fuel_round_trip(other, &meta, &data)?);
        }
        let ((native_payloads, _), _) = native_step(self.native.as_ref(), &meta, &data)?;
        let payload_bytes = native_payloads.iter().map(Vec::len).sum::<usize>();
        let t = self.time(&meta, &data, rounds)?;
        let (native_s, wasm_s) = (median(t.native), median(t.wasm));
        let ratio_of = |metering| match self.others.iter().position(|(m, _)| *m == metering) {
            Some(i) => native_s / median(t.others[i].iter().copied()),
            None => native_s / wasm_s,
        };
        // A stateful codec's state goes in with every call (each round's encode, decode,
        // next-state) and its next state comes out.
        let state_copies = f64::from(self.native.properties().rounds) + 3.0;
        let copies_s = copy_seconds(data.len() * 4, rounds) * 2.0
            + copy_seconds(payload_bytes, rounds) * 2.0
            + copy_seconds(meta.state.len(), rounds) * state_copies;
        Ok(Measurement {
            codec: self.name.clone(),
            floats: data.len(),
            native_gb_s: bytes / native_s / 1e9,
            wasm_gb_s: bytes / wasm_s / 1e9,
            ratio: native_s / wasm_s,
            canonical_nan_ratio: native_s / median(t.canonical),
            fuel_ratio: ratio_of(Metering::FuelAndDeadline),
            epoch_only_ratio: ratio_of(Metering::Deadline),
            unmetered_ratio: ratio_of(Metering::Unmetered),
            fuel_per_float,
            copy_ceiling: native_s / (native_s + copies_s),
            compression: bytes / payload_bytes.max(1) as f64,
            payload_bytes,
            same_payload: payloads.iter().all(|p| *p == native_payloads),
        })
    }

    /// Times a step of every build `rounds` times, the builds in turn within a round, so that
    /// a slow spell of the machine touches each alike.
    fn time(&mut self, meta: &Meta, data: &[f32], rounds: usize) -> Result<Times> {
        let mut t = Times {
            native: Vec::new(),
            wasm: Vec::new(),
            canonical: Vec::new(),
            others: vec![Vec::new(); self.others.len()],
        };
        for _ in 0..rounds.max(1) {
            let start = Instant::now();
            std::hint::black_box(native_step(self.native.as_ref(), meta, data)?);
            t.native.push(start.elapsed().as_secs_f64());
            let start = Instant::now();
            std::hint::black_box(step(&mut self.plugin, meta, data)?);
            t.wasm.push(start.elapsed().as_secs_f64());
            let start = Instant::now();
            std::hint::black_box(step(&mut self.canonical, meta, data)?);
            t.canonical.push(start.elapsed().as_secs_f64());
            for ((_, other), times) in self.others.iter_mut().zip(&mut t.others) {
                let start = Instant::now();
                std::hint::black_box(step(other, meta, data)?);
                times.push(start.elapsed().as_secs_f64());
            }
        }
        Ok(t)
    }
}

/// A round trip through `codec` (as [`crate::codec::round_trip`]) that returns the most fuel one of its
/// calls used per float it handled; 0 when its engine does not count fuel.
fn fuel_round_trip(codec: &mut Plugin, meta: &Meta, data: &[f32]) -> Result<f64, PluginError> {
    let properties = codec.properties()?;
    let mut fuel = Fuel { codec, most: 0.0 };
    single_rank(&mut fuel, properties, meta, data)?;
    Ok(fuel.most)
}

/// A codec whose `encode` and `decode` note the fuel they used per float handled (the bucket's
/// and the payloads' they were given).
struct Fuel<'a> {
    codec: &'a mut Plugin,
    most: f64,
}

impl Fuel<'_> {
    fn note(&mut self, floats: usize, payloads: &[Vec<u8>]) {
        let handled = (floats + payloads.iter().map(Vec::len).sum::<usize>() / 4) as f64;
        let per_float = self.codec.last_fuel().unwrap_or(0) as f64 / handled;
        self.most = self.most.max(per_float);
    }
}

impl BucketCodec for Fuel<'_> {
    type Error = PluginError;
    fn encode(
        &mut self,
        meta: &Meta,
        data: &[f32],
        agreed: &[Vec<u8>],
    ) -> Result<Vec<u8>, PluginError> {
        let payload = self.codec.encode(meta, data, agreed)?;
        self.note(data.len(), agreed);
        Ok(payload)
    }
    fn decode(&mut self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, PluginError> {
        let out = self.codec.decode(meta, payloads)?;
        self.note(meta.len as usize, payloads);
        Ok(out)
    }
    fn next_state(&mut self, meta: &Meta, agreed: &[Vec<u8>]) -> Result<Vec<u8>, PluginError> {
        self.codec.next_state(meta, agreed)
    }
}

/// The median time of copying `bytes` bytes into a buffer whose pages are already mapped, as
/// lowering into a guest's memory does: the cheapest a boundary copy can be, so the ceiling
/// built from it is an upper bound (lifting into a fresh host buffer can cost more).
fn copy_seconds(bytes: usize, rounds: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    median((0..rounds.max(1)).map(|_| {
        let start = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        start.elapsed().as_secs_f64()
    }))
}

/// Prints the table and the goal's verdict.
pub fn print_table(rows: &[Measurement], mut out: impl Write) -> Result<()> {
    writeln!(
        out,
        "{:<10} {:>10} {:>12} {:>12} {:>11} {:>10} {:>11} {:>11} {:>9} {:>11} {:>13} {:>12} {:>13}  same payload",
        "codec",
        "floats",
        "native GB/s",
        "wasm GB/s",
        "wasm/native",
        "canon NaN",
        "fuel+epoch",
        "epoch only",
        "neither",
        "fuel/float",
        "copy ceiling",
        "compression",
        "payload bytes"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:<10} {:>10} {:>12.2} {:>12.2} {:>10.2}x {:>9.2}x {:>10.2}x {:>10.2}x {:>8.2}x {:>11.1} {:>12.2}x {:>11.2}x {:>13}  {}",
            r.codec,
            r.floats,
            r.native_gb_s,
            r.wasm_gb_s,
            r.ratio,
            r.canonical_nan_ratio,
            r.fuel_ratio,
            r.epoch_only_ratio,
            r.unmetered_ratio,
            r.fuel_per_float,
            r.copy_ceiling,
            r.compression,
            r.payload_bytes,
            if r.same_payload { "yes" } else { "NO" }
        )?;
    }
    let below: Vec<String> = rows
        .iter()
        .filter(|r| r.ratio < goal(&r.codec))
        .map(|r| format!("{} at {} floats ({:.2}x)", r.codec, r.floats, r.ratio))
        .collect();
    writeln!(
        out,
        "goal: wasm >= {FAST_GOAL}x native for {} and >= {GOAL}x for the others: {} of {} rows meet it{}{}",
        FAST_CODECS.join(", "),
        rows.len() - below.len(),
        rows.len(),
        if below.is_empty() { "" } else { "; below: " },
        below.join(", ")
    )?;
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
