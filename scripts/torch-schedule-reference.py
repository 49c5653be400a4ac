"""Prints, as JSON, the learning rate (and momentum) that a torch.optim.lr_scheduler schedule
gives each optimizer step: the oracle for lsgd-policy's torch-compatible schedules (one-cycle,
linear, multistep, cosine-annealing) and for compositions of them.

    bash scripts/setup.sh --python-torch
    PY=~/.cache/lsgd-host/venv/bin/python
    $PY scripts/torch-schedule-reference.py --lr 0.4 --steps 300 one-cycle pct_start=0.25
    $PY scripts/torch-schedule-reference.py --steps 300 linear start_factor=0.1 total_iters=20
    $PY scripts/torch-schedule-reference.py --steps 300 multistep milestones=100,200 gamma=0.5
    $PY scripts/torch-schedule-reference.py --steps 300 cosine-annealing t_max=250 eta_min=0.001
    $PY scripts/torch-schedule-reference.py --steps 300 \\
        sequential milestone=50 linear start_factor=0.01 total_iters=50 cosine-annealing t_max=250
    $PY scripts/torch-schedule-reference.py --steps 300 \\
        chained linear total_iters=20 multistep milestones=100,200

A schedule is a kind (the lsgd plugin name) followed by `name=value` parameters with the lsgd
plugin's parameter names and defaults (lists comma-separated); `sequential milestone=M A B` is
SequentialLR([A, B], milestones=[M]) and `chained A B` is ChainedScheduler([A, B]). As in the
plugins, `total_steps=0` (one-cycle) and `t_max=0` (cosine-annealing) mean the whole run,
`--steps`. The plugins' `scaling` parameter has no torch counterpart: `--lr` plays η.

The optimizer is SGD with momentum 0.9 on one dummy parameter and initial LR `--lr` (for
one-cycle: its max_lr). Entry i of "lr" and "momentum" is the optimizer's value while step i is
taken, i.e. read before the i-th `scheduler.step()`, for i = 0 .. steps-1: torch stepped once per
batch, as the plugins count `state.step`. Note that torch stepped this way computes LinearLR,
MultiStepLR and CosineAnnealingLR recursively from its stored LR, not in the closed form the
plugins use, so the two may differ by rounding; OneCycleLR has no recursive form.

With `--write-fixture` (and no spec) it writes the cases below to
plugins/lsgd-policy/tests/data/schedules-torch.json instead, which tests/schedules_torch.rs
replays against the plugins' native formulas.

Every float is written as a string holding Python's repr (the shortest decimal that reads back
to the same binary64), to be parsed with a correctly rounded parser (Rust's `str::parse`), as
scripts/torch-plateau-reference.py does.
"""

import argparse
import json
import pathlib
import sys

import torch
from torch.optim import lr_scheduler as sched


def _bool(text):
    if text not in ("true", "false"):
        raise ValueError(f"expected true or false, got '{text}'")
    return text == "true"


def _int(text):
    value = float(text)
    if value != int(value):
        raise ValueError(f"expected a whole number, got '{text}'")
    return int(value)


def _ints(text):
    return [_int(t) for t in text.split(",") if t.strip()]


# Per kind: the torch class, and each lsgd parameter's torch keyword, parser and default (the
# plugin's default, which for one-cycle and linear is also torch's).
KINDS = {
    "one-cycle": (sched.OneCycleLR, {
        "total_steps": ("total_steps", _int, 0),
        "pct_start": ("pct_start", float, 0.3),
        "anneal_strategy": ("anneal_strategy", str, "cos"),
        "div_factor": ("div_factor", float, 25.0),
        "final_div_factor": ("final_div_factor", float, 1e4),
        "three_phase": ("three_phase", _bool, False),
        "cycle_momentum": ("cycle_momentum", _bool, True),
        "base_momentum": ("base_momentum", float, 0.85),
        "max_momentum": ("max_momentum", float, 0.95),
    }),
    "linear": (sched.LinearLR, {
        "start_factor": ("start_factor", float, 1.0 / 3.0),
        "end_factor": ("end_factor", float, 1.0),
        "total_iters": ("total_iters", _int, 5),
    }),
    "multistep": (sched.MultiStepLR, {
        "milestones": ("milestones", _ints, []),
        "gamma": ("gamma", float, 0.1),
    }),
    "cosine-annealing": (sched.CosineAnnealingLR, {
        "t_max": ("T_max", _int, 0),
        "eta_min": ("eta_min", float, 0.0),
    }),
}


def parse_spec(tokens):
    """Splits the spec into [(kind, {name: text})] and the combinator with its parameters."""
    combinator, combinator_args = None, {}
    if tokens and tokens[0] in ("sequential", "chained"):
        combinator, tokens = tokens[0], tokens[1:]
        while tokens and "=" in tokens[0]:
            name, _, value = tokens.pop(0).partition("=")
            combinator_args[name] = value
    parts = []
    for token in tokens:
        if "=" in token:
            if not parts:
                sys.exit(f"parameter '{token}' comes before any schedule")
            name, _, value = token.partition("=")
            parts[-1][1][name] = value
        elif token in KINDS:
            parts.append((token, {}))
        else:
            sys.exit(f"unknown schedule '{token}' (known: {', '.join(KINDS)}, "
                     "sequential, chained)")
    if combinator is None and len(parts) != 1:
        sys.exit(f"expected one schedule, got {len(parts)}: combine with sequential or chained")
    if combinator is not None and len(parts) != 2:
        sys.exit(f"{combinator} takes two schedules, got {len(parts)}")
    if combinator == "sequential" and set(combinator_args) != {"milestone"}:
        sys.exit("sequential takes exactly one parameter, milestone=M")
    if combinator == "chained" and combinator_args:
        sys.exit("chained takes no parameters")
    return combinator, combinator_args, parts


