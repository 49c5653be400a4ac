"""DDP training with gradients compressed by an lsgd-host codec plugin (lsgd-torch's comm hook).

A small MLP on Fashion-MNIST, on CPU with gloo, trained twice from the same weights and the same
sample order with --baseline: once with DDP's default all-reduce, once through the codec. Rank 0
prints each run's test accuracy and the payload bytes each rank sent per step.

    torchrun --nproc_per_node 2 examples/python/ddp_codec.py \
        --codec codec-top-k --set density=0.01 --baseline
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import lsgd_torch
from lsgd_torch import CodecState, codec_hook

from fashion_mnist import load


def train(args, train_set, test_set, codec):
    """Trains from seed `args.seed`; returns test accuracy (%) and bytes sent per step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = DDP(nn.Sequential(nn.Linear(784, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)))
    state = None
    if codec:
        params = dict(s.split("=", 1) for s in args.set)
        state = CodecState(
            None, codec, params=params, error_feedback=not args.no_error_feedback,
            seed=args.seed, names=model,
        )
        model.register_comm_hook(state, codec_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    x, y = train_set
    # Every rank draws the same global batches and trains on its own slice of each.
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed))
    batch = args.batch * world
    for step in range(args.steps):
        start = step % (len(x) // batch) * batch
        mine = order[start : start + batch][rank::world]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[mine]), y[mine]).backward()
        opt.step()
    with torch.no_grad():
        accuracy = (model(test_set[0]).argmax(1) == test_set[1]).float().mean().item() * 100
    sent = state.total_bytes_sent / args.steps if state else 4 * sum(
        p.numel() for p in model.parameters()
    )
    # The hook gives every rank the same bits, so the replicas never drift apart.
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    digests = [None] * world
    dist.all_gather_object(digests, lsgd_torch.blake3_hex(weights))
    assert len(set(digests)) == 1, f"ranks' weights differ: {digests}"
    return accuracy, sent


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--codec", default="codec-top-k", help="codec plugin (path or name)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a codec parameter, repeatable")
    p.add_argument("--no-error-feedback", action="store_true")
    p.add_argument("--baseline", action="store_true",
                   help="also train with DDP's default all-reduce, from the same start")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    # Plain SGD: with heavy momentum on top of error feedback a top-k run needs more steps to
    # catch up (lsgd-host's `--error-feedback momentum`, DGC's correction, is for that case).
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--train-samples", type=int, default=20000)
    p.add_argument("--test-samples", type=int, default=5000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", help="directory of Fashion-MNIST's IDX .gz files",
                   default=os.environ.get("LSGD_DATA", "/usr/share/datasets/fashion-mnist"))
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    # The model is an mlp: flattened images.
    train_set, test_set = (
        (x.flatten(1), y)
        for x, y in (load(args.data, "train", args.train_samples),
                     load(args.data, "t10k", args.test_samples))
    )
    runs = [("all-reduce", None)] if args.baseline else []
    runs.append((args.codec, args.codec))
    for label, codec in runs:
        accuracy, sent = train(args, train_set, test_set, codec)
        if dist.get_rank() == 0:
            print(f"{label}: accuracy {accuracy:.2f}% after {args.steps} steps, "
                  f"{sent:.0f} bytes/step sent per rank", flush=True)
    # Not destroy_process_group: gloo may abort at interpreter exit (docs/pytorch.md, "Ending").
    lsgd_torch.exit_ranks()


if __name__ == "__main__":
    main()
