//! The data set as the model sees it: batches of images standardised per channel, augmented
//! for training, with labels as class indices. In-memory data sets live on the training device
//! as raw pixels (bytes stay bytes) and are scaled, augmented and standardised batch by batch;
//! image folders are decoded by a [`FileLoader`] a step ahead.
//!
//! Standardisation uses the training split's own per-channel mean and standard deviation, so
//! any data set is normalised correctly, not just Fashion-MNIST; image folders use ImageNet's
//! constants, since their statistics would take a pass decoding every image.

use tch::{Device, Kind, Tensor};

use crate::augment::{self, Augment, SampleRng};
use crate::data::{Dataset, Images, Split};
use crate::loader::{FileLoader, Key, Transform};

/// How the data becomes batches: the run's settings that shape the tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSettings {
    /// Train on the first N samples only.
    pub train_subset: Option<usize>,
    /// Evaluate on the first N samples only.
    pub test_subset: Option<usize>,
    /// Training augmentation.
    pub augment: Augment,
    /// Side of the square images made from image files.
    pub image_size: usize,
    /// The run's seed: augmentation draws derive from it.
    pub seed: u64,
    /// Threads decoding image files.
    pub loader_threads: usize,
}

/// Where a split's pixels are.
#[derive(Debug)]
enum Pixels {
    /// `[n, c, h, w]` raw pixels on the device: u8 (scaled to [0, 1] per batch) or f32.
    Memory(Tensor),
    /// Image files, decoded to `[3, size, size]` in [0, 1] by the loader.
    Files(FileLoader),
}

/// One split on the device.
#[derive(Debug)]
pub struct SplitTensors {
    pixels: Pixels,
    /// `[n]` int64 labels.
    pub labels: Tensor,
    /// Number of samples.
    pub len: usize,
}

/// Train and test splits, and how their batches are made.
#[derive(Debug)]
pub struct DataTensors {
    /// Training split (possibly a subset).
    pub train: SplitTensors,
    /// Test split (possibly a subset).
    pub test: SplitTensors,
    /// `[channels, rows, cols]` of one image as the model sees it.
    pub image: [i64; 3],
    /// Number of classes.
    pub classes: i64,
    /// `[1, c, 1, 1]` per-channel mean and standard deviation of the raw pixels.
    mean: Tensor,
    std: Tensor,
    augment: Augment,
    seed: u64,
    device: Device,
}

impl DataTensors {
    /// Moves the first `train_subset` / `test_subset` samples (all when `None`) to `device`,
    /// or sets up the loaders of image files.
    pub fn new(
        data: &Dataset,
        settings: &DataSettings,
        device: Device,
    ) -> Result<Self, crate::Error> {
        let pick = |split: &Split, subset: Option<usize>, flag: &str| match subset {
            Some(0) => Err(crate::Error::Config(format!("{flag} must be at least 1"))),
            Some(n) if n > split.len => Err(crate::Error::Config(format!(
                "{flag} {n} is larger than the split ({} samples)",
                split.len
            ))),
            Some(n) => Ok(n),
            None => Ok(split.len),
        };
        let n_train = pick(&data.train, settings.train_subset, "--train-subset")?;
        let n_test = pick(&data.test, settings.test_subset, "--test-subset")?;
        let files = matches!(data.train.images, Images::Files(_));
        if settings.augment == Augment::Imagenet && !files {
            return Err(crate::Error::Config(
                "--augment imagenet crops image files (--dataset imagefolder); data sets held \
                 in memory take --augment cifar or none"
                    .into(),
            ));
        }
        let size = settings.image_size;
        let split = |s: &Split, n: usize| -> Result<SplitTensors, crate::Error> {
            let labels: Vec<i64> = s.labels[..n].iter().map(|&l| i64::from(l)).collect();
            let shape = [n as i64, s.channels as i64, s.rows as i64, s.cols as i64];
            let per = s.channels * s.rows * s.cols;
            let pixels = match &s.images {
                Images::U8(px) => Pixels::Memory(
                    Tensor::from_slice(&px[..n * per])
                        .view(shape)
                        .to_device(device),
                ),
                Images::F32(px) => Pixels::Memory(
                    Tensor::from_slice(&px[..n * per])
                        .view(shape)
                        .to_device(device),
                ),
                Images::Files(paths) => Pixels::Files(FileLoader::new(
                    paths[..n].to_vec(),
                    size,
                    settings.loader_threads,
                )),
            };
            Ok(SplitTensors {
                pixels,
                labels: Tensor::from_slice(&labels).to_device(device),
                len: n,
            })
        };
        let train = split(&data.train, n_train)?;
        let test = split(&data.test, n_test)?;
        let (mean, std, image) = match &train.pixels {
            Pixels::Memory(raw) => {
                let (mean, std) = augment::channel_stats(&unit(raw));
                let s = &data.train;
                (mean, std, [s.channels as i64, s.rows as i64, s.cols as i64])
            }
            Pixels::Files(_) => {
                let shape = [1, 3, 1, 1];
                (
                    Tensor::from_slice(&augment::IMAGENET_MEAN).view(shape),
                    Tensor::from_slice(&augment::IMAGENET_STD).view(shape),
                    [3, size as i64, size as i64],
                )
            }
        };
        Ok(DataTensors {
            train,
            test,
            image,
            classes: data.classes as i64,
            mean: mean.to_device(device),
            std: std.to_device(device),
            augment: settings.augment,
            seed: settings.seed,
            device,
        })
    }

