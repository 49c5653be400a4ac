"""What a sandboxed schedule costs per step: ``WasmLR.step()`` against ``LambdaLR`` computing
the same formula (Goyal et al.'s gradual warmup, linear scaling, step decay) in Python.

    python crates/python/bench/bench_lr.py [--steps N] [--plugin warmup]

Prints µs per ``step()`` for each and their ratio, measured in this one run (best of 5
repetitions each, interleaved). Run it on a quiet machine; the plugin is compiled (and cached)
before timing starts.
"""

import argparse
import time

import torch

from lsgd_torch import WasmLR

EPOCHS, STEPS_PER_EPOCH, BATCH, BASE_LR = 90, 100, 8192, 0.1


def goyal(step):
    """The warmup plugin's default formula as a LambdaLR factor of the base rate."""
    k = BATCH / 256
    epoch = step / STEPS_PER_EPOCH
    if epoch < 5:
        factor = 1 + (k - 1) * epoch / 5
    else:
        factor = k * 0.1 ** sum(epoch >= m for m in (30, 60, 80))
    return factor


def time_steps(make, steps):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=BASE_LR)
    sched = make(opt)
    opt.step()
    t = time.perf_counter()
    for _ in range(steps):
        sched.step()
    return (time.perf_counter() - t) / steps * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--plugin", default="warmup")
    args = ap.parse_args()
    shape = dict(epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH, global_batch=BATCH)
    wasm = lambda opt: WasmLR(opt, args.plugin, **shape)
    torch_ = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, goyal)
    # Same values first, or the comparison is meaningless.
    a, b = [torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=BASE_LR) for _ in "ab"]
    sa, sb = wasm(a), torch_(b)
    for _ in range(1000):
        assert abs(sa.get_last_lr()[0] - sb.get_last_lr()[0]) <= 1e-12 * sb.get_last_lr()[0]
        a.step(), b.step(), sa.step(), sb.step()
    import warnings
    warnings.simplefilter("ignore")
    best = {"WasmLR": float("inf"), "LambdaLR": float("inf")}
    for _ in range(5):
        best["WasmLR"] = min(best["WasmLR"], time_steps(wasm, args.steps))
        best["LambdaLR"] = min(best["LambdaLR"], time_steps(torch_, args.steps))
    print(f"scheduler.step() over {args.steps} steps, best of 5, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    for name, us in best.items():
        print(f"  {name:9} {us:8.2f} µs/step")
    print(f"  WasmLR / LambdaLR = {best['WasmLR'] / best['LambdaLR']:.2f}")


if __name__ == "__main__":
    main()
