//! TorchScript models (`--model FILE.pt`): a module exported with
//! `torch.jit.script(model).save(path)`, trained by the host's optimizers like a built-in model.
//!
//! TorchScript is deprecated upstream since PyTorch 2.11 but works in 2.13, the libtorch this
//! crate links; its successor, `torch.export` (`.pt2`), needs AOTInductor to run, which tch does
//! not bind, so `.pt2` files are refused with a pointer to `torch.jit.script`.
//!
//! The module's tensors become the VarStore's variables, sharing their `TensorImpl`s: each
//! parameter once (tied weights appear under several names but are one tensor; autograd
//! accumulates both uses into its one gradient), trainable as the module marks it, and each
//! buffer (BatchNorm's running mean and variance, `num_batches_tracked`) as a non-trainable
//! variable, exactly where a built-in model keeps its running statistics. So the optimizer's
//! in-place updates, a resume's copies into the VarStore and the BatchNorm updates of a training
//! forward pass are all seen by both sides, and checkpoints, resumes and the cross-rank
//! comparison treat a scripted model like any other. VarStore names are the module's own dotted
//! names (`layer1.0.bn1.running_mean`), built as nested VarStore paths, so that
//! [`crate::optim::Param::roles`] finds a BatchNorm layer by its `running_mean` as it does for a
//! built-in model.
//!
//! The module is reached through a C++ shim over `torch::jit::Module` (`script.cpp`, compiled by
//! build.rs): tch's `CModule` renames parameters, does not de-duplicate tied ones and has no
//! access to buffers.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::fmt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};

use crate::Error;

/// A TorchScript file as a run records it. Its content, not its path, is the model: two specs
/// are equal when their blake3 agree, so a run resumes after the file moved, and is refused
/// when the file at the given path now holds another model.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ScriptFile {
    /// Where the file was read (a record for people; not part of the identity).
    pub path: PathBuf,
    /// blake3 of the file's bytes, hex.
    pub blake3: String,
}

impl PartialEq for ScriptFile {
    fn eq(&self, other: &Self) -> bool {
        self.blake3 == other.blake3
    }
}

impl Eq for ScriptFile {}

impl ScriptFile {
    /// Records the file at `path` and the blake3 of what it holds now.
    pub fn new(path: &Path) -> Result<ScriptFile, Error> {
        let bytes = read(path)?;
        Ok(ScriptFile {
            path: path.to_path_buf(),
            blake3: blake3::hash(&bytes).to_hex().to_string(),
        })
    }

    /// The file's bytes, refused if they are no longer the ones this record hashed.
    pub fn read(&self) -> Result<Vec<u8>, Error> {
        let bytes = read(&self.path)?;
        let now = blake3::hash(&bytes).to_hex().to_string();
        if now != self.blake3 {
            return Err(Error::Config(format!(
                "--model {}: the file changed since the run recorded it (blake3 {now}, the run \
                 has {}); give the model the run was started with",
                self.path.display(),
                self.blake3
            )));
        }
        Ok(bytes)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(Error::io(format!(
        "cannot read the TorchScript model {}",
        path.display()
    )))
}

/// How long the start-up check ([`ScriptModel::checked`]) waits for the module's forward pass
/// on a batch of two images: 120 s, far more than any model the host can train needs, or
/// `LSGD_MODEL_CHECK_S` seconds.
pub fn check_bound() -> Result<Duration, Error> {
    const VAR: &str = "LSGD_MODEL_CHECK_S";
    let Some(value) = std::env::var_os(VAR) else {
        return Ok(Duration::from_secs(120));
    };
    let value = value.to_string_lossy();
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| Error::Config(format!("{VAR}={value} is not a number of seconds above 0")))
}

/// A TorchScript module whose parameters and buffers are variables of a VarStore.
pub struct ScriptModel {
    module: Module,
    /// The mode the module is in; `forward_t` switches it only when asked for the other one.
    training: Cell<bool>,
    file: PathBuf,
    /// Each tensor's names, the first of them the VarStore's (relative to where it was built).
    parameters: Vec<Vec<String>>,
    buffers: Vec<Vec<String>>,
    /// The buffers themselves, which a training forward pass updates in place.
    buffer_tensors: Vec<Tensor>,
    /// The classes the output must have, once [`ScriptModel::check_output`] has been told.
    classes: Cell<Option<i64>>,
}

