"""WasmLR, WasmLabelSmoothing and WasmBatchSize against `lsgd-host trace`: the values a Python
loop gets step by step equal the host's bit for bit (f64 bits of the rate, f32 bits of ε), for
every reference plugin of those kinds (the golden cases' parameters; every guest language),
fed the same losses and metrics; and a state_dict taken mid-run continues exactly."""

import copy
import csv
import io
import pickle
import struct
from pathlib import Path

import pytest
import torch

import lsgd_torch
from lsgd_torch import PluginFault, WasmBatchSize, WasmLabelSmoothing, WasmLR

GOLDEN = Path(__file__).resolve().parents[3] / "tests" / "golden"
# The golden cases' run: 90 epochs of 10 steps at a global batch of 8192 on 32 workers.
SHAPE = dict(epochs=90, steps_per_epoch=10, global_batch=8192, world_size=32)
METRICS = GOLDEN / "inputs" / "metric-90-epochs.txt"
LOSSES = GOLDEN / "inputs" / "loss-900-steps.txt"

# (plugin, --set values, metric file, loss file): the golden cases' plugins and every language.
SCHEDULES = [
    ("constant", {}, None, None),
    ("cosine", {"warmup_epochs": 5}, None, None),
    ("cosine", {"restart_epochs": 10, "restart_mult": 2}, None, None),
    ("poly", {"warmup_epochs": 5, "power": 2}, None, None),
    ("warmup", {}, None, None),
    ("warmup", {"warmup": "constant"}, None, None),
    ("plateau", {"patience": 3, "factor": 0.5, "cooldown": 1}, METRICS, None),
    ("plateau", {"monitor": "loss", "patience": 20, "threshold_mode": "abs",
                 "threshold": 0.001, "min_lr": 0.1}, None, LOSSES),
    ("warmup-c", {}, None, None),
    ("warmup-go", {}, None, None),
    ("warmup-js", {}, None, None),
    ("warmup-python", {}, None, None),
]
SMOOTHING = [
    ("label-smoothing", {"final_epsilon": 0.0, "ramp_end_epoch": 90}),
    ("label-smoothing", {}),
    ("label-smoothing-python", {}),
]
BATCH = [
    ("batch-ramp", {"max_batch": 32768}),
    ("batch-ramp-c", {}),
    ("constant-batch", {"batch": 4096}),
]


def series(path):
    if path is None:
        return []
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [float(line) for line in lines if line]


def host_trace(host, kind_flag, plugin, params, metric_file=None, loss_file=None, extra=()):
    """`lsgd-host trace` of one plugin over SHAPE: its rows as dicts of strings."""
    args = ["trace", kind_flag, plugin, *extra]
    kind = kind_flag[2:].replace("-", "_")
    for k, v in params.items():
        args += ["--set", f"{kind}.{k}={v}"]
    for flag, name in [("--epochs", "epochs"), ("--steps-per-epoch", "steps_per_epoch"),
                       ("--global-batch", "global_batch"), ("--world-size", "world_size")]:
        args += [flag, SHAPE[name]]
    if metric_file:
        args += ["--metric-file", metric_file]
    if loss_file:
        args += ["--loss-file", loss_file]
    return list(csv.DictReader(io.StringIO(host(*args))))


def f64_bits(x):
    return struct.pack("<d", float(x))


def f32_bits(x):
    return struct.pack("<f", float(x))


def optimizer(lr=0.1):
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)