    /// Whether the images come from files (and so gain from a head start).
    pub fn from_files(&self) -> bool {
        matches!(self.train.pixels, Pixels::Files(_))
    }

    /// Starts making the training samples `indices`, the first at stream position `first`, if
    /// they come from files (a guess at the next step's batch; memory needs no head start).
    pub fn prefetch_train(&mut self, indices: &[i64], first: u64) {
        let keys = self.train_keys(indices, first);
        if let Pixels::Files(loader) = &mut self.train.pixels {
            loader.request(&keys);
        }
    }

    /// A training micro-batch: the samples `indices`, the first at stream position `first`,
    /// augmented and standardised, and their labels.
    pub fn train_batch(
        &mut self,
        indices: &[i64],
        first: u64,
    ) -> Result<(Tensor, Tensor), crate::Error> {
        let idx = Tensor::from_slice(indices).to_device(self.device);
        let keys = self.train_keys(indices, first);
        let raw = match &mut self.train.pixels {
            Pixels::Memory(all) => unit(&all.index_select(0, &idx)),
            Pixels::Files(loader) => loader.take(&keys)?.to_device(self.device),
        };
        let raw = match self.augment {
            Augment::Cifar => {
                let draws: Vec<_> = (0..indices.len() as u64)
                    .map(|i| augment::cifar_draws(&mut SampleRng::new(self.seed, first + i)))
                    .collect();
                augment::pad_crop_flip(&raw, &draws)
            }
            Augment::None | Augment::Imagenet => raw,
        };
        Ok((
            self.standardise(&raw),
            self.train.labels.index_select(0, &idx),
        ))
    }

    /// Starts decoding test samples `start .. start + len` if they come from files.
    pub fn prefetch_test(&mut self, start: usize, len: usize) {
        if let Pixels::Files(loader) = &mut self.test.pixels {
            loader.request(&eval_keys(start, len));
        }
    }

    /// Test samples `start .. start + len`, standardised, and their labels.
    pub fn test_batch(
        &mut self,
        start: usize,
        len: usize,
    ) -> Result<(Tensor, Tensor), crate::Error> {
        let raw = match &mut self.test.pixels {
            Pixels::Memory(all) => unit(&all.narrow(0, start as i64, len as i64)),
            Pixels::Files(loader) => loader.take(&eval_keys(start, len))?.to_device(self.device),
        };
        let labels = self.test.labels.narrow(0, start as i64, len as i64);
        Ok((self.standardise(&raw), labels))
    }

    /// The loader keys of training samples (only image files use them).
    fn train_keys(&self, indices: &[i64], first: u64) -> Vec<Key> {
        if !matches!(self.train.pixels, Pixels::Files(_)) {
            return Vec::new();
        }
        indices
            .iter()
            .zip(first..)
            .map(|(&index, position)| Key {
                index: index as usize,
                transform: match self.augment {
                    Augment::Imagenet => Transform::RandomResizedCrop {
                        seed: self.seed,
                        position,
                    },
                    // CIFAR's crop and flip come after, on the batch tensor.
                    Augment::None | Augment::Cifar => Transform::Eval,
                },
            })
            .collect()
    }

    /// Raw pixels to standardised ones.
    fn standardise(&self, raw: &Tensor) -> Tensor {
        (raw - &self.mean) / &self.std
    }
}

/// The evaluation keys of test samples `start .. start + len`.
fn eval_keys(start: usize, len: usize) -> Vec<Key> {
    (start..start + len)
        .map(|index| Key {
            index,
            transform: Transform::Eval,
        })
        .collect()
}

/// Raw pixels as floats: bytes scaled to [0, 1] (as `ToTensor`), floats as they are.
fn unit(raw: &Tensor) -> Tensor {
    match raw.kind() {
        Kind::Uint8 => raw.to_kind(Kind::Float) / 255.0,
        _ => raw.shallow_clone(),
    }
}