impl fmt::Debug for ScriptModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptModel")
            .field("file", &self.file)
            .field("parameters", &self.parameters.len())
            .field("buffers", &self.buffers.len())
            .field("training", &self.training.get())
            .finish()
    }
}

impl ScriptModel {
    /// Loads the TorchScript file at `path` onto `p`'s device and registers its parameters and
    /// buffers as variables under `p`.
    pub fn load(path: &Path, p: &nn::Path) -> Result<ScriptModel, Error> {
        ScriptModel::from_bytes(&read(path)?, path, p)
    }

    /// [`ScriptModel::load`] from a file's bytes, already read; `file` names it in messages.
    pub fn from_bytes(bytes: &[u8], file: &Path, p: &nn::Path) -> Result<ScriptModel, Error> {
        let refuse = |why: String| Error::Config(format!("--model {}: {why}", file.display()));
        let export = "export the model with torch.jit.script(model).save(path)";
        if file.extension().is_some_and(|e| e == "pt2") {
            return Err(refuse(format!(
                "a .pt2 file is a torch.export program, not TorchScript, and lsgd-host cannot \
                 run one; {export}"
            )));
        }
        let module = Module::load(bytes, p.device()).map_err(|e| {
            let first = e.lines().next().unwrap_or("").trim();
            refuse(if contains(bytes, b"/archive_format") {
                format!("it is a torch.export program (.pt2), not TorchScript; {export}")
            } else if first.contains("constants.pkl") {
                format!(
                    "it is a PyTorch archive but not TorchScript (torch.save of a model or \
                     state_dict?); {export}"
                )
            } else {
                format!("libtorch cannot load it as TorchScript: {}", reason(&e))
            })
        })?;
        let parameters = module.tensors(false).map_err(&refuse)?;
        if parameters.is_empty() {
            return Err(refuse(
                "the module has no parameters to train (a torch.jit.freeze'd module has folded \
                 them into constants: save it before freezing)"
                    .into(),
            ));
        }
        if !parameters.iter().any(|t| t.tensor.requires_grad()) {
            return Err(refuse(format!(
                "none of the module's {} parameters requires grad, so there is nothing to train",
                parameters.len()
            )));
        }
        let buffers = module.tensors(true).map_err(&refuse)?;
        let buffer_tensors = buffers.iter().map(|b| b.tensor.shallow_clone()).collect();
        let parameters = register(p, parameters, true).map_err(&refuse)?;
        let buffers = register(p, buffers, false).map_err(&refuse)?;
        module.train(false).map_err(&refuse)?;
        Ok(ScriptModel {
            module,
            training: Cell::new(false),
            file: file.to_path_buf(),
            parameters,
            buffers,
            buffer_tensors,
            classes: Cell::new(None),
        })
    }

    /// The file the module came from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// [`ScriptModel::check_output`] in a thread of its own, given up after `bound`: the
    /// forward pass is the model's own code and may never return. A check given up on leaves
    /// that thread running; the run stops with the error, and the process with it.
    pub fn checked(
        self,
        image: [i64; 3],
        classes: i64,
        bound: Duration,
    ) -> Result<ScriptModel, Error> {
        let file = self.file.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("model check".into())
            .spawn(move || {
                let checked = self.check_output(image, classes);
                let _ = tx.send(checked.map(|()| self));
            })
            .map_err(Error::io("cannot start the model's start-up check"))?;
        let [c, h, w] = image;
        match rx.recv_timeout(bound) {
            Ok(checked) => checked,
            Err(RecvTimeoutError::Timeout) => Err(Error::Config(format!(
                "--model {}: its forward pass on a [2, {c}, {h}, {w}] batch did not return \
                 within {} s (a loop that never ends?), so the start-up check gave up",
                file.display(),
                bound.as_secs_f64()
            ))),
            Err(RecvTimeoutError::Disconnected) => Err(Error::Config(format!(
                "--model {}: the start-up check of its forward pass panicked",
                file.display()
            ))),
        }
    }

