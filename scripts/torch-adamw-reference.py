"""Writes the reference trajectory that lsgd-train's AdamW is tested against
(crates/train/tests/data/adamw-torch.json): torch.optim.AdamW, single-tensor CPU path, on
two parameters whose gradients are exact binary fractions (the gradient of sum(c * w) is c),
over 100 steps at a changing learning rate. Regenerate with

    bash scripts/setup.sh --python-torch
    ~/.cache/lsgd-host/venv/bin/python scripts/torch-adamw-reference.py

The Rust test (optim::adamw::tests::a_hundred_steps_match_torch_optim) rebuilds the same
problem from the JSON's inputs and compares every step's weights.
"""

import json
import pathlib

import torch

STEPS = 100
SHAPES = {"a": [3, 4], "b": [4]}
CONFIG = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.05}


def lr(t):
    return 0.01 * (1 + t % 7) / 4


def initial(name, n):
    # Exact in binary32: multiples of 1/16 in [-1, 1).
    off = 3 if name == "a" else 11
    return [((j * 5 + off) % 32 - 16) / 16 for j in range(n)]


def gradient(name, n, t):
    off = 1 if name == "a" else 4
    return [((j * 7 + t * 13 + off) % 17 - 8) / 8 for j in range(n)]


def main():
    params = {}
    for name, shape in SHAPES.items():
        n = 1
        for d in shape:
            n *= d
        params[name] = torch.tensor(initial(name, n), dtype=torch.float32).reshape(shape)
        params[name].requires_grad_(True)
    opt = torch.optim.AdamW(
        params.values(),
        lr=lr(0),
        betas=(CONFIG["beta1"], CONFIG["beta2"]),
        eps=CONFIG["eps"],
        weight_decay=CONFIG["weight_decay"],
        foreach=False,
        fused=False,
    )
    trajectory = []
    for t in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = lr(t)
        opt.zero_grad()
        loss = sum(
            (torch.tensor(gradient(name, p.numel(), t)).reshape(p.shape) * p).sum()
            for name, p in params.items()
        )
        loss.backward()
        opt.step()
        trajectory.append({n: p.detach().reshape(-1).tolist() for n, p in params.items()})
    out = {
        "torch": torch.__version__,
        "config": CONFIG,
        "shapes": SHAPES,
        "steps": STEPS,
        "weights": trajectory,
    }
    path = pathlib.Path(__file__).resolve().parent.parent / "crates/train/tests/data/adamw-torch.json"
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {path} ({STEPS} steps, torch {torch.__version__})")


if __name__ == "__main__":
    main()
