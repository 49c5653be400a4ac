//! The models `lsgd-host run` trains, each built with PyTorch's default initialisation
//! ([`layers`]) so results are comparable with PyTorch. BatchNorm layers normalise over the
//! batch they are given; the trainer gives them one worker's micro-batch, as in Goyal et al.
//! (per-worker statistics, never synchronised across workers).

mod cnn;
mod layers;
mod mlp;
mod resnet;

use std::fmt;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use tch::nn::{self, ModuleT};

pub use cnn::Cnn;
pub use mlp::Mlp;
pub use resnet::ResNet;

/// Which network to train.
#[derive(ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// Two hidden fully connected layers of 256, no BatchNorm.
    Mlp,
    /// Two conv–BN–ReLU–pool stages and a two-layer head.
    Cnn,
    /// A residual net of depth 6n+2 (`--depth`), BatchNorm after every convolution.
    Resnet,
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arch::Mlp => "mlp",
            Arch::Cnn => "cnn",
            Arch::Resnet => "resnet",
        })
    }
}

/// Everything that determines a model's layers and initial distribution.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// The network.
    pub arch: Arch,
    /// ResNet depth, 6n + 2.
    pub depth: u32,
    /// Zero γ in the last BatchNorm of each residual block (Goyal et al. §5.1).
    pub zero_init_residual: bool,
}

impl ModelSpec {
    /// Refuses settings that do not describe a model.
    pub fn validate(&self) -> Result<(), crate::Error> {
        if self.arch == Arch::Resnet && (self.depth < 8 || !(self.depth - 2).is_multiple_of(6)) {
            return Err(crate::Error::Config(format!(
                "--depth {} is not a ResNet depth: use 6n + 2 with n ≥ 1 (8, 14, 20, 32 …)",
                self.depth
            )));
        }
        if self.zero_init_residual && self.arch != Arch::Resnet {
            return Err(crate::Error::Config(format!(
                "--zero-init-residual applies to residual blocks; --model {} has none",
                self.arch
            )));
        }
        Ok(())
    }

    /// Builds the model's variables under `p` for `[channels, rows, cols]` images.
    pub fn build(&self, p: &nn::Path, image: [i64; 3], classes: i64) -> Box<dyn ModuleT> {
        let [c, h, w] = image;
        match self.arch {
            Arch::Mlp => Box::new(Mlp::new(p, c * h * w, classes)),
            Arch::Cnn => Box::new(Cnn::new(p, c, h, w, classes)),
            Arch::Resnet => Box::new(ResNet::new(
                p,
                c,
                classes,
                self.depth,
                self.zero_init_residual,
            )),
        }
    }
}
