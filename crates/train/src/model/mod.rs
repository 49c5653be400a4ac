//! The models `lsgd-host run` trains, each built with PyTorch's default initialisation
//! ([`layers`]) so results are comparable with PyTorch. BatchNorm layers normalise over the
//! batch they are given; the trainer gives them one worker's micro-batch, as in Goyal et al.
//! (per-worker statistics, never synchronised across workers). A TorchScript file trains as
//! it is ([`ScriptModel`]); [`save_model`] writes the trained weights for PyTorch.

mod cnn;
mod layers;
mod mlp;
mod resnet;
mod save;
pub(crate) mod script;

use std::fmt;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use tch::Tensor;
use tch::nn::{self, ModuleT};

pub use cnn::Cnn;
pub use mlp::Mlp;
pub use resnet::ResNet;
pub use save::{save_model, saved_files};
pub use script::{ScriptFile, ScriptModel};

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
    /// A TorchScript module from a file (`--model FILE.pt`), trained as it is.
    Script,
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arch::Mlp => "mlp",
            Arch::Cnn => "cnn",
            Arch::Resnet => "resnet",
            Arch::Script => "script",
        })
    }
}

/// A model [`ModelSpec::build`] made: a network of this crate, or a TorchScript module.
#[derive(Debug)]
pub enum Model {
    /// An MLP, CNN or ResNet.
    Builtin(Box<dyn ModuleT>),
    /// A TorchScript module.
    Script(ScriptModel),
}

impl ModuleT for Model {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        match self {
            Model::Builtin(m) => m.forward_t(xs, train),
            Model::Script(m) => m.forward_t(xs, train),
        }
    }
}

impl Model {
    /// The forward pass, a TorchScript module's faults as errors ([`ScriptModel::forward`]);
    /// a built-in model's layers fail only as libtorch itself does (out of memory), and panic.
    pub fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, crate::Error> {
        match self {
            Model::Builtin(m) => Ok(m.forward_t(xs, train)),
            Model::Script(m) => m.forward(xs, train),
        }
    }

    /// `what` (a pass over the model) failing with `message`, as an error naming the model.
    pub fn fault(&self, what: &str, message: &str) -> crate::Error {
        match self {
            Model::Builtin(_) => {
                crate::Error::Model(format!("the model's {what} failed: {message}"))
            }
            Model::Script(m) => crate::Error::Model(format!(
                "--model {}: {what} failed: {message}",
                m.file().display()
            )),
        }
    }
}

/// What `validate` and `build` say of `--model script` without a file.
const NO_SCRIPT_FILE: &str =
    "--model script needs the TorchScript file: give its path, --model FILE.pt";

/// How a residual block's shortcut meets a change of shape (He et al. 2016, §3.3).
#[derive(ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Shortcut {
    /// The identity, subsampled and zero-padded in the added channels: no parameters (the
    /// paper's CIFAR ResNets; the default of new runs).
    #[default]
    A,
    /// A 1×1 convolution with BatchNorm (what checkpoints written before the choice existed
    /// trained).
    B,
}

/// Everything that determines a model's layers and initial distribution.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(from = "StoredModelSpec")]
pub struct ModelSpec {
    /// The network.
    pub arch: Arch,
    /// ResNet depth, 6n + 2.
    pub depth: u32,
    /// Zero γ in the last BatchNorm of each residual block (Goyal et al. §5.1).
    pub zero_init_residual: bool,
    /// ResNet shortcuts where the shape changes (`--shortcut`); other models ignore it.
    pub shortcut: Shortcut,
    /// The TorchScript file of [`Arch::Script`]; its content, not its path, is the model's
    /// identity (see [`ScriptFile`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub script: Option<ScriptFile>,
}

/// A [`ModelSpec`] as checkpoints store it, including those written before a field existed.
#[derive(Deserialize)]
struct StoredModelSpec {
    arch: Arch,
    depth: u32,
    zero_init_residual: bool,
    #[serde(default)]
    shortcut: Option<Shortcut>,
    #[serde(default)]
    script: Option<ScriptFile>,
}

