"""WasmLR against PyTorch's own schedulers, on the optimizer of torch's test_lrscheduler.py (two
parameter groups, the second with a tensor lr): torch's chained and compound cases run twice,
once all torch and once with a scheduler swapped for WasmLR and the reference plugin that
computes the same thing, and must give the same rates; so must the closed form (step(epoch)),
one-cycle's momentum, and each group's own floors and peaks (issue 44, items 3, 4, 5, 9)."""

import warnings

import pytest
import torch
from torch.optim.lr_scheduler import (
    ChainedScheduler,
    ConstantLR,
    CosineAnnealingLR,
    ExponentialLR,
    LinearLR,
    MultiStepLR,
    OneCycleLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)

from lsgd_torch import WasmLR

EPOCHS = 12
# Stepped once per epoch, as torch's tests step them: one optimizer step per epoch.
SHAPE = dict(steps_per_epoch=1, epochs=EPOCHS, global_batch=256)
# A metric that improves, stalls, improves once and stalls again (for the plateau cases).
METRICS = [10.0, 9.0, 9.0, 9.0, 9.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0]


def torch_optimizer():
    """torch's test_lrscheduler set-up: lr 0.05, and a second group at a tensor lr of 0.5."""
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    return torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": torch.tensor(0.5)}], lr=0.05)


def wasm(opt, plugin, **params):
    return WasmLR(opt, plugin, params={"scaling": "none", **params}, **SHAPE)


# Each torch scheduler of the cases, and the WasmLR that computes the same rate (None: no
# reference plugin does).
def step_lr(step_size, gamma):
    return (lambda o: StepLR(o, step_size=step_size, gamma=gamma),
            lambda o: wasm(o, "multistep", gamma=gamma,
                           milestones=list(range(step_size, EPOCHS + 1, step_size))))


def multistep_lr(milestones, gamma):
    return (lambda o: MultiStepLR(o, milestones=milestones, gamma=gamma),
            lambda o: wasm(o, "multistep", milestones=milestones, gamma=gamma))


def linear_lr(start_factor, total_iters, end_factor=1.0):
    return (lambda o: LinearLR(o, start_factor=start_factor, end_factor=end_factor,
                               total_iters=total_iters),
            lambda o: wasm(o, "linear", start_factor=start_factor, end_factor=end_factor,
                           total_iters=total_iters))


def cosine_lr(t_max, eta_min):
    return (lambda o: CosineAnnealingLR(o, T_max=t_max, eta_min=eta_min),
            lambda o: wasm(o, "cosine-annealing", t_max=t_max, eta_min=eta_min))


def plateau(factor, patience):
    return (lambda o: ReduceLROnPlateau(o, mode="min", factor=factor, patience=patience),
            lambda o: wasm(o, "plateau", mode="min", factor=factor, patience=patience))


def exponential_lr(gamma):
    return (lambda o: ExponentialLR(o, gamma=gamma), None)


def constant_lr(factor, total_iters):
    return (lambda o: ConstantLR(o, factor=factor, total_iters=total_iters), None)


# torch's test_chained_lr* and test_compound_* cases (test/optim/test_lrscheduler.py). Their
# cosine annealing has eta_min 1e-10 there; here 0, where torch's recursive form is the product
# of factors its own targets assume (with a floor, the floor enters the product differently,
# by 2e-5 of the rate at epoch 10, which torch's test tolerates with atol=1e-5).
CASES = {
    "chained_lr1": [step_lr(3, 0.1)],
    "chained_lr2": [linear_lr(0.4, 3)],
    "chained_lr3": [linear_lr(0.4, 3), multistep_lr([4, 8, 10], 0.1)],
    "chained_lr4": [exponential_lr(0.9), constant_lr(0.2, 4), step_lr(3, 0.1)],
    "compound_step_and_multistep": [step_lr(2, 0.1), multistep_lr([2, 5, 9], 0.1)],
    "compound_step_and_exp": [step_lr(2, 0.1), exponential_lr(0.9)],
    "compound_exp_and_multistep": [multistep_lr([2, 5, 9], 0.1), exponential_lr(0.9)],
    "compound_exp_and_linearlr": [linear_lr(0.2, 4), exponential_lr(0.9)],
    "compound_step_and_constantlr": [step_lr(3, 0.1), constant_lr(0.1, 4)],
    "compound_linearlr_and_multistep": [multistep_lr([2, 5, 9], 0.1), linear_lr(0.2, 4)],
    "compound_cosanneal_and_step": [cosine_lr(EPOCHS, 0.0), step_lr(3, 0.1)],
    "compound_cosanneal_and_multistep": [cosine_lr(EPOCHS, 0.0), multistep_lr([2, 5, 9], 0.1)],
    "compound_cosanneal_and_linearlr": [linear_lr(0.2, 4), cosine_lr(EPOCHS, 0.0)],
    "compound_cosanneal_and_exp": [cosine_lr(EPOCHS, 0.0), exponential_lr(0.9)],
    "compound_plateau_and_step": [step_lr(3, 0.1), plateau(0.5, 1)],
    "compound_plateau_and_linearlr": [linear_lr(0.2, 4), plateau(0.5, 1)],
    "compound_plateau_and_cosanneal": [cosine_lr(EPOCHS, 0.0), plateau(0.5, 1)],
}


