//! `--model FILE.pt` against PyTorch: a scripted conv + BatchNorm + linear model trained by
//! `lsgd-host run` for a few SGD steps (momentum, weight decay) equals the same scripted module
//! trained by torch from the same weights on the same data: the losses of every step, every
//! weight and buffer, and the eval-mode outputs after training (which proves the BatchNorm
//! running statistics were updated the same way). The trained module comes back through
//! `--save-model`. The model's own checks are unit tests in `crates/train/src/model/script.rs`;
//! here are the faults of a user's module that only a whole run shows: a head its forward pass
//! never uses (on two ranks), an exception mid-run, a forward pass that never returns.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::*;

/// Makes the model and a CIFAR-format data set (`make DIR`), or trains the model in torch as
/// the host did and compares (`check DIR STEPS`), printing the losses and the differences, or
/// checks that the modules saved to `FILES` kept `unused.pt`'s `aux` head as it was
/// (`unused DIR FILES`). `make` also writes the hostile modules: `unused.pt` (a head its
/// forward never calls), `raises.pt` (raises on its third training-mode call), `loops.pt`
/// (a forward that never returns), `swaps.pt` (whose backward pass runs its two heads in an
/// order that depends on the data).
const SCRIPT: &str = r#"
import json, sys
import torch, torch.nn as nn, torch.nn.functional as F

mode, out = sys.argv[1], sys.argv[2]

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 4).flatten(1))

class Unused(Net):
    def __init__(self):
        super().__init__()
        self.aux = nn.Linear(4 * 4 * 4, 10)

