"""What the codec comm hook costs per DDP step, at 1M-float buckets, against PyTorch's own hooks
on the same job: DDP's default all-reduce (``allreduce_hook``), ``fp16_compress_hook`` and
``powerSGD_hook``.

    torchrun --nproc_per_node 2 crates/python/bench/bench_comm.py [--steps N] [--layers L]

or one rank per host of the lab (scripts/netlab.sh; docs/pytorch.md has the command), where
Open MPI starts the ranks and MASTER_ADDR names the first host.

The job is L bias-free 1024x1024 linear layers (each weight 2^20 floats, the host's largest
bucket, in a bucket of its own), a batch of 64 per rank, gloo on CPU. Rank 0 prints ms per step
(forward, backward with the hook, SGD step; best of the repetitions, interleaved), the ratio to
the default all-reduce and the payload bytes each rank sends per step, all measured in this one
run. Run it on a quiet machine; plugins are compiled (and cached) during the warm-up steps.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from lsgd_torch import CodecState, codec_hook, exit_ranks

SIDE = 1024
RANK = 2  # PowerSGD's matrix rank, for PyTorch's hook and the plugin alike


def hooks(layers, overlap=True):
    """(label, make, one_bucket) where make() returns (hook state, hook, bytes-sent function)."""
    n = SIDE * SIDE * layers
    powersgd_bytes = 2 * SIDE * RANK * 4 * layers

    def torch_powersgd():
        # Warm-up iterations run the plain all-reduce; the timed ones are past them.
        state = powerSGD_hook.PowerSGDState(
            None, matrix_approximation_rank=RANK, start_powerSGD_iter=2, min_compression_rate=2
        )
        return state, powerSGD_hook.powerSGD_hook, lambda: powersgd_bytes

    def codec(plugin, feedback, **params):
        def make():
            state = CodecState(None, plugin, params=params, error_feedback=feedback,
                               overlap=overlap)
            return state, codec_hook, lambda: state.bytes_sent

        return make

    return [
        ("allreduce_hook", lambda: (None, default_hooks.allreduce_hook, lambda: 4 * n), False),
        ("fp16_compress_hook", lambda: (None, default_hooks.fp16_compress_hook, lambda: 2 * n),
         False),
        # Observed with torch 2.13 on gloo: with two buckets or more in flight, powerSGD_hook
        # hangs (its future callbacks block on nested all-reduces), so its layers share one
        # bucket; it still compresses each weight on its own.
        ("powerSGD_hook rank 2 *", torch_powersgd, True),
        # Like for like: PyTorch's all-reduce and fp16 hooks keep no residual, its PowerSGD
        # keeps p - decode(sum)/k ("mean"); top-k and int8 keep GRACE's p - decode(own).
        ("codec-identity", codec("codec-identity", False), False),
        ("codec-fp16", codec("codec-fp16", False), False),
        ("codec-powersgd rank 2 EF mean", codec("codec-powersgd", "mean", rank=RANK), False),
        ("codec-top-k 1% EF own", codec("codec-top-k", "own", density=0.01), False),
        ("codec-int8 EF own", codec("codec-int8", "own"), False),
    ]


def job(layers, make, one_bucket, warmup):
    """A fresh DDP model with the hook, warmed up; returns (step function, bytes-sent function,
    model)."""
    torch.manual_seed(0)
    model = DDP(
        nn.Sequential(*[nn.Linear(SIDE, SIDE, bias=False) for _ in range(layers)]),
        bucket_cap_mb=4 * layers if one_bucket else 4,
    )
    state, hook, sent = make()
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, SIDE, generator=torch.Generator().manual_seed(dist.get_rank()))

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    for _ in range(warmup):
        step()
    return step, sent, model


def timed(step, steps):
    dist.barrier()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    return (time.perf_counter() - t) / steps * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per repetition")
    ap.add_argument("--repetitions", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--no-overlap", action="store_true",
                    help="the codec hook exchanges every bucket on DDP's thread (overlap=False)")
    ap.add_argument("--only", nargs="*", default=None, metavar="HOOK",
                    help="time only the hooks whose labels start with these (and allreduce_hook)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
        # Started by mpirun (the lab): torch's env:// rendezvous from Open MPI's names.
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
        os.environ.setdefault("MASTER_PORT", "29610")
    dist.init_process_group("gloo")
    configs = hooks(args.layers, overlap=not args.no_overlap)

    # Same gradients first, or the comparison is meaningless: identity is the all-reduce.
    plain, _, a = job(args.layers, *configs[0][1:], 3)
    ident, _, b = job(args.layers, *configs[3][1:], 3)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
    del plain, ident, a, b

    if args.only is not None:
        keep = ("allreduce_hook", *args.only)
        configs = [c for c in configs if c[0].startswith(keep)]
    jobs = [(label, *job(args.layers, make, one, 3)) for label, make, one in configs]
    best = {label: float("inf") for label, *_ in jobs}
    for _ in range(args.repetitions):
        for label, step, _, _ in jobs:
            best[label] = min(best[label], timed(step, args.steps))
    if dist.get_rank() == 0:
        base = best["allreduce_hook"]
        floats = SIDE * SIDE * args.layers
        print(f"{dist.get_world_size()} ranks (gloo, CPU), {args.layers} buckets of {SIDE * SIDE} "
              f"floats; best of {args.repetitions} x {args.steps} steps")
        print(f"{'hook':<31}{'ms/step':>10}{'x allreduce':>13}{'bytes/step/rank':>17}{'ratio':>8}")
        for label, _, sent, _ in jobs:
            b = sent()
            print(f"{label:<31}{best[label]:>10.1f}{best[label] / base:>13.2f}{b:>17}"
                  f"{4 * floats / b:>8.1f}")
        print("* its layers in one bucket: powerSGD_hook hangs on gloo with several in flight")
    exit_ranks()


if __name__ == "__main__":
    main()