def variants():
    """Every case with each swappable scheduler swapped for WasmLR in turn, and all of them."""
    for name, parts in CASES.items():
        swappable = [i for i, (_, w) in enumerate(parts) if w is not None]
        sets = [{i} for i in swappable] + ([set(swappable)] if len(swappable) > 1 else [])
        for chained in [False, True]:
            for swap in sets:
                yield pytest.param(name, swap, chained,
                                   id=f"{name}-wasm{sorted(swap)}{'-chained' if chained else ''}")


def run(parts, swap, chained):
    """Both groups' rates over EPOCHS epochs, the schedulers stepped in order each epoch (or
    through a ChainedScheduler) as torch's tests step them."""
    opt = torch_optimizer()
    scheds = [(w if i in swap else t)(opt) for i, (t, w) in enumerate(parts)]
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own warnings (a tensor lr's, say) are not ours
        chain = ChainedScheduler(scheds) if chained and not any(
            isinstance(s, ReduceLROnPlateau) for s in scheds) else None
        for epoch in range(EPOCHS):
            rates.append([float(g["lr"]) for g in opt.param_groups])
            opt.step()
            for s in scheds:
                if isinstance(s, ReduceLROnPlateau):
                    s.step(METRICS[epoch])
                elif isinstance(s, WasmLR) and s.policy.name == "plateau":
                    s.observe(metric=METRICS[epoch])
                    if chain is None:
                        s.step()
                elif chain is None:
                    s.step()
            if chain is not None:
                chain.step()
    return rates


@pytest.mark.parametrize("name,swap,chained", list(variants()))
def test_chained_and_compound_cases_match_torch(name, swap, chained):
    parts = CASES[name]
    expected = run(parts, set(), chained)
    got = run(parts, swap, chained)
    # Torch multiplies factors step by step; the float32 tensor lr of group 1 rounds each.
    for epoch, (e, g) in enumerate(zip(expected, got)):
        assert g == pytest.approx(e, rel=2e-6, abs=1e-12), f"epoch {epoch}: {got} vs {expected}"
    assert len({r[0] for r in expected}) > 1  # the case moves the rate


def test_alone_the_chainable_form_is_the_plugins_rate_bit_for_bit():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched = wasm(opt, "cosine-annealing", t_max=EPOCHS, eta_min=0.001)
    closed = wasm(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1),
                  "cosine-annealing", t_max=EPOCHS, eta_min=0.001)
    for epoch in range(EPOCHS):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            closed.step(epoch)
        assert opt.param_groups[0]["lr"] == closed.get_last_lr()[0], epoch
        opt.step()
        sched.step()


def test_step_with_an_epoch_takes_the_closed_form_as_torchs_do():
    # torch's _test_lr_is_constant_for_constant_epoch, and step(k) jumping to step k.
    for make in [lambda o: MultiStepLR(o, milestones=[2, 5, 9], gamma=0.1),
                 lambda o: wasm(o, "multistep", milestones=[2, 5, 9], gamma=0.1)]:
        opt = torch_optimizer()
        sched = make(opt)
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(4):
                opt.step()
                sched.step(2)
                seen.append(float(opt.param_groups[0]["lr"]))
            sched.step(7)
        assert seen == pytest.approx([0.005] * 4)
        assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.0005)
        assert float(opt.param_groups[1]["lr"]) == pytest.approx(0.005)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_one_cycle_sets_each_groups_rate_and_momentum_as_one_cycle_lr(optimizer):
    # torch's per-group max_lr is each group's lr for the plugin (its eta).
    max_lr, total = [0.1, 0.01], 20

    def make(lrs):
        a, b = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
        groups = [{"params": [a], "lr": lrs[0]}, {"params": [b], "lr": lrs[1]}]
        if optimizer == "sgd":
            return torch.optim.SGD(groups, lr=lrs[0], momentum=0.9)
        return torch.optim.Adam(groups, lr=lrs[0], betas=(0.9, 0.999))

    def momentum(group):
        return group["momentum"] if optimizer == "sgd" else group["betas"][0]

    ours = make(max_lr)
    theirs = make([0.5, 0.5])
    sched = WasmLR(ours, "one-cycle", params={"scaling": "none", "total_steps": total},
                   steps_per_epoch=total, epochs=1, global_batch=256)
    ref = OneCycleLR(theirs, max_lr=max_lr, total_steps=total)
    seen = []
    for step in range(total):
        seen.append(momentum(ours.param_groups[0]))
        for g, h in zip(ours.param_groups, theirs.param_groups):
            assert g["lr"] == pytest.approx(h["lr"], rel=1e-12), step
            assert momentum(g) == pytest.approx(momentum(h), rel=1e-12), step
            if optimizer == "adam":
                assert g["betas"][1] == 0.999
        ours.step()
        theirs.step()
        sched.step()
        ref.step()
    # The cycle went down to torch's base_momentum and back.
    assert min(seen) == pytest.approx(0.85) and seen[0] == seen[-1] == pytest.approx(0.95)


