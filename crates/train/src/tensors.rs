//! The data set as tensors on the training device: pixels scaled to [0, 1] and standardised
//! with the training split's own mean and standard deviation (so any `--data` set is
//! normalised correctly, not just Fashion-MNIST), labels as class indices.

use tch::{Device, Kind, Tensor};

use crate::data::{Dataset, Split};

/// One split on the device.
#[derive(Debug)]
pub struct SplitTensors {
    /// `[n, 1, rows, cols]` float images.
    pub images: Tensor,
    /// `[n]` int64 labels.
    pub labels: Tensor,
    /// Number of samples.
    pub len: usize,
}

/// Train and test splits on the device.
#[derive(Debug)]
pub struct DataTensors {
    /// Training split (possibly a subset).
    pub train: SplitTensors,
    /// Test split (possibly a subset).
    pub test: SplitTensors,
    /// `[channels, rows, cols]` of one image.
    pub image: [i64; 3],
    /// Number of classes.
    pub classes: i64,
}

impl DataTensors {
    /// Moves the first `train_subset` / `test_subset` samples (all when `None`) to `device`.
    pub fn new(
        data: &Dataset,
        train_subset: Option<usize>,
        test_subset: Option<usize>,
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
        let n_train = pick(&data.train, train_subset, "--train-subset")?;
        let n_test = pick(&data.test, test_subset, "--test-subset")?;
        let (rows, cols) = (data.train.rows as i64, data.train.cols as i64);
        let raw = |s: &Split, n: usize| {
            Tensor::from_slice(&s.images[..n * s.rows * s.cols])
                .view([n as i64, 1, rows, cols])
                .to_kind(Kind::Float)
                / 255.0
        };
        let train = raw(&data.train, n_train);
        let mean = train.mean(Kind::Float);
        let std = train.std(true).clamp_min(1e-6);
        let norm = |t: Tensor| ((t - &mean) / &std).to_device(device);
        let labels = |s: &Split, n: usize| {
            Tensor::from_slice(&s.labels[..n])
                .to_kind(Kind::Int64)
                .to_device(device)
        };
        Ok(DataTensors {
            train: SplitTensors {
                images: norm(train),
                labels: labels(&data.train, n_train),
                len: n_train,
            },
            test: SplitTensors {
                images: norm(raw(&data.test, n_test)),
                labels: labels(&data.test, n_test),
                len: n_test,
            },
            image: [1, rows, cols],
            classes: data.classes as i64,
        })
    }
}
