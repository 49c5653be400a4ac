//! A CIFAR-style residual net (He et al. 2016, §4.2) for small images: a 3×3 stem, three stages
//! of `n` basic blocks with 16, 32 and 64 channels (stride 2 entering the second and third),
//! global average pooling and a linear classifier; depth = 6n + 2 (ResNet-8, -14, -20 …).
//! Shortcuts that change shape are 1×1 convolutions with BatchNorm (option B).

use tch::Tensor;
use tch::nn::{self, Module, ModuleT};

use super::layers::{batch_norm, conv, linear};

/// Channels of the three stages.
const WIDTHS: [i64; 3] = [16, 32, 64];

#[derive(Debug)]
struct Block {
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    conv2: nn::Conv2D,
    bn2: nn::BatchNorm,
    shortcut: Option<(nn::Conv2D, nn::BatchNorm)>,
}

impl Block {
    fn new(p: &nn::Path, inputs: i64, outputs: i64, stride: i64, zero_gamma: bool) -> Self {
        let shortcut = (stride != 1 || inputs != outputs).then(|| {
            (
                conv(p / "shortcut_conv", inputs, outputs, 1, stride),
                batch_norm(p / "shortcut_bn", outputs, false),
            )
        });
        Block {
            conv1: conv(p / "conv1", inputs, outputs, 3, stride),
            bn1: batch_norm(p / "bn1", outputs, false),
            conv2: conv(p / "conv2", outputs, outputs, 3, 1),
            // Goyal et al. §5.1: γ = 0 in the last BN of each block makes every block start
            // as the identity, which eases optimisation early in large-batch training.
            bn2: batch_norm(p / "bn2", outputs, zero_gamma),
            shortcut,
        }
    }

    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let y = self.conv1.forward(xs).apply_t(&self.bn1, train).relu();
        let y = self.conv2.forward(&y).apply_t(&self.bn2, train);
        let skip = match &self.shortcut {
            Some((c, bn)) => c.forward(xs).apply_t(bn, train),
            None => xs.shallow_clone(),
        };
        (y + skip).relu()
    }
}

/// The residual net.
#[derive(Debug)]
pub struct ResNet {
    stem: nn::Conv2D,
    stem_bn: nn::BatchNorm,
    blocks: Vec<Block>,
    fc: nn::Linear,
}

impl ResNet {
    /// Builds a ResNet of `depth` = 6n + 2 layers under `p`.
    pub fn new(p: &nn::Path, channels: i64, classes: i64, depth: u32, zero_gamma: bool) -> Self {
        let n = (depth.saturating_sub(2) / 6).max(1);
        let mut blocks = Vec::new();
        let mut inputs = WIDTHS[0];
        for (stage, &width) in WIDTHS.iter().enumerate() {
            for i in 0..n {
                let stride = if stage > 0 && i == 0 { 2 } else { 1 };
                let bp = p / format!("layer{}", stage + 1) / i;
                blocks.push(Block::new(&bp, inputs, width, stride, zero_gamma));
                inputs = width;
            }
        }
        ResNet {
            stem: conv(p / "stem", channels, WIDTHS[0], 3, 1),
            stem_bn: batch_norm(p / "stem_bn", WIDTHS[0], false),
            blocks,
            fc: linear(p / "fc", inputs, classes),
        }
    }
}

impl ModuleT for ResNet {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut x = self.stem.forward(xs).apply_t(&self.stem_bn, train).relu();
        for b in &self.blocks {
            x = b.forward_t(&x, train);
        }
        self.fc
            .forward(&x.adaptive_avg_pool2d([1, 1]).flatten(1, -1))
    }
}
