"""Writes the learning rates that lsgd-policy's `plateau` schedule is tested against
(plugins/lsgd-policy/tests/data/plateau-torch.json): torch.optim.lr_scheduler.ReduceLROnPlateau
on an SGD optimizer, stepped with fixed series of metrics, the LR recorded after every step.
Regenerate with

    bash scripts/setup.sh --python-torch
    ~/.cache/lsgd-host/venv/bin/python scripts/torch-plateau-reference.py

The Rust test (plugins/lsgd-policy/tests/plateau_torch.rs) feeds observation i to `plateau` as
the state of epoch i + 1 (monitor metric) or step i + 1 (monitor loss), with scaling and warmup
off and base_lr = the optimizer's initial LR, and compares every LR bit for bit.

Every float is written as a string holding Python's repr (the shortest decimal that reads back
to the same binary64), and the test parses it with Rust's correctly rounded `str::parse`:
serde_json's default float parsing may be one ulp off, which a bit-exact comparison would
report as a mismatch that is not there.
"""

import json
import math
import pathlib

import torch

# Each case: the scheduler's arguments, the optimizer's initial LR, and a generator of the
# observed series. Together they cover both modes, both threshold modes, cooldown, min_lr,
# eps (reductions torch skips because they would change the LR by less than eps), a value
# exactly at the relative threshold, and a NaN.
CASES = [
    {
        "name": "max-rel-goyal",
        "monitor": "metric",
        "args": {"mode": "max", "factor": 0.1, "patience": 3, "threshold": 1e-4,
                 "threshold_mode": "rel", "cooldown": 0, "min_lr": 0.0, "eps": 1e-8},
        "initial_lr": 3.2,
    },
    {
        "name": "min-abs-cooldown-min-lr",
        "monitor": "loss",
        "args": {"mode": "min", "factor": 0.5, "patience": 2, "threshold": 0.01,
                 "threshold_mode": "abs", "cooldown": 3, "min_lr": 0.01, "eps": 1e-8},
        "initial_lr": 0.1,
    },
    {
        "name": "min-rel-torch-defaults",
        "monitor": "metric",
        "args": {"mode": "min", "factor": 0.1, "patience": 10, "threshold": 1e-4,
                 "threshold_mode": "rel", "cooldown": 0, "min_lr": 0.0, "eps": 1e-8},
        "initial_lr": 0.4,
    },
]


def series(name):
    if name == "max-rel-goyal":
        # A rising accuracy that plateaus with noise, long enough for eps to stop the decay.
        xs = [0.9 - 0.5 * math.exp(-i / 8) + 0.004 * math.sin(1.3 * i) for i in range(140)]
        # Exactly the best so far times (1 + threshold): torch does not count it as better.
        best = max(xs[:20])
        xs[20] = best * (1e-4 + 1.0)
        return xs
    if name == "min-abs-cooldown-min-lr":
        xs = [0.3 + 2.0 * math.exp(-i / 10) + 0.02 * math.sin(2.1 * i) for i in range(90)]
        xs[45] = math.nan  # a diverged step: never an improvement
        return xs
    return [1.5 * math.exp(-i / 6) + 0.2 + 0.01 * math.cos(0.7 * i) for i in range(320)]


def run(case):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=case["initial_lr"])
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, **case["args"])
    calls = []
    reduce = sched._reduce_lr

    def recording(epoch):
        before = opt.param_groups[0]["lr"]
        reduce(epoch)
        calls.append((before, opt.param_groups[0]["lr"]))

    sched._reduce_lr = recording
    xs = series(case["name"])
    lrs = []
    for x in xs:
        sched.step(x)
        lrs.append(float(opt.param_groups[0]["lr"]))
    applied = sum(1 for b, a in calls if a != b)
    skipped = len(calls) - applied
    return xs, lrs, applied, skipped


def main():
    cases = []
    for case in CASES:
        xs, lrs, applied, skipped = run(case)
        assert applied >= 3 and skipped >= 1, (case["name"], applied, skipped)
        args = {k: (repr(v) if isinstance(v, float) else v) for k, v in case["args"].items()}
        cases.append({
            "name": case["name"],
            "monitor": case["monitor"],
            "args": args,
            "initial_lr": repr(case["initial_lr"]),
            "series": [repr(x) for x in xs],
            "lr": [repr(v) for v in lrs],
        })
        print(f"{case['name']}: {len(xs)} observations, {applied} reductions applied, "
              f"{skipped} skipped by min_lr/eps, final LR {lrs[-1]!r}")
    out = {"torch": torch.__version__, "cases": cases}
    path = (pathlib.Path(__file__).resolve().parent.parent
            / "plugins/lsgd-policy/tests/data/plateau-torch.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
