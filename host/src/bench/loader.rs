//! `lsgd-host bench loader`: can image decoding keep up with training? The loader alone
//! (decode, crop, resize, flip, standardise: the batches a run would take, a step ahead, on
//! `--loader-threads` threads) in images/s, against `lsgd-host run`'s samples/s on the same
//! images and model, measured in the same invocation. Without `--data-dir` it writes a
//! synthetic image folder of JPEGs first (ImageNet's typical 500×375).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use tch::Device;

use super::{TimedJob, timed_steps};
use crate::model::{Arch, ModelSpec, Shortcut};
use crate::policy::{Bounds, PolicySet};
use crate::precision::Precision;
use crate::train::augment::Augment;
use crate::train::data::{self, DatasetKind};
use crate::train::order::SampleOrder;
use crate::train::tensors::{DataSettings, DataTensors};
use crate::train::{self, Reporting, TrainConfig};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Setup {
    /// An image folder (`None`: a synthetic one of `images` JPEGs).
    pub data: Option<PathBuf>,
    /// Synthetic images to write when there is no `data`.
    pub images: usize,
    /// Side of the images made.
    pub image_size: u32,
    /// Training augmentation.
    pub augment: Augment,
    /// Decoding threads.
    pub loader_threads: usize,
    /// Global batch.
    pub batch: u32,
    /// Timed batches (loader) and steps (training).
    pub steps: u64,
    /// Untimed steps before them.
    pub warmup: u64,
    /// The network trained.
    pub model: Arch,
    /// ResNet depth.
    pub depth: u32,
    /// libtorch threads of the training run.
    pub threads: usize,
}

/// The measurements.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The loader alone, images/s over the timed batches.
    pub loader_images_per_s: f64,
    /// `lsgd-host run` on the same images, samples/s over its timed steps.
    pub train_samples_per_s: f64,
    /// loader / training: above 1 the loader keeps up with training.
    pub ratio: f64,
    /// Where the images came from.
    pub data: String,
}

/// Measures the loader, then a training run, on the same images.
pub fn run(setup: &Setup) -> Result<Report> {
    let scratch = std::env::temp_dir().join(format!("lsgd-bench-loader-{}", std::process::id()));
    let dir = match &setup.data {
        Some(d) => d.clone(),
        None => {
            synthetic_folder(&scratch.join("images"), setup.images)?;
            scratch.join("images")
        }
    };
    let dataset = data::load(DatasetKind::Imagefolder, &dir)?;
    let settings = DataSettings {
        train_subset: None,
        test_subset: Some(1),
        augment: setup.augment,
        image_size: setup.image_size as usize,
        seed: 0,
        loader_threads: setup.loader_threads,
    };
    let mut tensors = DataTensors::new(&dataset, &settings, Device::Cpu)?;
    let mut order = SampleOrder::new(0, dataset.train.len);
    let b = setup.batch as u64;
    let mut started = Instant::now();
    for step in 0..setup.warmup + setup.steps {
        if step == setup.warmup {
            started = Instant::now();
        }
        // As the trainer does: this step's samples and, a step ahead, the next step's.
        let now = order.take(step * b, b as usize);
        let next = order.take((step + 1) * b, b as usize);
        tensors.prefetch_train(&now, step * b);
        tensors.prefetch_train(&next, (step + 1) * b);
        let _batch = tensors.train_batch(&now, step * b)?;
    }
    let loader = (setup.steps * b) as f64 / started.elapsed().as_secs_f64();
    drop(tensors);
    let config = train_config(setup, &dir, &scratch.join("run"));
    train::run(
        &config,
        PolicySet::new(Vec::new(), Bounds::default())?,
        None,
        Reporting { quiet: true },
    )?;
    let trained = timed_steps(&config.invocation.out.join("metrics.jsonl"), setup.warmup)?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(Report {
        loader_images_per_s: loader,
        train_samples_per_s: trained.samples_per_s,
        ratio: loader / trained.samples_per_s,
        data: match &setup.data {
            Some(d) => d.display().to_string(),
            None => format!("{} synthetic 500×375 JPEGs", setup.images),
        },
    })
}

/// The training run timed against the loader: the bench's model on the same folder.
fn train_config(setup: &Setup, data: &Path, out: &Path) -> TrainConfig {
    TimedJob {
        device: crate::train::DeviceChoice::Cpu,
        model: ModelSpec {
            arch: setup.model,
            depth: setup.depth,
            zero_init_residual: false,
            shortcut: Shortcut::A,
            script: None,
        },
        dataset: DatasetKind::Imagefolder,
        data,
        augment: setup.augment,
        image_size: setup.image_size,
        loader_threads: setup.loader_threads,
        batch: setup.batch,
        threads: setup.threads,
        precision: Precision::Fp32,
        steps: setup.warmup + setup.steps,
        out,
    }
    .config()
}

/// Writes `n` 500×375 JPEGs in two classes under `dir/train` (and one in each class under
/// `dir/val`): smooth gradients with noise, so they compress like photographs rather than
/// like flat colour.
pub fn synthetic_folder(dir: &Path, n: usize) -> Result<()> {
    let (w, h) = (500u32, 375u32);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 56) as u8 / 8
    };
    for (split, count) in [("train", n), ("val", 2)] {
        for i in 0..count {
            let class = format!("class{}", i % 2);
            let folder = dir.join(split).join(&class);
            std::fs::create_dir_all(&folder)
                .with_context(|| format!("cannot create {}", folder.display()))?;
            let img = image::RgbImage::from_fn(w, h, |x, y| {
                let k = i as u32 * 37;
                image::Rgb([
                    ((x + k) % 256) as u8 ^ noise(),
                    ((y * 2 + k) % 256) as u8 ^ noise(),
                    (((x + y) / 3 + k) % 256) as u8 ^ noise(),
                ])
            });
            let path = folder.join(format!("{i:05}.jpg"));
            img.save(&path)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    Ok(())
}

/// The human-readable report.
pub fn print(setup: &Setup, r: &Report, mut out: impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "bench loader: {}, {}×{} images, augment {}, batch {}, {} loader thread(s), {} timed steps after {}",
        r.data,
        setup.image_size,
        setup.image_size,
        setup.augment,
        setup.batch,
        setup.loader_threads,
        setup.steps,
        setup.warmup
    )?;
    writeln!(
        out,
        "  loader alone                        {:>9.1} images/s",
        r.loader_images_per_s
    )?;
    writeln!(
        out,
        "  lsgd-host run ({}{}, {} thread(s)) {:>9.1} samples/s",
        setup.model,
        if setup.model == Arch::Resnet {
            format!("-{}", setup.depth)
        } else {
            String::new()
        },
        setup.threads,
        r.train_samples_per_s
    )?;
    writeln!(
        out,
        "  loader / training                   {:>9.2}×   (above 1: decoding keeps up)",
        r.ratio
    )
}