class Raises(Net):
    calls: int
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == 3:
                raise ValueError("boom at training call 3")
        x = F.relu(self.bn(self.conv(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 4).flatten(1))

class Swaps(Unused):
    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        h = F.adaptive_avg_pool2d(h, 4).flatten(1)
        # The layer made last runs its backward first: which one depends on the data.
        if bool(x[0, 0, 0, 0] > x[0, 0, 0, 1]):
            a = self.fc(h)
            b = self.aux(h)
        else:
            b = self.aux(h)
            a = self.fc(h)
        return a + b

class Loops(Net):
    def forward(self, x):
        n = 0
        while n >= 0:
            n = (n + 1) % 1000
        x = F.relu(self.bn(self.conv(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 4).flatten(1))

def records(x, y):
    return b"".join(bytes([int(y[i])]) + bytes(x[i].flatten().tolist()) for i in range(len(y)))

if mode == "make":
    torch.manual_seed(0)
    torch.jit.script(Net()).save(f"{out}/model.pt")
    x = torch.randint(0, 256, (80, 3, 32, 32), dtype=torch.uint8)
    # Samples 0 and 1 (what ranks 0 and 1 record the gradients' order on) take different
    # branches of `Swaps`.
    x[0, 0, 0, :2] = torch.tensor([200, 10])
    x[1, 0, 0, :2] = torch.tensor([10, 200])
    y = torch.randint(0, 10, (80,), dtype=torch.uint8)
    for b, (lo, hi) in enumerate([(0, 13), (13, 26), (26, 39), (39, 52), (52, 64)]):
        open(f"{out}/data_batch_{b + 1}.bin", "wb").write(records(x[lo:hi], y[lo:hi]))
    open(f"{out}/test_batch.bin", "wb").write(records(x[64:], y[64:]))
    torch.save((x, y), f"{out}/data.pt")
    for name, m in [("unused", Unused()), ("raises", Raises()), ("loops", Loops()),
                    ("swaps", Swaps())]:
        torch.jit.script(m).save(f"{out}/{name}.pt")
elif mode == "unused":
    start = torch.jit.load(f"{out}/unused.pt")
    for f in sys.argv[3:]:
        m = torch.jit.load(f)
        assert torch.equal(m.aux.weight, start.aux.weight), f
        assert torch.equal(m.aux.bias, start.aux.bias), f
        assert not torch.equal(m.fc.weight, start.fc.weight), f
    print("unchanged")
else:
    steps = int(sys.argv[3])
    torch.set_num_threads(1)
    x, y = torch.load(f"{out}/data.pt")
    raw = x.float() / 255
    train = raw[:64]
    mean = torch.stack([train[:, c].mean() for c in range(3)]).view(1, 3, 1, 1)
    std = torch.stack([train[:, c].std() for c in range(3)]).view(1, 3, 1, 1)
    xs, ys = (train - mean) / std, y[:64].long()
    net = torch.jit.load(f"{out}/model.pt")
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(net(xs), ys)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    host = torch.jit.load(f"{out}/weights.pt", map_location="cpu")
    ours, theirs = dict(host.state_dict()), dict(net.state_dict())
    assert ours.keys() == theirs.keys(), (ours.keys(), theirs.keys())
    def rel(a, b):
        a, b = a.double(), b.double()
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
    worst = max((rel(ours[k], theirs[k]), k) for k in theirs)
    host.eval(); net.eval()
    test = (raw[64:] - mean) / std
    with torch.no_grad():
        outputs = rel(host(test), net(test))
    print(json.dumps({"losses": losses, "worst_state": worst, "eval_outputs": outputs,
                      "batches_tracked": int(ours["bn.num_batches_tracked"])}))
"#;

/// The venv's Python and a scratch directory `name` holding [`SCRIPT`] and what its `make`
/// wrote; `None` (the reason printed) when torch cannot be imported.
fn made(name: &str) -> Option<(PathBuf, PathBuf)> {
    let py = venv_python();
    let importable = Command::new(&py)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !importable {
        // The test command installs torch into the venv; a bare `cargo test` may not have it.
        eprintln!("skipped: {} cannot import torch", py.display());
        return None;
    }
    let dir = scratch(name);
    std::fs::write(dir.join("reference.py"), SCRIPT).unwrap();
    let made = Command::new(&py)
        .arg(dir.join("reference.py"))
        .args(["make", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", stderr(&made));
    Some((py, dir))
}

/// `run`'s flags (without `run`) for `model` on [`made`]'s data in `dir`: 64 samples a step,
/// one step an epoch, then `extra`.
fn script_run(model: &str, dir: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let (model, d) = (dir.join(model), dir.to_str().unwrap());
    let flags = [
        "--model",
        model.to_str().unwrap(),
        "--dataset",
        "cifar10",
        "--data-dir",
        d,
        "--global-batch",
        "64",
        "--reference-batch",
        "64",
        "--base-lr",
        "0.1",
        "--epochs",
        "4",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--quiet",
    ];
    with_out(&flags, out, extra)
}

/// [`script_run`] on `n` ranks under mpirun.
fn script_ranks(n: usize, model: &str, dir: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut app = run_app(n);
    app.extend(script_run(model, dir, out, extra));
    mpirun(&[app])
}

/// Trains `model.pt` from [`made`]'s `dir` for 4 steps on `device`, saving the weights, then
/// trains it in torch on the CPU and checks that every step's loss and the final weights agree
/// within `rtol` (relative); torch's report.
fn trains_as_in_pytorch(py: &Path, dir: &Path, name: &str, device: &str, rtol: f64) -> Value {
    let out = scratch(name);
    let weights = dir.join("weights.safetensors");
    let mut args = vec!["run".to_string()];
    args.extend(script_run(
        "model.pt",
        dir,
        &out,
        &[
            "--device",
            device,
            "--save-model",
            weights.to_str().unwrap(),
        ],
    ));
    let o = lsgd(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(weights.is_file() && dir.join("weights.pt").is_file());
    let checked = Command::new(py)
        .arg(dir.join("reference.py"))
        .args(["check", dir.to_str().unwrap(), "4"])
        .output()
        .unwrap();
    assert!(checked.status.success(), "{}", stderr(&checked));
    let r: Value = serde_json::from_str(&stdout(&checked)).unwrap();
    eprintln!("torch: {r}");
    let host: Vec<f64> = steps(&out).iter().map(|s| s.loss).collect();
    let torch: Vec<f64> = r["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(host.len(), 4);
    for (step, (a, b)) in host.iter().zip(&torch).enumerate() {
        assert!(
            (a - b).abs() <= rtol * b.abs(),
            "step {step}: host on {device} {a}, torch {b}"
        );
    }
    let worst = r["worst_state"][0].as_f64().unwrap();
    assert!(
        worst <= rtol,
        "weights differ by {worst} in {}",
        r["worst_state"][1]
    );
    r
}

#[test]
fn a_scripted_model_trains_as_in_pytorch() {
    let Some((py, dir)) = made("torchscript") else {
        return;
    };
    let r = trains_as_in_pytorch(&py, &dir, "torchscript-run", "cpu", 1e-5);
    let outputs = r["eval_outputs"].as_f64().unwrap();
    assert!(outputs <= 1e-5, "eval-mode outputs differ by {outputs}");
    assert_eq!(r["batches_tracked"], 4);
}

/// The same module trained on CUDA (the shim moves it to the device, autocast is off) follows
/// PyTorch's CPU trajectory within float tolerance; where libtorch sees no GPU it says it
/// skipped (`scripts/gpu-check.sh` runs it on one).
#[test]
fn a_scripted_model_trains_on_cuda_as_in_pytorch_where_there_is_a_gpu() {
    if !tch::Cuda::is_available() {
        eprintln!("skipped: libtorch sees no CUDA device (TorchScript on CUDA is tested on a GPU)");
        return;
    }
    let Some((py, dir)) = made("torchscript-cuda") else {
        return;
    };
    trains_as_in_pytorch(&py, &dir, "torchscript-cuda-run", "cuda", 1e-3);
}

/// A head the forward pass never calls gets no gradient on any rank: on one rank and on two
/// (where the bucket gather met the missing gradient and panicked), the run trains, and the
/// head stays as it was, untouched by weight decay and momentum, as PyTorch's optimizer and
/// DDP (`find_unused_parameters`) leave a parameter no rank used.
#[test]
fn a_head_the_forward_never_uses_trains_on_one_rank_and_on_two() {
    if no_mpirun() {
        return;
    }
    let Some((py, dir)) = made("torchscript-unused") else {
        return;
    };
    let mut saved = Vec::new();
    for n in [1, 2] {
        let out = scratch(&format!("torchscript-unused-{n}"));
        let weights = dir.join(format!("ranks{n}.safetensors"));
        let save = ["--save-model", weights.to_str().unwrap()];
        let o = script_ranks(n, "unused.pt", &dir, &out, &save);
        assert!(o.status.success(), "{n} rank(s): {}", stderr(&o));
        assert_eq!(steps(&out).len(), 4, "{n} rank(s)");
        saved.push(dir.join(format!("ranks{n}.pt")));
    }
    let checked = Command::new(&py)
        .arg(dir.join("reference.py"))
        .args(["unused", dir.to_str().unwrap()])
        .args(&saved)
        .output()
        .unwrap();
    assert!(checked.status.success(), "{}", stderr(&checked));
}

/// An exception in the forward pass at step 2 (the module's third training call) stops both
/// ranks as a plugin fault does: the state before the step saved, the model and TorchScript's
/// message named, no panic.
#[test]
fn a_forward_that_raises_mid_run_stops_with_the_state_before_the_step() {
    if no_mpirun() {
        return;
    }
    let Some((_, dir)) = made("torchscript-raises") else {
        return;
    };
    let out = scratch("torchscript-raises-run");
    let o = script_ranks(2, "raises.pt", &dir, &out, &[]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("training stopped; state before step 2 saved to"),
        "{err}"
    );
    assert!(
        err.contains("raises.pt: forward (training mode) on a [32, 3, 32, 32] batch failed: builtins.ValueError: boom at training call 3"),
        "{err}"
    );
    assert_eq!(steps(&out).len(), 2);
}

/// A forward pass that never returns fails the start-up check after its bound (here 1 s, set
/// by `LSGD_MODEL_CHECK_S`), and the process ends with the error although the check's thread
/// is still in the loop.
#[test]
fn a_forward_that_never_returns_fails_the_start_up_check() {
    let Some((_, dir)) = made("torchscript-loops") else {
        return;
    };
    let out = scratch("torchscript-loops-run");
    let mut args = vec!["run".to_string()];
    args.extend(script_run("loops.pt", &dir, &out, &[]));
    let o = lsgd_command(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .env("LSGD_MODEL_CHECK_S", "1")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "loops.pt: its forward pass on a [2, 3, 32, 32] batch did not return within 1 s"
        ),
        "{err}"
    );
}

/// A scripted model overlaps its exchange with the backward pass as the built-in ones do: on
/// two ranks, overlapped and sequential runs end with the same weights (`model.pt`, and
/// `unused.pt`, whose unused head the overlapped step finds by walking the graph).
#[test]
fn a_scripted_model_overlaps_and_ends_as_without_overlap() {
    if no_mpirun() {
        return;
    }
    let Some((_, dir)) = made("torchscript-overlap") else {
        return;
    };
    for model in ["model.pt", "unused.pt"] {
        let mut hashes = Vec::new();
        for flag in ["--overlap", "--no-overlap"] {
            let out = scratch(&format!("torchscript-overlap-{model}{flag}"));
            let o = script_ranks(2, model, &dir, &out, &[flag, "--bucket-mb", "0.0005"]);
            assert!(o.status.success(), "{model} {flag}: {}", stderr(&o));
            hashes.push(weights(&o));
        }
        assert_eq!(hashes[0], hashes[1], "{model}");
    }
}

/// A model whose gradients become ready in another order on another rank (here: by the data
/// each rank records the order on) cannot overlap, since every rank must exchange the same
/// buckets in the same order: the start refuses it with the tensors named, and with
/// `--no-overlap` it trains.
#[test]
fn gradients_ready_in_another_order_on_a_rank_are_refused_with_their_names() {
    if no_mpirun() {
        return;
    }
    let Some((_, dir)) = made("torchscript-order") else {
        return;
    };
    let out = scratch("torchscript-order-overlap");
    let o = script_ranks(2, "swaps.pt", &dir, &out, &[]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        // The bias's accumulator hangs off the head's addmm directly, the weight's behind
        // its transpose: the bias is ready first.
        err.contains("gradients became ready in another order on rank 1 than on rank 0: at position 0, rank 0 had `aux.bias` and rank 1 `fc.bias`"),
        "{err}"
    );
    assert!(err.contains("use --no-overlap"), "{err}");
    let out = scratch("torchscript-order-sequential");
    let o = script_ranks(2, "swaps.pt", &dir, &out, &["--no-overlap"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(steps(&out).len(), 4);
}
