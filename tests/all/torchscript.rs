//! `--model FILE.pt` against PyTorch: a scripted conv + BatchNorm + linear model trained by
//! `lsgd-host run` for a few SGD steps (momentum, weight decay) equals the same scripted module
//! trained by torch from the same weights on the same data: the losses of every step, every
//! weight and buffer, and the eval-mode outputs after training (which proves the BatchNorm
//! running statistics were updated the same way). The trained module comes back through
//! `--save-model`. The model's own checks are unit tests in `crates/train/src/model/script.rs`.

use std::process::Command;

use crate::common::*;

/// Makes the model and a CIFAR-format data set (`make DIR`), or trains the model in torch as
/// the host did and compares (`check DIR STEPS`), printing the losses and the differences.
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

def records(x, y):
    return b"".join(bytes([int(y[i])]) + bytes(x[i].flatten().tolist()) for i in range(len(y)))

if mode == "make":
    torch.manual_seed(0)
    torch.jit.script(Net()).save(f"{out}/model.pt")
    x = torch.randint(0, 256, (80, 3, 32, 32), dtype=torch.uint8)
    y = torch.randint(0, 10, (80,), dtype=torch.uint8)
    for b, (lo, hi) in enumerate([(0, 13), (13, 26), (26, 39), (39, 52), (52, 64)]):
        open(f"{out}/data_batch_{b + 1}.bin", "wb").write(records(x[lo:hi], y[lo:hi]))
    open(f"{out}/test_batch.bin", "wb").write(records(x[64:], y[64:]))
    torch.save((x, y), f"{out}/data.pt")
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
    host = torch.jit.load(f"{out}/weights.pt")
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

#[test]
fn a_scripted_model_trains_as_in_pytorch() {
    let py = venv_python();
    let importable = Command::new(&py)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !importable {
        // The test command installs torch into the venv; a bare `cargo test` may not have it.
        eprintln!("skipped: {} cannot import torch", py.display());
        return;
    }
    let dir = scratch("torchscript");
    let script = dir.join("reference.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let d = dir.to_str().unwrap();
    let made = Command::new(&py)
        .arg(&script)
        .args(["make", d])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", stderr(&made));
    let out = scratch("torchscript-run");
    let epochs = 4;
    let model = dir.join("model.pt");
    let weights = dir.join("weights.safetensors");
    let o = lsgd(&[
        "run",
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
        &epochs.to_string(),
        "--threads",
        "1",
        "--device",
        "cpu",
        "--quiet",
        "--save-model",
        weights.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(weights.is_file() && dir.join("weights.pt").is_file());
    let checked = Command::new(&py)
        .arg(&script)
        .args(["check", d, &epochs.to_string()])
        .output()
        .unwrap();
    assert!(checked.status.success(), "{}", stderr(&checked));
    let r: serde_json::Value = serde_json::from_str(&stdout(&checked)).unwrap();
    eprintln!("torch: {r}");
    let host: Vec<f64> = steps(&out).iter().map(|s| s.loss).collect();
    let torch: Vec<f64> = r["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(host.len(), epochs);
    for (step, (a, b)) in host.iter().zip(&torch).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs(),
            "step {step}: host {a}, torch {b}"
        );
    }
    let worst = r["worst_state"][0].as_f64().unwrap();
    assert!(
        worst <= 1e-5,
        "weights differ by {worst} in {}",
        r["worst_state"][1]
    );
    let outputs = r["eval_outputs"].as_f64().unwrap();
    assert!(outputs <= 1e-5, "eval-mode outputs differ by {outputs}");
    assert_eq!(r["batches_tracked"], epochs as u64);
}