impl From<StoredModelSpec> for ModelSpec {
    fn from(s: StoredModelSpec) -> Self {
        // A ResNet checkpointed before `shortcut` existed trained option B. Other models ignore
        // the setting, so it reads as the default a new command line gives: resuming an older
        // CNN run must not be refused over a setting that changes nothing.
        let before_it_existed = match s.arch {
            Arch::Resnet => Shortcut::B,
            _ => Shortcut::default(),
        };
        ModelSpec {
            arch: s.arch,
            depth: s.depth,
            zero_init_residual: s.zero_init_residual,
            shortcut: s.shortcut.unwrap_or(before_it_existed),
            script: s.script,
        }
    }
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
        match (self.arch, &self.script) {
            (Arch::Script, None) => Err(crate::Error::Config(NO_SCRIPT_FILE.into())),
            (Arch::Script, Some(_)) | (_, None) => Ok(()),
            (arch, Some(file)) => Err(crate::Error::Config(format!(
                "--model {arch} is built in, but a TorchScript file ({}) is given too",
                file.path.display()
            ))),
        }
    }

    /// Builds the model's variables under `p` for `[channels, rows, cols]` images: a built-in
    /// model initialised from the global seed, or the TorchScript file with its own weights
    /// (checked against the blake3 the spec recorded, and refused unless a batch of such
    /// images gives `[batch, classes]` logits).
    pub fn build(
        &self,
        p: &nn::Path,
        image: [i64; 3],
        classes: i64,
    ) -> Result<Model, crate::Error> {
        let [c, h, w] = image;
        let builtin: Box<dyn ModuleT> = match (self.arch, &self.script) {
            (Arch::Mlp, _) => Box::new(Mlp::new(p, c * h * w, classes)),
            (Arch::Cnn, _) => Box::new(Cnn::new(p, c, h, w, classes)),
            (Arch::Resnet, _) => Box::new(ResNet::new(
                p,
                c,
                classes,
                self.depth,
                self.zero_init_residual,
                self.shortcut,
            )),
            (Arch::Script, Some(file)) => {
                let model = ScriptModel::from_bytes(&file.read()?, &file.path, p)?;
                return Ok(Model::Script(model.checked(
                    image,
                    classes,
                    script::check_bound()?,
                )?));
            }
            (Arch::Script, None) => return Err(crate::Error::Config(NO_SCRIPT_FILE.into())),
        };
        Ok(Model::Builtin(builtin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(arch: Arch) -> ModelSpec {
        ModelSpec {
            arch,
            depth: 20,
            zero_init_residual: false,
            shortcut: Shortcut::A,
            script: None,
        }
    }

    #[test]
    fn checkpoints_from_before_shortcuts_read_as_what_they_trained() {
        let old = |arch: &str| {
            let json = format!(r#"{{"arch":"{arch}","depth":20,"zero_init_residual":false}}"#);
            serde_json::from_str::<ModelSpec>(&json).unwrap()
        };
        assert_eq!(old("resnet").shortcut, Shortcut::B);
        // Equal to what a new command line gives, so an older CNN run still resumes.
        assert_eq!(old("cnn"), spec(Arch::Cnn));
        let json = serde_json::to_string(&spec(Arch::Resnet)).unwrap();
        assert_eq!(
            json,
            r#"{"arch":"resnet","depth":20,"zero_init_residual":false,"shortcut":"a"}"#
        );
        assert_eq!(
            serde_json::from_str::<ModelSpec>(&json).unwrap(),
            spec(Arch::Resnet)
        );
    }

    #[test]
    fn a_script_file_is_its_content_not_its_path() {
        let dir = std::env::temp_dir().join(format!("lsgd-script-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.pt"), dir.join("b.pt"));
        std::fs::write(&a, b"one model").unwrap();
        std::fs::write(&b, b"one model").unwrap();
        let recorded = ScriptFile::new(&a).unwrap();
        assert_eq!(
            recorded,
            ScriptFile::new(&b).unwrap(),
            "moved: the same run"
        );
        std::fs::write(&a, b"another model").unwrap();
        assert_ne!(recorded, ScriptFile::new(&a).unwrap());
        let e = recorded.read().unwrap_err().to_string();
        assert!(e.contains("a.pt") && e.contains("changed"), "{e}");

        let mut script = spec(Arch::Script);
        assert!(script.validate().is_err(), "no file");
        script.script = Some(ScriptFile::new(&b).unwrap());
        let json = serde_json::to_string(&script).unwrap();
        assert_eq!(serde_json::from_str::<ModelSpec>(&json).unwrap(), script);
        script.validate().unwrap();
        script.arch = Arch::Cnn;
        let e = script.validate().unwrap_err().to_string();
        assert!(e.contains("b.pt"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
