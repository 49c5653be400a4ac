"""WasmLayerRate against lsgd-host: for the same tensor norms its multipliers are `lsgd-host
trace --layer-rate`'s bit for bit; the norms are those of the inner optimizer's own step at
lr 1 (the host's definition); the multiplier scales that step and nothing else; an mlp trained
30 steps with WasmLR + WasmLayerRate from the host's initial weights ends where `lsgd-host run`
does; a state_dict continues exactly and refuses another plugin; faults and misuse raise what
they should; and examples/python/train_single.py runs."""

import copy
import csv
import gzip
import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lsgd_torch import PluginFault, WasmBatchSize, WasmLayerRate, WasmLR

ROOT = Path(__file__).resolve().parents[3]


def f64_bits(x):
    return struct.pack("<d", float(x))


class Small(torch.nn.Module):
    """Every role: conv and linear weights, biases, BatchNorm γ and β."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x))).flatten(1))


ROLES = {"bn.bias": "batchnorm", "bn.weight": "batchnorm", "conv.weight": "weight",
         "fc.bias": "bias", "fc.weight": "weight"}


def small_problem(seed=0):
    torch.manual_seed(seed)
    model = Small()
    x = torch.randn(32, 1, 8, 8)
    y = torch.randint(0, 5, (32,))
    return model, x, y


def backward(model, x, y):
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.item()


# --- (a) the multipliers are the host's for the same norms ---------------------------------

@pytest.mark.parametrize("plugin, params, make", [
    ("lars", {"coefficient": 0.02, "eps": 1e-9},
     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=5e-4)),
    ("lars", {"coefficient": 0.5, "clip": True, "exclude_bias_and_bn": False},
     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)),
    ("lamb", {"min_ratio": 0.01, "max_ratio": 5.0},
     lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.01)),
])
def test_multipliers_equal_the_hosts_for_the_same_norms(host, tmp_path, plugin, params, make):
    model, x, y = small_problem()
    opt = WasmLayerRate(make(model.parameters()), plugin, params, model=model,
                        steps_per_epoch=3, epochs=1, global_batch=256)
    lines = ["step,name,role,shape,weight_norm,grad_norm,update_norm,weight_decay"]
    ours = []
    for step in range(3):
        backward(model, x, y)
        opt.step()
        for name, shape, role, w, g, u, wd in opt.last_tensors:
            # repr is the shortest round-trip text: the host parses back the very same f64.
            lines.append(f"{step},{name},{role},{'x'.join(map(str, shape))},"
                         f"{w!r},{g!r},{u!r},{wd!r}")
        ours.append(dict(opt.last_multipliers))
    assert {t[0]: t[2] for t in opt.last_tensors} == ROLES
    norms = tmp_path / "norms.csv"
    norms.write_text("\n".join(lines) + "\n")
    sets = [a for k, v in params.items()
            for a in ("--set", f"layer_rate.{k}={str(v).lower() if isinstance(v, bool) else v}")]
    rows = list(csv.DictReader(io.StringIO(host(
        "trace", "--layer-rate", plugin, *sets, "--norms-file", norms,
        "--epochs", 1, "--steps-per-epoch", 3, "--global-batch", 256))))
    assert len(rows) == 3
    for step, (row, mine) in enumerate(zip(rows, ours)):
        theirs = {k[len("scale:"):]: float(v) for k, v in row.items() if k.startswith("scale:")}
        assert theirs.keys() == mine.keys()
        for name in mine:
            assert f64_bits(mine[name]) == f64_bits(theirs[name]), (
                f"step {step} {name}: python {mine[name]!r}, host {theirs[name]!r}")
    # Not a vacuous comparison: multipliers are the plugin's ratios, not all 1 (clipped or
    # excluded ones are), and they change from step to step.
    assert all(sum(s != 1.0 for s in step.values()) >= 2 for step in ours)
    assert ours[0]["fc.weight"] != ours[2]["fc.weight"]


# --- the norms are those of the inner optimizer's own step ---------------------------------

OPTIMIZERS = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True,
                                               weight_decay=1e-3),
    "sgd-dampening": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.3),
    "sgd-plain": lambda ps: torch.optim.SGD(ps, lr=0.05),
    "sgd-maximize": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.5, maximize=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "adamw-amsgrad": lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.8, 0.99),
                                                  weight_decay=0.05, amsgrad=True),
}


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_norms_are_the_weights_the_gradient_and_the_inner_step_at_lr_1(kind):
    model, x, y = small_problem(1)
    # Two groups with their own decay: each tensor is reported with its group's.
    decays = {"conv.weight": 0.0, "fc.weight": 0.0}
    groups = [{"params": [model.conv.weight, model.fc.weight], "weight_decay": 0.0},
              {"params": [model.bn.weight, model.bn.bias, model.fc.bias]}]
    inner = OPTIMIZERS[kind](groups)
    wd = inner.param_groups[1]["weight_decay"]
    decays.update({n: wd for n in ("bn.weight", "bn.bias", "fc.bias")})
    opt = WasmLayerRate(inner, "lars", model=model)
    names = dict(model.named_parameters())
    for _ in range(3):
        backward(model, x, y)
        # The same model and optimizer state, stepped at lr 1: w - w' is the update u.
        twin_model, twin_opt = copy.deepcopy((model, inner))
        for twin, p in zip(twin_model.parameters(), model.parameters()):
            twin.grad = p.grad.clone()  # deepcopy leaves the gradients behind
        for g in twin_opt.param_groups:
            g["lr"] = 1.0
        before = {n: p.detach().double().clone() for n, p in twin_model.named_parameters()}
        twin_opt.step()
        after = dict(twin_model.named_parameters())
        opt.step()
        for name, shape, role, w, g, u, decay in opt.last_tensors:
            assert shape == list(names[name].shape)
            assert decay == decays[name]
            assert w == before[name].norm().item()
            assert g == names[name].grad.double().norm().item()
            step = (before[name] - after[name].detach().double()).norm().item()
            # Float32 rounding of w − (w − u); the u of another definition (without
            # momentum, decay or bias correction) is off by far more.
            assert u == pytest.approx(step, rel=2e-4), name


def test_a_tensor_without_gradient_is_listed_with_zero_norms_and_left_alone():
    model, x, y = small_problem(2)
    opt = WasmLayerRate(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), "lars",
                        model=model)
    model.fc.bias.requires_grad_(False)
    bias = model.fc.bias.detach().clone()
    backward(model, x, y)
    opt.step()
    record = {t[0]: t for t in opt.last_tensors}["fc.bias"]
    assert record[4:6] == (0.0, 0.0) and record[3] > 0
    assert torch.equal(model.fc.bias, bias)


# --- the multiplier scales the inner step -----------------------------------------------------

def test_the_multiplier_scales_each_tensors_rate_and_nothing_else():
    model, x, y = small_problem(3)
    plain_model = copy.deepcopy(model)
    opt = WasmLayerRate(torch.optim.SGD(model.parameters(), lr=0.25, weight_decay=1e-2), "lars",
                        {"coefficient": 0.05}, model=model)
    plain = torch.optim.SGD(plain_model.parameters(), lr=0.25, weight_decay=1e-2)
    for _ in range(2):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        backward(model, x, y)
        backward(plain_model, x, y)
        opt.step()
        plain.step()
        for name, p in model.named_parameters():
            s = opt.last_multipliers[name]
            if s == 1.0:
                # Biases and BatchNorm (excluded by lars): PyTorch's own step, bit for bit.
                assert torch.equal(p, dict(plain_model.named_parameters())[name]), name
            else:
                w = before[name]
                want = w - (0.25 * s) * (p.grad + 1e-2 * w)
                torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
                assert not torch.allclose(p, dict(plain_model.named_parameters())[name])
        # Keep the two models at the same weights: only one step's effect is compared.
        plain_model.load_state_dict(model.state_dict())


# --- (b) 30 steps of an mlp against lsgd-host run -----------------------------------------

def read_idx(path):
    """An IDX file (gzipped): big-endian magic 00 00 08 <ndims>, the sizes, then u8 data."""
    data = gzip.decompress(Path(path).read_bytes())
    ndims = data[3]
    dims = struct.unpack(f">{ndims}I", data[4:4 + 4 * ndims])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndims).reshape(dims)


def fashion_subset(data_dir, n):
    """The first n training images as the host feeds them (crates/train/src/tensors.rs):
    scaled to [0, 1], then standardised with the subset's own mean and unbiased std."""
    x = torch.from_numpy(read_idx(data_dir / "train-images-idx3-ubyte.gz")[:n].copy())
    x = x.view(n, 1, 28, 28).to(torch.float32) / 255.0
    mean, std = x.mean(), x.std().clamp_min(1e-6)
    y = torch.from_numpy(read_idx(data_dir / "train-labels-idx1-ubyte.gz")[:n].astype(np.int64))
    return (x - mean) / std, y