    /// Refuses a module whose forward pass does not map a batch of `[channels, rows, cols]`
    /// images to `[batch, classes]` logits (run once in evaluation mode, without gradients).
    pub fn check_output(&self, image: [i64; 3], classes: i64) -> Result<(), Error> {
        let refuse = |why: String| {
            Error::Config(format!(
                "--model {}: {why}; its forward must take one [N, C, H, W] float batch and \
                 return [N, classes] logits",
                self.file.display()
            ))
        };
        let [c, h, w] = image;
        let device = self.module.device;
        let xs = Tensor::zeros([2, c, h, w], (Kind::Float, device));
        let _guard = tch::no_grad_guard();
        self.set_training(false).map_err(&refuse)?;
        let ys = self.module.forward(&xs).map_err(|e| {
            refuse(format!(
                "forward fails on a [2, {c}, {h}, {w}] batch: {}",
                reason(&e)
            ))
        })?;
        if ys.size() != [2, classes] {
            return Err(refuse(format!(
                "a [2, {c}, {h}, {w}] batch gives a {:?} output, the data has {classes} classes",
                ys.size()
            )));
        }
        self.classes.set(Some(classes));
        Ok(())
    }

    /// The forward pass in training (`train`) or evaluation mode, with what the module may do
    /// wrong on a batch the start-up check did not try as an error naming the file: raise
    /// (its TorchScript message), return other than `[batch, classes]` logits, or, training
    /// with autograd on, return a tensor that does not require grad.
    pub fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, Error> {
        let mode = if train { "training" } else { "evaluation" };
        let fail = |why: String| {
            Error::Model(format!(
                "--model {}: forward ({mode} mode) on a {:?} batch {why}",
                self.file.display(),
                xs.size()
            ))
        };
        self.set_training(train)
            .map_err(|e| fail(format!("failed: {}", reason(&e))))?;
        let ys = self
            .module
            .forward(xs)
            .map_err(|e| fail(format!("failed: {}", reason(&e))))?;
        let (batch, size) = (xs.size().first().copied().unwrap_or(0), ys.size());
        let classes = self.classes.get();
        let classes_ok = classes.is_none_or(|c| size.get(1) == Some(&c));
        if size.len() != 2 || size[0] != batch || !classes_ok {
            let classes = classes.map_or("classes".to_string(), |c| c.to_string());
            return Err(fail(format!(
                "returned a {size:?} tensor, not [{batch}, {classes}] logits"
            )));
        }
        Ok(ys)
    }

    /// Copies of the module's buffers (BatchNorm's running statistics), for
    /// [`ScriptModel::restore_buffers`] after a failed step.
    pub fn save_buffers(&self) -> Vec<Tensor> {
        let _guard = tch::no_grad_guard();
        self.buffer_tensors.iter().map(Tensor::copy).collect()
    }

    /// Puts back the buffers [`ScriptModel::save_buffers`] copied.
    pub fn restore_buffers(&self, saved: &[Tensor]) {
        let _guard = tch::no_grad_guard();
        for (b, s) in self.buffer_tensors.iter().zip(saved) {
            b.shallow_clone().copy_(s);
        }
    }

    /// Every parameter and buffer under each of the module's names (tied tensors under all of
    /// theirs), as `load_state_dict` of the PyTorch module expects them.
    pub fn state_dict(&self) -> Result<Vec<(String, Tensor)>, Error> {
        let mut out = self.named(false)?;
        out.extend(self.named(true)?);
        Ok(out)
    }

    fn named(&self, buffers: bool) -> Result<Vec<(String, Tensor)>, Error> {
        let tensors = self.module.tensors(buffers).map_err(|e| {
            Error::Checkpoint(format!(
                "cannot list the tensors of {}: {e}",
                self.file.display()
            ))
        })?;
        Ok(tensors.into_iter().map(|t| (t.name, t.tensor)).collect())
    }

    /// Writes the module, with its current weights and in evaluation mode, to `path`
    /// (`torch.jit.load` reads it).
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        let was = self.training.get();
        let fail = |e: String| {
            Error::Checkpoint(format!(
                "cannot write the TorchScript module {}: {e}",
                path.display()
            ))
        };
        self.set_training(false).map_err(fail)?;
        let saved = self.module.save(path).map_err(fail);
        self.set_training(was).map_err(fail)?;
        saved
    }

    fn set_training(&self, on: bool) -> Result<(), String> {
        if self.training.get() != on {
            self.module.train(on)?;
            self.training.set(on);
        }
        Ok(())
    }
}

