//! A CIFAR-style residual net (He et al. 2016, §4.2) for small images: a 3×3 stem, three stages
//! of `n` basic blocks with 16, 32 and 64 channels (stride 2 entering the second and third),
//! global average pooling and a linear classifier; depth = 6n + 2 (ResNet-8, -14, -20 …).
//! Where a block changes the shape, its shortcut is He et al.'s option A (the identity,
//! subsampled and zero-padded: no parameters, the paper's CIFAR nets, 269,722 parameters for
//! ResNet-20 on CIFAR-10) or option B (a 1×1 convolution with BatchNorm, 272,474).

use tch::Tensor;
use tch::nn::{self, Module, ModuleT};

use super::Shortcut;
use super::layers::{batch_norm, conv, linear};

/// Channels of the three stages.
const WIDTHS: [i64; 3] = [16, 32, 64];

/// What a block adds to its residual branch.
#[derive(Debug)]
enum Skip {
    /// The input unchanged (same shape).
    Identity,
    /// Option A: every `stride`-th pixel of the input, with `before` and `after` zero channels
    /// around it, as `F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, planes // 4, planes // 4))` in the
    /// widely used CIFAR implementation.
    Pad {
        stride: i64,
        before: i64,
        after: i64,
    },
    /// Option B: a strided 1×1 convolution and BatchNorm.
    Projection(Box<(nn::Conv2D, nn::BatchNorm)>),
}

#[derive(Debug)]
struct Block {
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    conv2: nn::Conv2D,
    bn2: nn::BatchNorm,
    skip: Skip,
}

impl Block {
    fn new(
        p: &nn::Path,
        (inputs, outputs): (i64, i64),
        stride: i64,
        zero_gamma: bool,
        shortcut: Shortcut,
    ) -> Self {
        let skip = match shortcut {
            _ if stride == 1 && inputs == outputs => Skip::Identity,
            Shortcut::A => {
                let added = outputs - inputs;
                Skip::Pad {
                    stride,
                    before: added / 2,
                    after: added - added / 2,
                }
            }
            Shortcut::B => Skip::Projection(Box::new((
                conv(p / "shortcut_conv", inputs, outputs, 1, stride),
                batch_norm(p / "shortcut_bn", outputs, false),
            ))),
        };
        Block {
            conv1: conv(p / "conv1", inputs, outputs, 3, stride),
            bn1: batch_norm(p / "bn1", outputs, false),
            conv2: conv(p / "conv2", outputs, outputs, 3, 1),
            // Goyal et al. §5.1: γ = 0 in the last BN of each block makes every block start
            // as the identity, which eases optimisation early in large-batch training.
            bn2: batch_norm(p / "bn2", outputs, zero_gamma),
            skip,
        }
    }

    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let y = self.conv1.forward(xs).apply_t(&self.bn1, train).relu();
        let y = self.conv2.forward(&y).apply_t(&self.bn2, train);
        let skip = match &self.skip {
            Skip::Identity => xs.shallow_clone(),
            Skip::Pad {
                stride,
                before,
                after,
            } => pad_shortcut(xs, *stride, *before, *after),
            Skip::Projection(projection) => {
                let (c, bn) = projection.as_ref();
                c.forward(xs).apply_t(bn, train)
            }
        };
        (y + skip).relu()
    }
}

/// Option A's shortcut: `xs[:, :, ::stride, ::stride]` with `before` zero channels in front
/// and `after` behind.
fn pad_shortcut(xs: &Tensor, stride: i64, before: i64, after: i64) -> Tensor {
    xs.slice(2, 0, None, stride)
        .slice(3, 0, None, stride)
        .constant_pad_nd([0, 0, 0, 0, before, after])
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
    pub fn new(
        p: &nn::Path,
        channels: i64,
        classes: i64,
        depth: u32,
        zero_gamma: bool,
        shortcut: Shortcut,
    ) -> Self {
        let n = (depth.saturating_sub(2) / 6).max(1);
        let mut blocks = Vec::new();
        let mut inputs = WIDTHS[0];
        for (stage, &width) in WIDTHS.iter().enumerate() {
            for i in 0..n {
                let stride = if stage > 0 && i == 0 { 2 } else { 1 };
                let bp = p / format!("layer{}", stage + 1) / i;
                blocks.push(Block::new(
                    &bp,
                    (inputs, width),
                    stride,
                    zero_gamma,
                    shortcut,
                ));
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

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;

    /// Trainable parameters and all variable names of a ResNet on `[3, 32, 32]` images.
    fn build(depth: u32, shortcut: Shortcut) -> (ResNet, i64, Vec<String>) {
        let vs = nn::VarStore::new(Device::Cpu);
        let net = ResNet::new(&vs.root(), 3, 10, depth, false, shortcut);
        let params = vs
            .trainable_variables()
            .iter()
            .map(Tensor::numel)
            .sum::<usize>();
        let names = vs.variables().into_keys().collect();
        (net, params as i64, names)
    }

    // The counts are those of a PyTorch reference (He et al.'s CIFAR ResNet with
    // `F.pad(x[:, :, ::2, ::2], …)` for option A, a 1×1 conv + BN for option B), computed with
    // torch 2.13; 0.27M is the paper's figure for ResNet-20.
    #[test]
    fn parameter_counts_match_pytorch() {
        for (depth, a, b) in [(20, 269_722, 272_474), (32, 464_154, 466_906)] {
            assert_eq!(build(depth, Shortcut::A).1, a, "ResNet-{depth} option A");
            assert_eq!(build(depth, Shortcut::B).1, b, "ResNet-{depth} option B");
        }
    }

    #[test]
    fn option_a_has_no_shortcut_variables_and_classifies() {
        let (net, _, names) = build(20, Shortcut::A);
        assert!(!names.iter().any(|n| n.contains("shortcut")), "{names:?}");
        let (_, _, b_names) = build(20, Shortcut::B);
        // Two shape changes, each a conv weight and BN γ, β, mean, variance.
        assert_eq!(b_names.len() - names.len(), 10);
        let xs = Tensor::randn([4, 3, 32, 32], (Kind::Float, Device::Cpu));
        assert_eq!(net.forward_t(&xs, true).size(), [4, 10]);
        assert_eq!(net.forward_t(&xs, false).size(), [4, 10]);
        // Fashion-MNIST's 28 × 28 halves to 14 and 7 in both branches.
        let vs = nn::VarStore::new(Device::Cpu);
        let net = ResNet::new(&vs.root(), 1, 10, 8, false, Shortcut::A);
        let xs = Tensor::randn([2, 1, 28, 28], (Kind::Float, Device::Cpu));
        assert_eq!(net.forward_t(&xs, true).size(), [2, 10]);
    }

    #[test]
    fn option_a_subsamples_and_pads_channels_on_both_sides() {
        let xs = Tensor::arange(2 * 5 * 5, (Kind::Float, Device::Cpu)).view([1, 2, 5, 5]);
        let ys = pad_shortcut(&xs, 2, 1, 1);
        assert_eq!(ys.size(), [1, 4, 3, 3]);
        let zero = Tensor::zeros([1, 1, 3, 3], (Kind::Float, Device::Cpu));
        assert!(ys.narrow(1, 0, 1).equal(&zero));
        assert!(ys.narrow(1, 3, 1).equal(&zero));
        let every_other = xs.slice(2, 0, None, 2).slice(3, 0, None, 2);
        assert!(ys.narrow(1, 1, 2).equal(&every_other));
        assert_eq!(every_other.double_value(&[0, 1, 2, 2]), 49.0);
    }
}