def build(optimizer, kind, given, steps):
    cls, table = KINDS[kind]
    kwargs = {}
    for name, text in given.items():
        if name not in table:
            sys.exit(f"{kind}: unknown parameter '{name}' (accepted: {', '.join(table)})")
        keyword, parse, _ = table[name]
        try:
            kwargs[keyword] = parse(text)
        except ValueError as e:
            sys.exit(f"{kind}.{name}: {e}")
    for name, (keyword, _, default) in table.items():
        kwargs.setdefault(keyword, default)
    # 0 = the whole run, as in the plugins.
    if kind == "one-cycle":
        kwargs["total_steps"] = kwargs["total_steps"] or steps
        kwargs["max_lr"] = optimizer.param_groups[0]["lr"]
    if kind == "cosine-annealing":
        kwargs["T_max"] = kwargs["T_max"] or steps
    return cls(optimizer, **kwargs)


def run(lr, steps, tokens):
    combinator, combinator_args, parts = parse_spec(tokens)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=lr, momentum=0.9)
    schedulers = [build(optimizer, kind, given, steps) for kind, given in parts]
    if combinator == "sequential":
        milestone = _int(combinator_args["milestone"])
        scheduler = sched.SequentialLR(optimizer, schedulers, milestones=[milestone])
    elif combinator == "chained":
        scheduler = sched.ChainedScheduler(schedulers, optimizer=optimizer)
    else:
        scheduler = schedulers[0]
    lrs, momenta = [], []
    for i in range(steps):
        group = optimizer.param_groups[0]
        lrs.append(float(group["lr"]))
        momenta.append(float(group["momentum"]))
        if i + 1 == steps:
            break
        optimizer.step()  # no gradient: a no-op that keeps torch's order-of-calls check quiet
        try:
            scheduler.step()
        except ValueError as e:  # OneCycleLR past total_steps + 1
            sys.exit(f"torch stops after step {i}: {e}")
    return lrs, momenta


# The fixture: (name, --lr, --steps, spec). Parameter sets that reach every phase and edge the
# plugins document, always within torch's cycle (one-cycle's steps <= total_steps).
CASES = [
    ("one-cycle-defaults", 0.4, 300, "one-cycle"),
    ("one-cycle-three-phase-linear", 0.1, 250,
     "one-cycle three_phase=true anneal_strategy=linear pct_start=0.4 div_factor=10 "
     "final_div_factor=100 base_momentum=0.8 max_momentum=0.9"),
    ("one-cycle-three-phase-cos", 1.6, 256, "one-cycle three_phase=true pct_start=0.15"),
    ("one-cycle-partial-no-momentum", 0.2, 300,
     "one-cycle total_steps=500 pct_start=0.1 cycle_momentum=false"),
    ("linear-defaults", 0.1, 40, "linear"),
    ("linear-long-decay", 3.2, 300, "linear start_factor=0.01 end_factor=0.5 total_iters=237"),
    ("multistep-zero-and-repeat", 1.6, 300, "multistep milestones=0,60,60,150,299 gamma=0.3"),
    ("cosine-annealing-run", 0.4, 300, "cosine-annealing"),
    ("cosine-annealing-past-t-max", 0.2, 300, "cosine-annealing t_max=120 eta_min=0.001"),
]


def write_fixture():
    cases = []
    for name, lr, steps, spec in CASES:
        lrs, momenta = run(lr, steps, spec.split())
        case = {"name": name, "spec": spec, "lr_initial": repr(lr), "steps": steps,
                "lr": [repr(v) for v in lrs]}
        if spec.startswith("one-cycle"):
            case["momentum"] = [repr(v) for v in momenta]
        cases.append(case)
    path = (pathlib.Path(__file__).resolve().parent.parent
            / "plugins/lsgd-policy/tests/data/schedules-torch.json")
    path.write_text(json.dumps({"torch": torch.__version__, "cases": cases}, indent=0) + "\n")
    print(f"wrote {path}: {len(cases)} cases (torch {torch.__version__})")


def main():
    parser = argparse.ArgumentParser(
        description="torch's LR and momentum per optimizer step for a scheduler spec, as JSON",
        epilog="SPEC: KIND [name=value ...] | sequential milestone=M A B | chained A B; "
               f"KIND: {', '.join(KINDS)}",
    )
    parser.add_argument("--lr", type=float, default=0.1,
                        help="the optimizer's initial LR (one-cycle: max_lr); default 0.1")
    parser.add_argument("--steps", type=int, default=100,
                        help="optimizer steps to record; default 100")
    parser.add_argument("--write-fixture", action="store_true",
                        help="write the built-in cases to tests/data/schedules-torch.json")
    parser.add_argument("spec", nargs="*", metavar="SPEC")
    args = parser.parse_args()
    if args.write_fixture:
        if args.spec:
            parser.error("--write-fixture takes no spec")
        write_fixture()
        return
    if not args.spec:
        parser.error("a SPEC is required")
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    lrs, momenta = run(args.lr, args.steps, args.spec)
    out = {
        "torch": torch.__version__,
        "spec": " ".join(args.spec),
        "lr_initial": repr(args.lr),
        "steps": args.steps,
        "lr": [repr(v) for v in lrs],
        "momentum": [repr(v) for v in momenta],
    }
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
