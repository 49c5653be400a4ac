"""WasmSync (a sync plugin around an inner optimizer over torch.distributed) on 2 gloo ranks:
local-sgd, post-local-sgd and diloco give PyTorch's own weights step by step (PostLocalSGDOptimizer
with PeriodicModelAverager, DDP's post_localSGD_hook, the outer torch.optim.SGD(nesterov=True)
written out); every decision (the kind of each step, its window, the outer step's coefficients)
is `lsgd-host trace --sync`'s on the same run shape, fed the drift the wrapper measured; a
bad-sync fault raises PluginFault naming plugin, call and step with the weights as before the
step; a state_dict taken inside a window resumes bit for bit."""

import json
import subprocess
import textwrap

import numpy as np
import pytest
import torch

from conftest import torchrun
from lsgd_torch import WasmSync
from lsgd_torch._native import Policy

STEPS, GLOBAL, WORLD = 12, 32, 2

SCRIPT = textwrap.dedent('''
    import json, sys
    from pathlib import Path

    import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState, post_localSGD_hook)
    from torch.distributed.optim import PostLocalSGDOptimizer
    import lsgd_torch as lt

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, k = dist.get_rank(), dist.get_world_size()
    mode, out = sys.argv[1], Path(sys.argv[2])
    STEPS, GLOBAL = 12, 32
    SHAPE = dict(steps_per_epoch=STEPS, epochs=1, global_batch=GLOBAL)

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))

    def shard(step):
        """This rank's part of the step's global batch: each rank sees other samples."""
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(GLOBAL, 8, generator=g)
        # A rule the ranks learn alike, so their drifts partly agree.
        y = x[:, :4].argmax(1)
        n = GLOBAL // k
        return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]

    def inner(name, params):
        if name == "adamw":
            return torch.optim.AdamW(params, lr=0.01)
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    def flat(m):
        return torch.cat([p.detach().reshape(-1) for p in m.parameters()])

    def reference(net, m, opt, after=None):
        """The weights after each step of a plain PyTorch loop."""
        traj = []
        for step in range(STEPS):
            x, y = shard(step)
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
            if after:
                after(step)
            traj.append(flat(m).tolist())
        return traj

    def periodic(period, warmup, hook_until=None):
        """torch's post-local SGD: PostLocalSGDOptimizer + PeriodicModelAverager, and with
        hook_until DDP's post_localSGD_hook (gradients all-reduced before that iteration)."""
        m = model()
        net = m
        if hook_until is not None:
            net = DDP(m)
            state = PostLocalSGDState(process_group=None, subgroup=None,
                                      start_localSGD_iter=hook_until,
                                      post_local_gradient_allreduce=False)
            net.register_comm_hook(state, post_localSGD_hook)
        averager = PeriodicModelAverager(period=period, warmup_steps=warmup)
        opt = PostLocalSGDOptimizer(optim=inner("sgd", m.parameters()), averager=averager)
        return reference(net, m, opt)

    def diloco(period, lr=0.7, momentum=0.9):
        """DiLoCo written out: AdamW inside, every `period` steps the ranks' mean (as torch's
        average_parameters takes it), Δ = θ_global − mean, and torch.optim.SGD(nesterov=True)
        on θ_global."""
        m = model()
        opt = inner("adamw", m.parameters())
        glob = [p.detach().clone() for p in m.parameters()]
        outer = torch.optim.SGD(glob, lr=lr, momentum=momentum, nesterov=True)

        @torch.no_grad()
        def after(step):
            if (step + 1) % period:
                return
            params = list(m.parameters())
            buf = torch.cat([p.reshape(-1) for p in params]) / k
            dist.all_reduce(buf)
            offset = 0
            for g, p in zip(glob, params):
                mean = buf[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                g.grad = g - mean
            outer.step()
            for g, p in zip(glob, params):
                p.copy_(g)
        return reference(m, m, opt, after)

    def decision(sync, plan, window):
        average = plan == "average"
        return dict(plan=plan, window=list(window),
                    outer=sync.last_outer_step if average else None,
                    drift=[list(d) for d in sync.last_drift] if average else None,
                    last_loss=sync.policy.last_loss)

    def wasm(plugin, params, opt_name="sgd", ddp=False, first=0, sync=None, m=None, stop=STEPS):
        """The same job driven by WasmSync: the weights after each step and its decisions."""
        if sync is None:
            m = model()
            sync = lt.WasmSync(inner(opt_name, m.parameters()), plugin, params, model=m,
                               **SHAPE)
        net = m
        if ddp:
            net = DDP(m)
            net.register_comm_hook(sync, lt.sync_hook)
        traj, decisions, losses = [], [], []
        for step in range(first, stop):
            x, y = shard(step)
            sync.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            plan, window = sync.plan, sync.window
            sync.observe(loss=loss)
            sync.step()
            losses.append(loss.item())
            traj.append(flat(m).tolist())
            decisions.append(decision(sync, plan, window))
        return dict(traj=traj, decisions=decisions, losses=losses), sync, m

    results = {}
    if mode == "jobs":
        post = dict(warmup_steps=3, period=4)
        for name, plugin, params, opt_name, ddp, ref in [
            ("local-sgd", "local-sgd", dict(period=4), "sgd", False, lambda: periodic(4, 3)),
            ("post-local-sgd", "post-local-sgd", post, "sgd", False, lambda: periodic(4, 3, 3)),
            ("post-local-sgd-ddp", "post-local-sgd", post, "sgd", True,
             lambda: periodic(4, 3, 3)),
            ("diloco", "diloco", dict(period=4), "adamw", False, lambda: diloco(4)),
            ("local-sgd-5", "local-sgd", dict(period=5), "sgd", False, None),
            ("adaptive-period", "adaptive-period",
             dict(period=2, min_period=1, max_period=8, agree=0.78, disagree=0.52,
                  outer_lr=0.8, outer_momentum=0.5),
             "sgd", False, None),
        ]:
            run, _, _ = wasm(plugin, params, opt_name, ddp)
            run["reference"] = ref() if ref else None
            run["plugin"], run["params"] = plugin, params
            results[name] = run
        lt.check_ranks()
    elif mode == "state":
        faults = ["synchronous", "negative-lr", "nan-lr", "momentum-one", "negative-momentum",
                  "nan-scale", "negative-scale", "scale-count"]
        for fault in faults:
            m = model()
            opt = inner("sgd", m.parameters())
            sync = lt.WasmSync(opt, "bad-sync", dict(fault=fault, at_step=5), model=m, **SHAPE)
            got = dict(fault=None)
            for step in range(STEPS):
                x, y = shard(step)
                sync.zero_grad()
                F.cross_entropy(m(x), y).backward()
                weights = flat(m).clone()
                glob = [g.clone() for g in sync.global_params]
                bufs = [opt.state[p]["momentum_buffer"].clone() for p in m.parameters()
                        if "momentum_buffer" in opt.state[p]]
                clock = (sync.policy.step, sync.window)
                try:
                    sync.step()
                except lt.PluginFault as e:
                    after = [opt.state[p]["momentum_buffer"] for p in m.parameters()
                             if "momentum_buffer" in opt.state[p]]
                    got = dict(
                        fault=type(e).__name__, plugin=e.plugin, call=e.call, step=e.step,
                        message=str(e), at=step,
                        weights=bool(torch.equal(weights, flat(m))),
                        global_=all(torch.equal(a, b) for a, b in zip(glob, sync.global_params)),
                        inner=len(bufs) == len(after) and all(
                            torch.equal(a, b) for a, b in zip(bufs, after)),
                        clock=clock == (sync.policy.step, sync.window),
                    )
                    # Asked again at the same step, the fault is raised again.
                    try:
                        sync.step()
                        got["again"] = None
                    except lt.PluginFault as e2:
                        got["again"] = e2.call
                    break
            results[fault] = got
        for name, plugin, params, opt_name, stop in [
            ("diloco", "diloco", dict(period=4), "adamw", 6),
            # H doubles from 2 to 4 at step 7's window end: steps 8 to 11 are one window,
            # which only the restored snapshot knows.
            ("adaptive-period", "adaptive-period",
             dict(period=2, min_period=1, max_period=8, outer_lr=0.8, outer_momentum=0.5),
             "sgd", 9),
        ]:
            full, _, _ = wasm(plugin, params, opt_name)
            first, sync, m = wasm(plugin, params, opt_name, stop=stop)
            path = out / f"{name}-rank{rank}.pt"
            torch.save({"model": m.state_dict(), "sync": sync.state_dict()}, path)
            saved_window = sync.window
            del sync, m
            # A fresh model and wrapper: the model loaded first, then the wrapper made (which
            # gives every rank rank 0's weights) and loaded; the rank's own weights come back.
            ck = torch.load(path, weights_only=True)
            m = model()
            m.load_state_dict(ck["model"])
            sync = lt.WasmSync(inner(opt_name, m.parameters()), plugin, params, model=m, **SHAPE)
            sync.load_state_dict(ck["sync"])
            resumed, _, _ = wasm(plugin, params, opt_name, first=stop, sync=sync, m=m)
            results[name] = dict(
                window=list(saved_window),
                full=full, first=first, resumed=resumed,
                bitwise=[a == b for a, b in zip(full["traj"][stop:], resumed["traj"])],
            )
    (out / f"{mode}-rank{rank}.json").write_text(json.dumps(results))
    lt.exit_ranks()
''')