def test_momentum_false_leaves_the_optimizer_alone_and_no_momentum_is_an_error():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
    WasmLR(opt, "one-cycle", momentum=False, params={"total_steps": 10}, **SHAPE)
    assert opt.param_groups[0]["momentum"] == 0.9
    rprop = torch.optim.Rprop([torch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match="neither `momentum` nor `betas`; pass momentum=False"):
        WasmLR(rprop, "one-cycle", params={"total_steps": 10}, **SHAPE)


def test_each_group_keeps_its_own_absolute_floor_as_torch_does():
    # CosineAnnealingLR's eta_min is absolute in every group (issue 44: group 1 ended at 1e-9
    # where torch gives 1e-10, its floor scaled by the groups' ratio).
    opt, ref_opt = torch_optimizer(), torch_optimizer()
    sched = wasm(opt, "cosine-annealing", t_max=EPOCHS, eta_min=1e-10)
    ref = CosineAnnealingLR(ref_opt, T_max=EPOCHS, eta_min=1e-10)
    for _ in range(EPOCHS):
        for g, h in zip(opt.param_groups, ref_opt.param_groups):
            assert float(g["lr"]) == pytest.approx(float(h["lr"]), rel=1e-6, abs=1e-16)
        opt.step()
        ref_opt.step()
        sched.step()
        ref.step()
    # Step t_max: both groups at the floor.
    assert [float(g["lr"]) for g in opt.param_groups] == pytest.approx([1e-10, 1e-10], rel=1e-6)


def test_per_group_parameters_as_torchs_per_group_min_lr():
    opt, ref_opt = torch_optimizer(), torch_optimizer()
    common = {"mode": "min", "factor": 0.5, "patience": 0}
    sched = WasmLR(opt, "plateau", params=[{"scaling": "none", **common, "min_lr": 0.01},
                                           {"scaling": "none", **common, "min_lr": 0.2}],
                   **SHAPE)
    ref = ReduceLROnPlateau(ref_opt, mode="min", factor=0.5, patience=0, min_lr=[0.01, 0.2])
    for epoch in range(EPOCHS):
        for g, h in zip(opt.param_groups, ref_opt.param_groups):
            assert float(g["lr"]) == pytest.approx(float(h["lr"]), rel=1e-6), epoch
        opt.step()
        ref_opt.step()
        sched.observe(metric=10.0)  # never improves: a reduction every epoch
        sched.step()
        ref.step(10.0)
    assert [float(g["lr"]) for g in opt.param_groups] == pytest.approx([0.01, 0.2])
    with pytest.raises(ValueError, match="params has 1 dicts, but the optimizer has 2"):
        WasmLR(torch_optimizer(), "plateau", params=[{}], **SHAPE)


def test_sequential_lr_restarts_the_plugin_beside_torchs_schedulers():
    opt, ref_opt = torch_optimizer(), torch_optimizer()
    seq = SequentialLR(opt, [LinearLR(opt, start_factor=0.5, total_iters=3),
                             wasm(opt, "multistep", milestones=[2, 4], gamma=0.5)], milestones=[3])
    ref = SequentialLR(ref_opt, [LinearLR(ref_opt, start_factor=0.5, total_iters=3),
                                 MultiStepLR(ref_opt, milestones=[2, 4], gamma=0.5)],
                       milestones=[3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for epoch in range(EPOCHS):
            for g, h in zip(opt.param_groups, ref_opt.param_groups):
                assert float(g["lr"]) == pytest.approx(float(h["lr"]), rel=1e-6), epoch
            opt.step()
            ref_opt.step()
            seq.step()
            ref.step()