impl ModuleT for ScriptModel {
    /// Panics, as tch's layers do, if the forward pass fails: the trainer calls
    /// [`ScriptModel::forward`], which returns the error instead.
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        self.forward(xs, train).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// What a person can act on in a libtorch message: for an exception raised in TorchScript,
/// its last line (`builtins.ValueError: …`) and where the model's source raised it; else the
/// first line that is not empty (a refused pickle's message starts with a line break).
fn reason(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let (Some(first), Some(last)) = (lines.first(), lines.last()) else {
        return "libtorch gave no reason".into();
    };
    if !first.starts_with("The following operation failed in the TorchScript interpreter") {
        return first.trim_end_matches(':').to_string();
    }
    match lines.iter().rev().find(|l| l.starts_with("File \"")) {
        Some(at) => format!("{last} ({at})"),
        None => last.to_string(),
    }
}

/// Adds `tensors` under `p` at their dotted names, each tensor once (under the first of its
/// names), sharing its `TensorImpl` with the module; returns each tensor's names. Parameters
/// are trainable unless the module marks them as not requiring grad.
fn register(
    p: &nn::Path,
    tensors: Vec<Named>,
    parameters: bool,
) -> Result<Vec<Vec<String>>, String> {
    let mut names: Vec<Vec<String>> = Vec::new();
    let mut index: HashMap<usize, usize> = HashMap::new();
    for t in tensors {
        if let Some(&i) = index.get(&t.identity) {
            names[i].push(t.name);
            continue;
        }
        let (module, leaf) = t.name.rsplit_once('.').unwrap_or(("", &t.name));
        let at = module
            .split('.')
            .filter(|s| !s.is_empty())
            .fold(p.clone(), |at, s| at.sub(s));
        if at.get(leaf).is_some() {
            return Err(format!("`{}` is already a variable of the model", t.name));
        }
        let trainable = parameters && t.tensor.requires_grad();
        let _shared = at.add(leaf, t.tensor, trainable);
        index.insert(t.identity, names.len());
        names.push(vec![t.name]);
    }
    Ok(names)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// One tensor of the module: its dotted name, a handle sharing its `TensorImpl`, and that
/// impl's address, which tied names share.
struct Named {
    name: String,
    tensor: Tensor,
    identity: usize,
}

/// A loaded `torch::jit::Module`, freed on drop.
struct Module {
    ptr: NonNull<c_void>,
    device: Device,
}

// SAFETY: a jit::Module is a handle to an object graph that libtorch does not tie to the thread
// that created it; `ScriptModel` is not `Sync` (its `Cell`), so one thread uses it at a time.
unsafe impl Send for Module {}

type Visit = extern "C" fn(*mut c_void, *const c_char, *mut c_void, usize);

unsafe extern "C" {
    fn lsgd_script_free_error(error: *mut c_char);
    fn lsgd_script_load(
        data: *const c_char,
        len: usize,
        device_type: i8,
        device_index: i8,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    fn lsgd_script_free(module: *mut c_void);
    fn lsgd_script_tensors(
        module: *mut c_void,
        buffers: bool,
        ctx: *mut c_void,
        visit: Visit,
    ) -> *mut c_char;
    fn lsgd_script_forward(
        module: *mut c_void,
        input: *const c_void,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    fn lsgd_script_train(module: *mut c_void, on: bool) -> *mut c_char;
    fn lsgd_script_save(module: *mut c_void, path: *const c_char) -> *mut c_char;
}

/// The shim's result: `Ok` for a null message, else the message (which is freed here).
pub(crate) fn check(error: *mut c_char) -> Result<(), String> {
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null result is a NUL-terminated string the shim malloc'd for us.
    let message = unsafe { CStr::from_ptr(error) }
        .to_string_lossy()
        .into_owned();
    unsafe { lsgd_script_free_error(error) };
    Err(message)
}

/// c10's device type and index of a tch device.
fn c10_device(device: Device) -> (i8, i8) {
    match device {
        Device::Cpu => (0, -1),
        Device::Cuda(i) => (1, i as i8),
        Device::Vulkan => (10, -1),
        Device::Mps => (13, -1),
    }
}

extern "C" fn visit(ctx: *mut c_void, name: *const c_char, tensor: *mut c_void, identity: usize) {
    // SAFETY: `ctx` is the `Vec` that `Module::tensors` passed, `name` a NUL-terminated string
    // alive for this call, `tensor` a new at::Tensor whose ownership passes to us.
    let out = unsafe { &mut *ctx.cast::<Vec<Named>>() };
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    let tensor = unsafe { Tensor::from_ptr(tensor.cast()) };
    out.push(Named {
        name,
        tensor,
        identity,
    });
}

impl Module {
    fn load(bytes: &[u8], device: Device) -> Result<Module, String> {
        let (device_type, index) = c10_device(device);
        let mut out = std::ptr::null_mut();
        // SAFETY: the shim reads `len` bytes of `data` and writes `out` only on success.
        check(unsafe {
            lsgd_script_load(
                bytes.as_ptr().cast(),
                bytes.len(),
                device_type,
                index,
                &mut out,
            )
        })?;
        let ptr = NonNull::new(out).ok_or("libtorch returned no module")?;
        Ok(Module { ptr, device })
    }

    fn tensors(&self, buffers: bool) -> Result<Vec<Named>, String> {
        let mut out: Vec<Named> = Vec::new();
        let ctx: *mut Vec<Named> = &mut out;
        // SAFETY: `visit` only pushes onto `out`, which outlives the call.
        check(unsafe { lsgd_script_tensors(self.ptr.as_ptr(), buffers, ctx.cast(), visit) })?;
        Ok(out)
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor, String> {
        let mut out = std::ptr::null_mut();
        // SAFETY: `xs` outlives the call; `out` is a new at::Tensor on success, which tch owns.
        check(unsafe { lsgd_script_forward(self.ptr.as_ptr(), xs.as_ptr().cast(), &mut out) })?;
        Ok(unsafe { Tensor::from_ptr(out.cast()) })
    }

    fn train(&self, on: bool) -> Result<(), String> {
        // SAFETY: the module is alive.
        check(unsafe { lsgd_script_train(self.ptr.as_ptr(), on) })
    }

    fn save(&self, path: &Path) -> Result<(), String> {
        let path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| "the path contains a NUL byte".to_string())?;
        // SAFETY: the module is alive and `path` is NUL-terminated.
        check(unsafe { lsgd_script_save(self.ptr.as_ptr(), path.as_ptr()) })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from lsgd_script_load and is freed once.
        unsafe { lsgd_script_free(self.ptr.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::model::{Model, save_model};

    /// Writes, into the directory it is given: a small scripted model (conv, BatchNorm, ReLU,
    /// a linear layer whose weight a second one shares), a fixed batch, and what 5 plain SGD
    /// steps of the eager model (the reference the scripted one must reproduce) give; plus the
    /// files each refusal is tested with. Tensors go out as safetensors, written by hand since
    /// the `safetensors` package is not needed otherwise. Exit status 3: no torch.
    const REFERENCE: &str = r#"
import json, struct, sys
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    print(f"cannot import torch: {e}")
    sys.exit(3)

out = sys.argv[1]

def save(tensors, path):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        data = bytes(t.reshape(-1).view(torch.uint8).tolist())
        dtype = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(16, 16)
        self.proj = nn.Linear(16, 16, bias=False)
        self.proj.weight = self.fc1.weight
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        x = F.adaptive_avg_pool2d(x, 2).flatten(1)
        x = F.relu(self.fc1(x))
        return self.head(F.relu(self.proj(x)))

class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 6 * 6, 3)

    def forward(self, x):
        y = self.fc(x.flatten(1))
        return y, x

torch.manual_seed(0)
net = Net()
torch.jit.script(net).save(f"{out}/model.pt")
x = torch.randn(8, 3, 6, 6)
y = torch.randint(0, 3, (8,))
params = list(net.parameters())
assert len(params) == 8, "the tied weight is one parameter"
losses = []
net.train()
for _ in range(5):
    loss = F.cross_entropy(net(x), y)
    net.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in params:
            p -= 0.1 * p.grad
    losses.append(loss.item())
net.eval()
with torch.no_grad():
    logits = net(x)
save({"x": x, "y": y, "losses": torch.tensor(losses), "eval": logits}, f"{out}/batch.safetensors")
save(net.state_dict(), f"{out}/trained.safetensors")

torch.jit.freeze(torch.jit.script(Net().eval())).save(f"{out}/frozen.pt")
torch.jit.script(Pair()).save(f"{out}/pair.pt")
torch.save(Net().state_dict(), f"{out}/state_dict.pt")
torch.export.save(torch.export.export(Net().eval(), (x,)), f"{out}/exported.pt")
"#;

    /// Writes, into the directory it is given, modules that fail the trainer in each way a
    /// user's code can, all taking `[N, 3, 6, 6]` and returning 3 logits where they work:
    /// `raises.pt` raises on its third training-mode call, `detached.pt` returns a detached
    /// tensor in training mode, `wide.pt` 2 logits in training mode; and `evil.pt`, a scripted
    /// module whose `data.pkl` is a pickle that would run `os.system` (the command would
    /// create `pwned` in the directory). Exit status 3: no torch.
    const HOSTILE: &str = r#"
import os, pickle, sys, zipfile
try:
    import torch
    import torch.nn as nn
except ImportError as e:
    print(f"cannot import torch: {e}")
    sys.exit(3)

out = sys.argv[1]

class Raises(nn.Module):
    calls: int
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 6 * 6, 3)
        self.calls = 0
    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == 3:
                raise ValueError("boom at training call 3")
        return self.fc(x.flatten(1))

class Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 6 * 6, 3)
    def forward(self, x):
        y = self.fc(x.flatten(1))
        return y.detach() if self.training else y

class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 6 * 6, 3)
    def forward(self, x):
        y = self.fc(x.flatten(1))
        return y[:, :2] if self.training else y

for name, m in [("raises", Raises()), ("detached", Detached()), ("wide", Wide())]:
    torch.jit.script(m).save(f"{out}/{name}.pt")

class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {out}/pwned",))

with zipfile.ZipFile(f"{out}/wide.pt") as src, zipfile.ZipFile(f"{out}/evil.pt", "w") as dst:
    for item in src.infolist():
        data = src.read(item.filename)
        if item.filename.endswith("/data.pkl"):
            data = pickle.dumps(Evil(), protocol=2)
        dst.writestr(item, data)
"#;

    /// Reads what `save_model` wrote back into PyTorch: the weights into the original module
    /// with `load_state_dict` (strict), and the saved module itself; both must give the
    /// reference's evaluation outputs.
    const LOAD_BACK: &str = r#"
import json, struct, sys
import torch

out = sys.argv[1]

def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    dtypes = {"F32": torch.float32, "I64": torch.int64}
    tensors = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        start, end = v["data_offsets"]
        t = torch.frombuffer(bytearray(data[start:end]), dtype=dtypes[v["dtype"]])
        tensors[name] = t.reshape(v["shape"])
    return tensors

reference = load(f"{out}/batch.safetensors")
model = torch.jit.load(f"{out}/model.pt")
model.load_state_dict(load(f"{out}/weights.safetensors"))
model.eval()
saved = torch.jit.load(f"{out}/weights.pt")
assert not saved.training, "the module is saved in evaluation mode"
with torch.no_grad():
    for what, m in [("load_state_dict", model), ("weights.pt", saved)]:
        got = m(reference["x"])
        err = (got - reference["eval"]).abs().max() / reference["eval"].abs().max()
        assert err < 1e-5, f"{what}: relative error {err}"
print("ok")
"#;

    /// Runs `script` (from a file in `dir`: torch.jit.script reads the classes' source) with
    /// `dir` as its argument: `false` when torch is not there (the reason printed), a panic
    /// when the script fails.
    fn run_python(script: &str, dir: &Path) -> bool {
        let python = crate::venv::python();
        if !python.is_file() {
            println!(
                "skipped: {} is missing (scripts/setup.sh)",
                python.display()
            );
            return false;
        }
        let file = dir.join(format!("{}.py", blake3::hash(script.as_bytes()).to_hex()));
        std::fs::write(&file, script).unwrap();
        let out = Command::new(&python)
            .arg(&file)
            .arg(dir)
            .output()
            .expect("python runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.code() == Some(3) {
            println!("skipped: {}", stdout.trim());
            return false;
        }
        assert!(
            out.status.success(),
            "python failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        true
    }

    /// A fresh directory with the reference files; `None` without torch.
    fn reference(test: &str) -> Option<PathBuf> {
        fixtures(REFERENCE, test)
    }

    /// A fresh directory with the files `script` writes; `None` without torch.
    fn fixtures(script: &str, test: &str) -> Option<PathBuf> {
        let dir = std::env::temp_dir().join(format!("lsgd-script-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let made = run_python(script, &dir);
        if !made {
            let _ = std::fs::remove_dir_all(&dir);
        }
        made.then_some(dir)
    }

    fn tensors(path: &Path) -> HashMap<String, Tensor> {
        Tensor::read_safetensors(path)
            .unwrap()
            .into_iter()
            .collect()
    }

    /// max |a − b| relative to max |b|.
    fn assert_close(a: &Tensor, b: &Tensor, what: &str) {
        assert_eq!(a.size(), b.size(), "{what}");
        let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
        let err = (&a - &b).abs().max().double_value(&[]);
        let scale = b.abs().max().double_value(&[]).max(1e-30);
        assert!(err / scale < 1e-5, "{what}: relative error {}", err / scale);
    }

    fn refusal(file: &Path) -> String {
        let vs = nn::VarStore::new(Device::Cpu);
        let e = ScriptModel::load(file, &vs.root()).expect_err("refused");
        let e = e.to_string();
        assert!(
            e.contains(&file.display().to_string()),
            "names the file: {e}"
        );
        e
    }

    #[test]
    fn a_scripted_models_gradients_report_ready_once_each_the_tied_weight_included() {
        use std::sync::Arc;

        use crate::overlap::ready::{GradReady, Order};

        let Some(dir) = reference("ready") else {
            return;
        };
        let vs = nn::VarStore::new(Device::Cpu);
        let model = ScriptModel::load(&dir.join("model.pt"), &vs.root()).unwrap();
        let params = vs.trainable_variables();
        let order = Arc::new(Order::default());
        let _hooks = GradReady::register(&params, order.clone()).unwrap();
        let batch = tensors(&dir.join("batch.safetensors"));
        let mut first = None;
        for pass in 0..4 {
            let loss = model
                .forward_t(&batch["x"], true)
                .cross_entropy_for_logits(&batch["y"]);
            loss.backward();
            let seen = order.take();
            // From the second pass on the executor runs its plan for the profiled graph; as in
            // the first, each gradient reports as its layer's backward is done (the optimised
            // plan would hand them out at the end, in another order).
            let first = first.get_or_insert_with(|| seen.clone());
            assert_eq!(&seen, first, "pass {pass}");
            // fc1.weight, used twice (proj shares it), reports once: autograd sums both uses
            // before its accumulator runs.
            let mut sorted = seen;
            sorted.sort_unstable();
            assert_eq!(sorted, (0..params.len()).collect::<Vec<_>>());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn trains_like_pytorch_and_saves_for_it() {
        let Some(dir) = reference("train") else {
            return;
        };
        let vs = nn::VarStore::new(Device::Cpu);
        let model = ScriptModel::load(&dir.join("model.pt"), &vs.root()).unwrap();
        model.check_output([3, 6, 6], 3).unwrap();

        // The tied weight is one trainable variable, under its first name; buffers are
        // variables too, but not trainable.
        let vars = vs.variables();
        let trainable = |n: &str| vars[n].requires_grad();
        assert_eq!(vs.trainable_variables().len(), 8);
        assert!(trainable("fc1.weight") && !vars.contains_key("proj.weight"));
        for b in [
            "bn.running_mean",
            "bn.running_var",
            "bn.num_batches_tracked",
        ] {
            assert!(!trainable(b), "{b}");
        }
        let state = model.state_dict().unwrap();
        let module = |n: &str| &state.iter().find(|(m, _)| m == n).unwrap().1;
        assert_eq!(
            module("proj.weight").data_ptr(),
            vars["fc1.weight"].data_ptr()
        );

        let batch = tensors(&dir.join("batch.safetensors"));
        let (x, y) = (&batch["x"], &batch["y"]);
        let mut losses = Vec::new();
        for _ in 0..5 {
            let loss = model.forward_t(x, true).cross_entropy_for_logits(y);
            for mut t in vs.trainable_variables() {
                t.zero_grad();
            }
            loss.backward();
            tch::no_grad(|| {
                for mut t in vs.trainable_variables() {
                    let step = t.grad() * 0.1;
                    let _ = t.g_sub_(&step);
                }
            });
            losses.push(loss.double_value(&[]));
        }
        assert_close(&Tensor::from_slice(&losses), &batch["losses"], "losses");
        let trained = tensors(&dir.join("trained.safetensors"));
        for (name, want) in &trained {
            let var = if name == "proj.weight" {
                "fc1.weight"
            } else {
                name
            };
            assert_close(&vars[var], want, name);
        }
        assert_eq!(vars["bn.num_batches_tracked"].int64_value(&[]), 5);
        // Evaluation reads the running statistics the training steps left in the VarStore.
        let eval = tch::no_grad(|| model.forward_t(x, false));
        assert_close(&eval, &batch["eval"], "evaluation outputs");

        let weights = dir.join("weights.safetensors");
        let model = Model::Script(model);
        save_model(&vs, &model, &weights).unwrap();
        let saved = tensors(&weights);
        assert_eq!(
            saved.len(),
            trained.len(),
            "every state_dict name, tied ones too"
        );
        for (name, want) in &trained {
            assert_close(&saved[name], want, name);
        }
        assert!(run_python(LOAD_BACK, &dir));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn built_in_models_save_their_variables() {
        let dir = std::env::temp_dir().join(format!("lsgd-save-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let vs = nn::VarStore::new(Device::Cpu);
        let spec = crate::model::ModelSpec {
            arch: crate::model::Arch::Resnet,
            depth: 8,
            zero_init_residual: false,
            shortcut: crate::model::Shortcut::B,
            script: None,
        };
        let model = spec.build(&vs.root(), [1, 8, 8], 4).unwrap();
        let path = dir.join("resnet.safetensors");
        save_model(&vs, &model, &path).unwrap();
        let saved = tensors(&path);
        let vars = vs.variables();
        assert_eq!(saved.len(), vars.len());
        for (name, var) in &vars {
            assert!(saved[name].equal(var), "{name}");
        }
        assert!(saved.contains_key("layer2.0.shortcut_bn.running_var"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn refuses_what_is_not_a_trainable_torchscript_module() {
        let dir = std::env::temp_dir().join(format!("lsgd-script-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let garbage = dir.join("garbage.pt");
        std::fs::write(&garbage, b"not a model\n".repeat(10)).unwrap();
        let e = refusal(&garbage);
        assert!(
            e.contains("libtorch cannot load it as TorchScript: PytorchStreamReader"),
            "{e}"
        );
        assert!(
            !e.contains('\n'),
            "only the first line of libtorch's message: {e}"
        );
        let pt2 = dir.join("model.pt2");
        std::fs::write(&pt2, b"whatever").unwrap();
        let e = refusal(&pt2);
        assert!(
            e.contains("torch.export") && e.contains("torch.jit.script(model).save"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);

        let Some(dir) = reference("refuse") else {
            return;
        };
        let e = refusal(&dir.join("frozen.pt"));
        assert!(e.contains("no parameters") && e.contains("freeze"), "{e}");
        let e = refusal(&dir.join("exported.pt"));
        assert!(e.contains("torch.export program"), "{e}");
        let e = refusal(&dir.join("state_dict.pt"));
        assert!(e.contains("not TorchScript"), "{e}");

        let vs = nn::VarStore::new(Device::Cpu);
        let pair = ScriptModel::load(&dir.join("pair.pt"), &vs.root()).unwrap();
        let e = pair.check_output([3, 6, 6], 3).unwrap_err().to_string();
        assert!(e.contains("forward returned Tuple, not one Tensor"), "{e}");
        let vs = nn::VarStore::new(Device::Cpu);
        let net = ScriptModel::load(&dir.join("model.pt"), &vs.root()).unwrap();
        let e = net.check_output([3, 6, 6], 10).unwrap_err().to_string();
        assert!(
            e.contains("gives a [2, 3] output, the data has 10 classes"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_tampered_pickle_is_refused_with_libtorchs_reason() {
        let Some(dir) = fixtures(HOSTILE, "evil") else {
            return;
        };
        let e = refusal(&dir.join("evil.pt"));
        assert!(
            e.ends_with("libtorch cannot load it as TorchScript: Unknown type name 'posix.system'"),
            "{e}"
        );
        assert!(!dir.join("pwned").exists(), "the pickle's command ran");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn forward_faults_are_errors_that_name_the_model() {
        let Some(dir) = fixtures(HOSTILE, "faults") else {
            return;
        };
        let x = Tensor::zeros([4, 3, 6, 6], (Kind::Float, Device::Cpu));
        let fault = |name: &str, calls: usize| {
            let vs = nn::VarStore::new(Device::Cpu);
            let file = dir.join(name);
            let model = ScriptModel::load(&file, &vs.root()).unwrap();
            // The start-up check runs in evaluation mode, where these modules work.
            let model = model
                .checked([3, 6, 6], 3, Duration::from_secs(60))
                .unwrap();
            for _ in 1..calls {
                let _ = model.forward(&x, true).unwrap();
            }
            let e = model.forward(&x, true).unwrap_err().to_string();
            assert!(
                e.contains(&file.display().to_string()),
                "names the file: {e}"
            );
            assert!(tch::no_grad(|| model.forward(&x, false)).is_ok(), "{name}");
            e
        };
        let e = fault("raises.pt", 3);
        assert!(
            e.contains("forward (training mode) on a [4, 3, 6, 6] batch failed: builtins.ValueError: boom at training call 3 (File \""),
            "{e}"
        );
        let e = fault("detached.pt", 1);
        assert!(e.contains("does not require grad"), "{e}");
        let e = fault("wide.pt", 1);
        assert!(
            e.contains("returned a [4, 2] tensor, not [4, 3] logits"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