def two_ranks(tmp_path, mode):
    """Runs SCRIPT in `mode` on 2 gloo ranks; returns each rank's results."""
    script = tmp_path / "sync_job.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [torchrun(), "--standalone", "--nproc_per_node", str(WORLD), str(script), mode,
         str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((tmp_path / f"{mode}-rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return two_ranks(tmp_path_factory.mktemp("sync-jobs"), "jobs")


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    return two_ranks(tmp_path_factory.mktemp("sync-state"), "state")


@pytest.mark.parametrize("name", ["local-sgd", "post-local-sgd", "post-local-sgd-ddp", "diloco"])
@pytest.mark.parametrize("rank", range(WORLD))
def test_weights_equal_pytorchs_step_by_step(jobs, name, rank):
    run = jobs[rank][name]
    ours, theirs = np.array(run["traj"]), np.array(run["reference"])
    assert ours.shape == theirs.shape == (STEPS, ours.shape[1])
    for step in range(STEPS):
        np.testing.assert_allclose(ours[step], theirs[step], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name}, rank {rank}, after step {step}")
    # The ranks took local steps (their weights differed inside windows) and agree at the end.
    other = np.array(jobs[1 - rank][name]["traj"])
    plans = [d["plan"] for d in run["decisions"]]
    local = plans.index("local")
    assert not np.array_equal(ours[local], other[local]), "the ranks' local steps should differ"
    for step, plan in enumerate(plans):
        if plan != "local":
            assert np.array_equal(ours[step], other[step]), f"step {step} ({plan})"


def drift_file(path, decisions):
    """The drift WasmSync gave the plugin at each window's end, as `trace --drift-file`
    reads it (floats in shortest round-trip form: the same f64s)."""
    lines = ["step,name,role,shape,weight_norm,delta_norm,rank_delta_norm,momentum_norm,"
             "delta_dot_momentum"]
    for step, d in enumerate(decisions):
        for name, shape, role, *norms in d["drift"] or []:
            dims = "x".join(map(str, shape))
            lines.append(",".join([str(step), name, role, dims, *map(repr, norms)]))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "name", ["local-sgd", "post-local-sgd", "post-local-sgd-ddp", "diloco", "local-sgd-5",
             "adaptive-period"])
def test_decisions_are_the_hosts_trace(jobs, host, tmp_path, name):
    run = jobs[0][name]
    decisions = run["decisions"]
    # Every rank decided alike, from the same drift.
    assert decisions == jobs[1][name]["decisions"]
    drift = tmp_path / "drift.csv"
    drift_file(drift, decisions)
    args = ["trace", "--sync", run["plugin"], "--epochs", 1, "--steps-per-epoch", STEPS,
            "--global-batch", GLOBAL, "--world-size", WORLD, "--format", "json",
            "--drift-file", drift]
    for key, v in run["params"].items():
        args += ["--set", f"sync.{key}={v}"]
    rows = json.loads(host(*args))
    assert len(rows) == STEPS
    for row, ours in zip(rows, decisions):
        step = row["step"]
        assert ours["plan"] == row["plan"], f"{name} step {step}"
        assert ours["window"] == [row["window"]["local_steps"], row["window"]["windows"]], step
        theirs = row.get("outer_step")
        if theirs is None:
            assert ours["outer"] is None, step
            continue
        want = dict(theirs, lr_scale=theirs.get("lr_scale", []))
        assert ours["outer"] == want, f"{name} step {step}"
    # The final-step rule: the run ends with an average, whatever the period.
    assert decisions[-1]["plan"] == "average"
    if name == "local-sgd-5":
        assert [d["plan"] for d in decisions].count("average") == 3  # steps 4, 9 and 11


def test_the_last_loss_is_the_ranks_mean_at_steps_that_agree(jobs):
    run = [jobs[r]["post-local-sgd"] for r in range(WORLD)]
    last = None
    for step, d in enumerate(run[0]["decisions"]):
        if d["plan"] != "local":
            total = 0.0
            for r in range(WORLD):
                total += run[r]["losses"][step]
            last = total / WORLD
        assert d["last_loss"] == last, f"step {step}"


FAULTS = {
    # fault: (call, step) — bad-sync averages after steps 3, 7, 11 and misbehaves from step 5.
    "synchronous": ("plan", 5),
    "negative-lr": ("outer-step", 7),
    "nan-lr": ("outer-step", 7),
    "momentum-one": ("outer-step", 7),
    "negative-momentum": ("outer-step", 7),
    "nan-scale": ("outer-step", 7),
    "negative-scale": ("outer-step", 7),
    "scale-count": ("outer-step", 7),
}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("rank", range(WORLD))
def test_a_fault_raises_plugin_fault_before_any_weight_changes(state, fault, rank):
    got = state[rank][fault]
    call, step = FAULTS[fault]
    assert got["fault"] == "PluginFault", got
    assert (got["call"], got["step"], got["at"]) == (call, step, step), got
    assert got["plugin"].endswith("bad-sync.wasm"), got
    assert f"{call} at step {step}" in got["message"] and "bad-sync" in got["message"], got
    assert got["weights"] and got["global_"] and got["inner"] and got["clock"], got
    assert got["again"] == call, got


def test_fault_messages_say_what_is_wrong(state):
    says = {f: state[0][f]["message"] for f in FAULTS}
    assert "synchronous after 1 local steps; end the window with average first" in says[
        "synchronous"]
    assert "outer lr -1: must be finite and >= 0" in says["negative-lr"]
    assert "outer lr NaN" in says["nan-lr"]
    assert "outer momentum 1: must be finite and in [0, 1)" in says["momentum-one"]
    assert "outer momentum -0.5" in says["negative-momentum"]
    assert "lr-scale NaN for 0.bias" in says["nan-scale"]
    assert "lr-scale -1 for 0.bias" in says["negative-scale"]
    assert "5 lr-scale entries for 4 parameter tensors" in says["scale-count"]


@pytest.mark.parametrize("name", ["diloco", "adaptive-period"])
@pytest.mark.parametrize("rank", range(WORLD))
def test_a_state_dict_inside_a_window_resumes_bit_for_bit(state, name, rank):
    got = state[rank][name]
    assert got["window"][0] > 0, f"saved at a window's end, not inside one: {got['window']}"
    assert got["bitwise"] and all(got["bitwise"]), got["bitwise"]
    stop = len(got["first"]["traj"])
    assert got["first"]["traj"] == got["full"]["traj"][:stop]
    assert got["resumed"]["decisions"] == got["full"]["decisions"][stop:]
    if name == "adaptive-period":
        plans = [d["plan"] for d in got["full"]["decisions"]]
        assert plans[7:] == ["average", "local", "local", "local", "average"], plans


# -- one process, no process group ----------------------------------------------------------


def one_rank(plugin="local-sgd", params=None, steps=6):
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    return m, WasmSync(opt, plugin, params, model=m, steps_per_epoch=steps, epochs=1,
                       global_batch=4)


def test_one_rank_runs_without_a_process_group_and_ends_with_an_average():
    m, sync = one_rank("local-sgd", {"period": 4}, steps=6)
    plans = []
    for _ in range(6):
        sync.zero_grad()
        m(torch.randn(4, 3)).square().mean().backward()
        plans.append(sync.plan)
        sync.step()
    assert plans == ["local", "local", "local", "average", "local", "average"]
    assert sync.window == (0, 2)
    # One rank's mean is its own weights: θ_global follows them exactly.
    assert all(torch.equal(g, p) for g, p in zip(sync.global_params, [m.bias, m.weight]))
    assert sync.last_outer_step == {"lr": 1.0, "momentum": 0.0, "nesterov": False,
                                    "lr_scale": []}


def test_another_kind_of_plugin_is_refused_in_lsgd_torchs_words():
    with pytest.raises(ValueError, match="WasmSync takes a sync plugin"):
        one_rank("warmup")
    with pytest.raises(ValueError, match="unknown parameter"):
        one_rank("diloco", {"nope": 1})


def test_the_native_policy_keeps_the_order_of_plan_outer_step_and_advance():
    shape = dict(epochs=1, samples_per_epoch=40, global_batch=4, world_size=2)
    p = Policy("diloco", "sync", [("period", "2")], **shape)
    with pytest.raises(ValueError, match="answers plan\\(\\) and outer_step\\(\\), not value"):
        p.value()
    with pytest.raises(ValueError, match="ends before its plan"):
        p.advance(4)
    drift = [("w", [2], "weight", 1.0, 0.5, 0.5, 0.0, 0.0)]
    with pytest.raises(ValueError, match="before its plan"):
        p.outer_step(drift)
    assert p.plan() == "local"
    with pytest.raises(ValueError, match="planned `local`"):
        p.outer_step(drift)
    p.advance(4, 1.5)
    assert (p.window, p.last_loss) == ((1, 0), None)  # a local step's loss is not agreed
    assert p.plan() == "average" and p.plan() == "average"
    assert p.outer_step(drift) == (0.7, 0.9, True, [])
    p.advance(4, 1.25)
    assert (p.window, p.last_loss, p.step) == ((0, 1), 1.25, 2)
    p.seek(5, 20, None, None, window=(1, 2))
    assert (p.step, p.window) == (5, (1, 2))
    schedule = Policy("warmup", "schedule", [], **shape)
    with pytest.raises(ValueError, match="only a sync plugin answers it"):
        schedule.plan()


def test_a_state_dict_of_other_parameters_is_refused():
    _, sync = one_rank("diloco", {"period": 2})
    saved = sync.state_dict()
    _, other = one_rank("diloco", {"period": 3})
    with pytest.raises(ValueError, match="cannot resume from state_dict: it belongs to a "
                                         "different run"):
        other.load_state_dict(saved)