def read_safetensors(path):
    """{name: tensor} of a safetensors file: u64 LE header length, JSON header, LE data."""
    raw = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    body = raw[8 + length:]
    dtypes = {"F32": np.float32, "F64": np.float64, "I64": np.int64}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        a = np.frombuffer(body[start:end], dtypes[meta["dtype"]]).reshape(meta["shape"])
        out[name] = torch.from_numpy(a.copy())
    return out


def host_permutation(seed, n, epoch):
    """Epoch ``epoch``'s sample order in ``lsgd-host run`` (crates/train/src/order.rs):
    Fisher–Yates driven by SplitMix64 seeded with ``seed ^ epoch·0xD1B54A32D192ED03``. With
    the host's order the batch is summed in the same order, so the two runs differ only by
    the optimizers' own arithmetic (fused or not), which training otherwise amplifies."""
    mask = (1 << 64) - 1
    state = (seed ^ (epoch * 0xD1B54A32D192ED03)) & mask
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        j = (z * (i + 1)) >> 64
        p[i], p[j] = p[j], p[i]
    return torch.tensor(p)


class Mlp(torch.nn.Module):
    """The host's mlp (crates/train/src/model/mlp.rs): 784 → 256 → 256 → 10, ReLU between."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 256)
        self.fc2 = torch.nn.Linear(256, 256)
        self.fc3 = torch.nn.Linear(256, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


STEPS, SUBSET, SEED = 30, 512, 11


@pytest.mark.parametrize("optimizer, plugin, params, base_lr", [
    ("sgd", "lars", {"coefficient": 0.01}, 0.1),
    ("adamw", "lamb", {"max_ratio": 5.0}, 0.002),
])
def test_thirty_mlp_steps_end_where_the_host_does(host, tmp_path, fashion_mnist, optimizer,
                                                  plugin, params, base_lr):
    # Every step is one whole epoch over the same SUBSET samples, so the batches are the
    # same whatever the shuffle (host_permutation makes even their order the same).
    common = ["run", "--model", "mlp", "--optimizer", optimizer, "--base-lr", base_lr,
              "--schedule", "warmup", "--layer-rate", plugin,
              *[a for k, v in params.items() for a in ("--set", f"layer_rate.{k}={v}")],
              "--data", fashion_mnist, "--train-subset", SUBSET, "--global-batch", SUBSET,
              "--epochs", STEPS, "--test-subset", 100, "--seed", SEED, "--threads", 1,
              "--device", "cpu", "--overwrite"]
    host(*common, "--stop-after-steps", 0, "--out", tmp_path / "init")
    host(*common, "--out", tmp_path / "run")
    initial = read_safetensors(tmp_path / "init" / "checkpoint-00000000.safetensors")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    theirs = [r["loss"] for r in records if r["kind"] == "step"]
    assert len(theirs) == STEPS

    model = Mlp()
    model.load_state_dict({k[len("model."):]: v for k, v in initial.items()
                           if k.startswith("model.")})
    # The host's optimizer defaults (host/src/cli/run.rs): momentum 0.9, weight decay 1e-4 on
    # every tensor, PyTorch's form of SGD; AdamW at torch's betas and eps.
    if optimizer == "sgd":
        inner = torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9, weight_decay=1e-4)
    else:
        inner = torch.optim.AdamW(model.parameters(), lr=base_lr, weight_decay=1e-4)
    shape = dict(steps_per_epoch=1, epochs=STEPS, global_batch=SUBSET)
    opt = WasmLayerRate(inner, plugin, params, model=model, **shape)
    schedule = WasmLR(opt, "warmup", **shape)
    x, y = fashion_subset(fashion_mnist, SUBSET)
    ours = []
    for step in range(STEPS):
        order = host_permutation(SEED, SUBSET, step)
        opt.zero_grad()
        loss = F.cross_entropy(model(x[order]), y[order])
        loss.backward()
        opt.step()
        schedule.step()
        ours.append(loss.item())
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    print(f"{optimizer}+{plugin}: worst relative loss difference over {STEPS} steps {worst:.3e}")
    assert worst <= 1e-5, list(zip(ours, theirs))
    # It trained (warmup and the layer rates moved the loss), so agreeing means something.
    assert theirs[-1] < 0.7 * theirs[0]
    final = read_safetensors(tmp_path / "run" / f"checkpoint-{STEPS:08}.safetensors")
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), final[f"model.{name}"], rtol=1e-4, atol=1e-5)


# --- state_dict -------------------------------------------------------------------------------

def test_a_state_dict_continues_exactly_and_refuses_another_plugin():
    model, x, y = small_problem(4)
    opt = WasmLayerRate(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), "lars",
                        {"coefficient": 0.01}, model=model, steps_per_epoch=5, epochs=2,
                        global_batch=64)
    for _ in range(2):
        backward(model, x, y)
        opt.step()
    saved_model = copy.deepcopy(model.state_dict())
    saved = copy.deepcopy(opt.state_dict())
    assert saved["layer_rate"]["step"] == 2
    for _ in range(2):
        backward(model, x, y)
        opt.step()
    want = {n: p.detach().clone() for n, p in model.named_parameters()}

    again = Small()
    again.load_state_dict(saved_model)
    resumed = WasmLayerRate(torch.optim.SGD(again.parameters(), lr=0.1, momentum=0.9), "lars",
                            {"coefficient": 0.01}, model=again, steps_per_epoch=5, epochs=2,
                            global_batch=64)
    resumed.load_state_dict(saved)
    assert resumed.policy.step == 2
    assert resumed.param_groups is resumed.inner.param_groups
    assert resumed.state is resumed.inner.state
    for _ in range(2):
        backward(again, x, y)
        resumed.step()
    assert resumed.last_multipliers == opt.last_multipliers
    for n, p in again.named_parameters():
        assert torch.equal(p, want[n]), n

    other = WasmLayerRate(torch.optim.SGD(again.parameters(), lr=0.1, momentum=0.9), "lars",
                          {"coefficient": 0.02}, model=again)
    with pytest.raises(ValueError) as e:
        other.load_state_dict(saved)
    assert str(e.value) == (
        "cannot resume from state_dict: it belongs to a different run:\n"
        f"  policy plugins: checkpoint has [{opt.policy.identity}], "
        f"this run has [{other.policy.identity}]")
    assert other.policy.step == 0
    with pytest.raises(ValueError, match="layer_rate"):
        other.load_state_dict(torch.optim.SGD(again.parameters(), lr=0.1).state_dict())


def test_schedulers_drive_the_shared_groups():
    model, x, y = small_problem(5)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = WasmLayerRate(inner, "lars", model=model)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    backward(model, x, y)
    opt.step()
    schedule.step()
    assert inner.param_groups[0]["lr"] == 0.05
    assert opt.param_groups is inner.param_groups and opt.state is inner.state


def test_a_batch_size_controller_sets_the_batch_the_clock_counts():
    model, x, y = small_problem(7)
    shape = dict(steps_per_epoch=10, epochs=1, global_batch=256)
    batches = WasmBatchSize("constant-batch", params={"batch": 128}, **shape)
    opt = WasmLayerRate(torch.optim.SGD(model.parameters(), lr=0.1), "lars", model=model,
                        batch_size=batches, **shape)
    for _ in range(2):
        backward(model, x, y)
        opt.step()
        batches.step()
    assert (opt.policy.step, opt.policy.samples_seen) == (2, 256)


# --- (c) bad input ------------------------------------------------------------------------------

def test_a_schedule_plugin_is_not_a_layer_rate_plugin():
    model, _, _ = small_problem()
    with pytest.raises(ValueError, match=r"warmup\.wasm.*is a schedule plugin"):
        WasmLayerRate(torch.optim.SGD(model.parameters(), lr=0.1), "warmup")


@pytest.mark.parametrize("fault", ["nan", "negative", "count"])
def test_a_bad_multiplier_is_a_plugin_fault_before_any_weight_changes(plugin_dir, fault):
    model, x, y = small_problem(6)
    opt = WasmLayerRate(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                        plugin_dir / "bad-layer-rate.wasm", {"fault": fault, "at_step": 2},
                        model=model)
    for _ in range(2):
        backward(model, x, y)
        opt.step()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    momentum = {n: opt.state[p]["momentum_buffer"].clone() for n, p in model.named_parameters()}
    backward(model, x, y)
    with pytest.raises(PluginFault) as e:
        opt.step()
    assert "bad-layer-rate" in e.value.plugin
    assert e.value.call == "multipliers"
    assert e.value.step == 2
    assert opt.policy.step == 2
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
        assert torch.equal(opt.state[p]["momentum_buffer"], momentum[n]), n


@pytest.mark.parametrize("inner", [
    lambda ps: torch.optim.Adam(ps),
    lambda ps: torch.optim.RMSprop(ps),
])
def test_only_sgd_and_adamw_are_wrapped(inner):
    model, _, _ = small_problem()
    with pytest.raises(TypeError, match="SGD.*AdamW"):
        WasmLayerRate(inner(model.parameters()), "lars")


def test_parameters_outside_the_model_are_refused():
    model, _, _ = small_problem()
    stray = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="not parameters of the model"):
        WasmLayerRate(torch.optim.SGD([*model.parameters(), stray], lr=0.1), "lars", model=model)


# --- the example ---------------------------------------------------------------------------------

def test_the_single_process_example_trains(fashion_mnist):
    done = subprocess.run(
        [sys.executable, ROOT / "examples" / "python" / "train_single.py", "--data", fashion_mnist,
         "--steps", "6", "--steps-per-epoch", "3", "--test-subset", "500", "--threads", "1"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 6, out
    assert "lr" in steps[0] and "epsilon" in steps[0] and "loss" in steps[0], out
    assert "test accuracy" in out, out
