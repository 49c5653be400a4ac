//! `--save-model FILE`: the trained weights for PyTorch, as safetensors under the model's own
//! parameter and buffer names, so `model.load_state_dict(safetensors.torch.load_file(FILE))`
//! takes them. A built-in model's names are its VarStore's (`layer1.0.conv1.weight`); a
//! TorchScript model's are the module's, tied tensors under each of their names (as its
//! `state_dict()` has them, which a strict `load_state_dict` requires), and the trained module
//! is also written whole beside it, as `FILE` with the extension `.pt`.

use std::path::{Path, PathBuf};

use tch::nn::VarStore;
use tch::{Device, Tensor};

use super::{Arch, Model, ModelSpec};
use crate::Error;

/// The files [`save_model`] writes for `spec` at `path`: `path`, and for a TorchScript model
/// `path` with the extension `.pt`; refuses a `path` that would be both (check it before
/// training, so a long run does not end without its weights).
pub fn saved_files(spec: &ModelSpec, path: &Path) -> Result<Vec<PathBuf>, Error> {
    if spec.arch != Arch::Script {
        return Ok(vec![path.to_path_buf()]);
    }
    let module = path.with_extension("pt");
    if module == path {
        return Err(Error::Config(format!(
            "--save-model {}: a TorchScript model is saved as FILE (safetensors weights) and FILE \
             with the extension .pt (the module); name FILE *.safetensors",
            path.display()
        )));
    }
    Ok(vec![path.to_path_buf(), module])
}

/// Writes `model`'s trained weights (built under `vs.root()`) to `path` as safetensors, and a
/// TorchScript model's module to `path` with the extension `.pt`, each file replaced whole.
pub fn save_model(vs: &VarStore, model: &Model, path: &Path) -> Result<(), Error> {
    let named = match model {
        Model::Builtin(_) => {
            let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
            named.sort_by(|a, b| a.0.cmp(&b.0));
            named
        }
        Model::Script(m) => m.state_dict()?,
    };
    let module_path = match model {
        Model::Script(_) if path.with_extension("pt") == path => {
            return Err(Error::Config(format!(
                "--save-model {}: name the weights *.safetensors; the TorchScript module goes \
                 beside them as .pt",
                path.display()
            )));
        }
        Model::Script(_) => Some(path.with_extension("pt")),
        Model::Builtin(_) => None,
    };
    let cpu: Vec<(String, Tensor)> = {
        let _guard = tch::no_grad_guard();
        named
            .into_iter()
            .map(|(n, t)| (n, t.detach().to_device(Device::Cpu).contiguous()))
            .collect()
    };
    replace(path, |tmp| {
        Tensor::write_safetensors(&cpu, tmp).map_err(|e| {
            Error::Checkpoint(format!("cannot write --save-model {}: {e}", path.display()))
        })
    })?;
    if let (Model::Script(m), Some(module_path)) = (model, module_path) {
        replace(&module_path, |tmp| m.save(tmp))?;
    }
    Ok(())
}

/// Writes `path` through `write` into a temporary file beside it, then renames it over `path`,
/// so a crash never leaves a partial file under the final name.
fn replace(path: &Path, write: impl FnOnce(&Path) -> Result<(), Error>) -> Result<(), Error> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    write(&tmp).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    std::fs::rename(&tmp, path).map_err(Error::io(format!(
        "cannot move {} to {}",
        tmp.display(),
        path.display()
    )))
}