def feed(policy, step, losses, metrics):
    """What training feeds back at the end of `step`, before the step() that ends it."""
    if step < len(losses):
        policy.observe(loss=losses[step])
    per_epoch = SHAPE["steps_per_epoch"]
    if (step + 1) % per_epoch == 0 and (step + 1) // per_epoch <= len(metrics):
        policy.observe(metric=metrics[(step + 1) // per_epoch - 1])


def python_rates(plugin, params, losses=(), metrics=(), stop=None, sched=None):
    sched = sched or WasmLR(optimizer(), plugin, params=params, **SHAPE)
    rates = []
    total = SHAPE["epochs"] * SHAPE["steps_per_epoch"]
    for step in range(sched.last_epoch, total if stop is None else stop):
        rates.append(sched.optimizer.param_groups[0]["lr"])
        assert sched.get_last_lr()[0] == rates[-1]
        feed(sched, step, losses, metrics)
        sched.optimizer.step()
        sched.step()
    return sched, rates


@pytest.mark.parametrize("plugin,params,metric_file,loss_file", SCHEDULES,
                         ids=[f"{p}-{i}" for i, (p, *_) in enumerate(SCHEDULES)])
def test_schedules_equal_the_host_trace_bit_for_bit(host, plugin, params, metric_file,
                                                      loss_file):
    rows = host_trace(host, "--schedule", plugin, params, metric_file, loss_file)
    _, rates = python_rates(plugin, params, series(loss_file), series(metric_file))
    assert len(rates) == len(rows) == 900
    differ = [(i, r, row["lr"]) for i, (r, row) in enumerate(zip(rates, rows))
              if f64_bits(r) != f64_bits(row["lr"])]
    assert not differ, f"{plugin}: first differences (step, python, host): {differ[:5]}"


@pytest.mark.parametrize("plugin,params", SMOOTHING, ids=[p for p, _ in SMOOTHING])
def test_label_smoothing_equals_the_host_trace_bit_for_bit(host, plugin, params):
    rows = host_trace(host, "--label-smoothing", plugin, params)
    ls = WasmLabelSmoothing(plugin, params=params, **SHAPE)
    eps = []
    for _ in rows:
        eps.append(float(ls))
        ls.step()
    assert any(e != 0 for e in eps)
    assert [f32_bits(e) for e in eps] == [f32_bits(r["label_smoothing"]) for r in rows]


@pytest.mark.parametrize("plugin,params", BATCH, ids=[p for p, _ in BATCH])
def test_batch_sizes_equal_the_host_trace(host, plugin, params):
    rows = host_trace(host, "--batch-size", plugin, params)
    bs = WasmBatchSize(plugin, params=params, **SHAPE)
    batches = []
    while not bs.policy.finished:
        batches.append(bs.global_batch)
        bs.step()
    assert batches == [int(r["global_batch"]) for r in rows]


def test_a_schedule_follows_a_batch_size_controller_as_in_the_host(host):
    rows = host_trace(host, "--schedule", "warmup", {},
                      extra=["--batch-size", "batch-ramp", "--set", "batch_size.max_batch=32768"])
    bs = WasmBatchSize("batch-ramp", params={"max_batch": 32768}, **SHAPE)
    sched = WasmLR(optimizer(), "warmup", batch_size=bs, **SHAPE)
    got = []
    while not bs.policy.finished:
        got.append((sched.get_last_lr()[0], bs.global_batch))
        sched.optimizer.step()
        bs.step()
        sched.step()
    assert len(got) == len(rows) < 900
    assert [(f64_bits(lr), b) for lr, b in got] == \
        [(f64_bits(r["lr"]), int(r["global_batch"])) for r in rows]


@pytest.mark.parametrize("plugin,params,metric_file,loss_file",
                         [SCHEDULES[6], SCHEDULES[7], SCHEDULES[1]],
                         ids=["plateau-metric", "plateau-loss", "cosine"])
def test_a_state_dict_saved_mid_run_continues_exactly(plugin, params, metric_file, loss_file):
    losses, metrics = series(loss_file), series(metric_file)
    _, whole = python_rates(plugin, params, losses, metrics)
    for k in [1, 137, 455]:
        first, head = python_rates(plugin, params, losses, metrics, stop=k)
        buf = io.BytesIO()
        torch.save(first.state_dict(), buf)
        del first
        buf.seek(0)
        fresh = WasmLR(optimizer(), plugin, params=params, **SHAPE)
        fresh.load_state_dict(torch.load(buf, weights_only=False))
        # What optimizer.load_state_dict would bring back: the rates in force.
        for group, lr in zip(fresh.optimizer.param_groups, fresh.get_last_lr()):
            group["lr"] = lr
        _, tail = python_rates(plugin, params, losses, metrics, sched=fresh)
        assert [f64_bits(x) for x in head + tail] == [f64_bits(x) for x in whole], k


def test_a_schedule_deep_copies_and_pickles_as_torchs_schedulers_do():
    # copy.deepcopy and pickle work for PyTorch's schedulers (StepLR here, beside it); a copy of
    # WasmLR loads its plugin again and continues from the same step, apart from the original.
    def rates(sched, steps=5):
        out = []
        for _ in range(steps):
            sched.optimizer.step()
            sched.step()
            out.append(sched.get_last_lr()[0])
        return out

    for make in [
        lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
        lambda opt: WasmLR(opt, "plateau", **SHAPE),
        lambda opt: WasmLR(opt, "warmup", **SHAPE, batch_size=WasmBatchSize(
            "batch-ramp", params={"max_batch": 32768}, **SHAPE)),
    ]:
        sched = make(optimizer())
        rates(sched, 3)
        twin, again = copy.deepcopy(sched), pickle.loads(pickle.dumps(sched))
        assert twin.optimizer is not sched.optimizer
        ahead = rates(sched)
        assert rates(twin) == ahead and rates(again) == ahead
        if isinstance(sched, WasmLR):
            assert twin.policy.step == sched.policy.step == again.policy.step


def test_a_list_parameter_takes_a_python_list():
    # The host's --set milestones=30,60,80; a Python user writes a list (issue 44, item 7).
    text = WasmLR(optimizer(), "warmup", params={"milestones": "30,60,80"}, **SHAPE)
    listed = WasmLR(optimizer(), "warmup", params={"milestones": [30, 60.0, 80]}, **SHAPE)
    assert listed.policy.identity == text.policy.identity
    assert WasmLR(optimizer(), "warmup", params={"milestones": (30, 60, 80)},
                  **SHAPE).policy.params == text.policy.params


def test_a_state_dict_of_another_plugin_is_refused_in_the_hosts_words():
    a = WasmLR(optimizer(), "warmup", **SHAPE)
    b = WasmLR(optimizer(), "warmup", params={"warmup_epochs": 2}, **SHAPE)
    with pytest.raises(ValueError) as e:
        b.load_state_dict(a.state_dict())
    msg = str(e.value)
    assert msg.startswith("cannot resume from state_dict: it belongs to a different run:")
    assert "policy plugins: checkpoint has [schedule warmup (blake3" in msg
    assert '("warmup_epochs", "2")' in msg and '("warmup_epochs", "5")' in msg


def test_works_inside_sequential_and_chained_schedulers():
    opt = optimizer(0.1)
    first = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=3)
    second = WasmLR(opt, "cosine", **SHAPE)
    seq = torch.optim.lr_scheduler.SequentialLR(opt, [first, second], milestones=[3])
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        seq.step()
    alone = WasmLR(optimizer(0.1), "cosine", **SHAPE)
    cosine = [alone.get_last_lr()[0]]
    for _ in range(2):
        alone.optimizer.step()
        alone.step()
        cosine.append(alone.get_last_lr()[0])
    # LinearLR for 3 steps, then the plugin from its own step 0.
    assert seen[:3] == pytest.approx([0.05, 0.05 + 0.05 / 3, 0.05 + 0.1 / 3])
    assert seen[3:] == cosine

    opt = optimizer(0.1)
    chained = torch.optim.lr_scheduler.ChainedScheduler(
        [WasmLR(opt, "warmup", **SHAPE), torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0)])
    for _ in range(3):
        opt.step()
        chained.step()
    ref = WasmLR(optimizer(0.1), "warmup", **SHAPE)
    for _ in range(3):
        ref.optimizer.step()
        ref.step()
    assert chained.get_last_lr() == ref.get_last_lr()


