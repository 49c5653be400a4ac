//! A small convolutional net with BatchNorm: two conv–BN–ReLU–pool stages and a two-layer head
//! (421k parameters on 28×28 input).

use tch::Tensor;
use tch::nn::{self, Module, ModuleT};

use super::layers::{batch_norm, conv, linear};

/// Conv(32)–BN–ReLU–MaxPool, Conv(64)–BN–ReLU–MaxPool, Linear(128)–ReLU, Linear(classes).
#[derive(Debug)]
pub struct Cnn {
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    conv2: nn::Conv2D,
    bn2: nn::BatchNorm,
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl Cnn {
    /// Builds the layers under `p` for `channels × rows × cols` input.
    pub fn new(p: &nn::Path, channels: i64, rows: i64, cols: i64, classes: i64) -> Self {
        let flat = 64 * (rows / 4) * (cols / 4);
        Cnn {
            conv1: conv(p / "conv1", channels, 32, 3, 1),
            bn1: batch_norm(p / "bn1", 32, false),
            conv2: conv(p / "conv2", 32, 64, 3, 1),
            bn2: batch_norm(p / "bn2", 64, false),
            fc1: linear(p / "fc1", flat, 128),
            fc2: linear(p / "fc2", 128, classes),
        }
    }
}

impl ModuleT for Cnn {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let x = self.conv1.forward(xs).apply_t(&self.bn1, train).relu();
        let x = x.max_pool2d_default(2);
        let x = self.conv2.forward(&x).apply_t(&self.bn2, train).relu();
        let x = x.max_pool2d_default(2).flatten(1, -1);
        self.fc2.forward(&self.fc1.forward(&x).relu())
    }
}