def test_each_group_runs_the_plugin_from_its_own_initial_rate():
    a, b = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.01}], lr=0.1)
    sched = WasmLR(opt, "warmup", **SHAPE)
    lr0, lr1 = sched.get_last_lr()
    assert lr1 == pytest.approx(lr0 / 10, rel=1e-15)


def test_bad_input_raises_python_exceptions():
    with pytest.raises(ValueError, match="is a batch-size plugin"):
        WasmLR(optimizer(), "batch-ramp", **SHAPE)
    with pytest.raises(ValueError, match="unknown parameter `nope`; it accepts: scaling"):
        WasmLR(optimizer(), "warmup", params={"nope": 1}, **SHAPE)
    with pytest.raises(ValueError, match="warmup_epochs"):
        WasmLR(optimizer(), "warmup", params={"warmup_epochs": "five"}, **SHAPE)
    with pytest.raises(FileNotFoundError, match="no plugin file `no-such-plugin`"):
        WasmLR(optimizer(), "no-such-plugin", **SHAPE)
    with pytest.raises(ValueError, match="global_batch=10 must be"):
        WasmLR(optimizer(), "warmup", epochs=1, steps_per_epoch=1, global_batch=10, world_size=3)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        WasmLR(optimizer(), "warmup", epochs=1, steps_per_epoch=0, global_batch=10)


@pytest.mark.parametrize("mode,what", [
    ("trap", "trapped"),
    ("nan", "returned an invalid value: learning rate NaN"),
    ("loop", "ran out of its 10000000-unit fuel budget"),
])
def test_a_faulting_plugin_raises_plugin_fault(mode, what):
    with pytest.raises(PluginFault) as e:
        WasmLR(optimizer(), "bad-schedule", params={"mode": mode}, **SHAPE)
    f = e.value
    assert f.plugin.endswith("bad-schedule.wasm")
    assert f.call == "learning-rate" and f.step == 0
    assert what in str(f), str(f)


def test_a_plugin_over_its_memory_cap_raises_plugin_fault():
    sched = WasmLR(optimizer(), "bad-schedule", params={"mode": "leak"}, memory_mb=4, **SHAPE)
    with pytest.raises(PluginFault) as e:
        for _ in range(200):
            sched.optimizer.step()
            sched.step()
    assert "over the 4 MiB cap" in str(e.value) and e.value.step > 0


def test_a_fault_mid_run_names_the_step():
    sched = WasmLR(optimizer(), "bad-schedule", params={"mode": "trap", "from_step": 3}, **SHAPE)
    for _ in range(2):
        sched.optimizer.step()
        sched.step()
    with pytest.raises(PluginFault) as e:
        sched.optimizer.step()
        sched.step()
    assert e.value.step == 3


def test_label_smoothing_and_batch_size_refuse_the_wrong_kind():
    with pytest.raises(ValueError, match="is a schedule plugin"):
        WasmLabelSmoothing("warmup", **SHAPE)
    with pytest.raises(ValueError, match="is a schedule plugin"):
        WasmBatchSize("warmup", **SHAPE)
    with pytest.raises(ValueError, match="is a codec plugin"):
        WasmBatchSize("codec-top-k", **SHAPE)


def test_accumulation_steps_cut_the_worker_batch():
    bs = WasmBatchSize("constant-batch", params={"batch": 4096}, **SHAPE)
    assert bs.worker_batch == 4096 // 32
    assert bs.accumulation_steps(48) == 3
    assert bs.micro_batches(48) == [48, 48, 32]
    assert bs.micro_batches(128) == [128]


def test_check_ranks_alone_returns_the_records():
    sched = WasmLR(optimizer(), "plateau", **SHAPE)
    records = lsgd_torch.check_ranks()
    mine = [r for r in records if r["blake3"] == sched.policy.blake3]
    assert mine and mine[-1]["step"] == 0 and mine[-1]["state"] is not None
