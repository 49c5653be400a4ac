"""The PyTorch side of `lsgd-host bench ddp`: the job of `mpirun -np N lsgd-host run` as
DistributedDataParallel over gloo, launched by `torchrun --nproc_per_node N`. Same model,
data, optimiser, label smoothing and threads per rank as lsgd-host, the same global batch
split the same way (every rank draws the same shuffled order and trains on its contiguous
1/N of each global batch), one gradient bucket cap for both. Rank 0 prints one JSON line.

The models and the IDX reader come from pytorch_train.py (`bench train`), which must sit in
the same directory; the inputs are normalised as there.
"""
import argparse
import inspect
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from pytorch_train import load


class BucketTimes:
    """The seconds each bucket's all-reduce took, as `timed_allreduce` records them."""

    def __init__(self):
        self.seconds = []

    def take(self):
        """The seconds recorded since the last take, one per bucket."""
        out, self.seconds = self.seconds, []
        return out


def timed_allreduce(times, bucket):
    """DDP's default communication (the bucket divided by the world size, then summed by
    all_reduce), also recording into `times` the seconds from the hook call to the
    all-reduce's completion callback.

    DDP launches a bucket's all-reduce as soon as its gradients are ready and overlaps it with
    the rest of backward, so these are seconds in flight, not seconds added to the step (and
    buckets in flight together are each counted in full)."""
    start = time.perf_counter()
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())

    def done(fut):
        # Runs on the backend's thread once the all-reduce has completed.
        times.seconds.append(time.perf_counter() - start)
        return fut.value()[0]

    return dist.all_reduce(tensor, async_op=True).get_future().then(done)


def without_buffer_sync():
    """DDP's keyword that stops it broadcasting rank 0's buffers before every forward:
    `forward_sync_buffers` where this torch has it (`broadcast_buffers` is deprecated there)."""
    if "forward_sync_buffers" in inspect.signature(DDP).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def exit_ranks():
    """Ends every rank together without finalizing the interpreter: torch's gloo worker threads
    outlive destroy_process_group and may abort the exit (lsgd_torch.exit_ranks, which this
    PyTorch-only script does not import, says how)."""
    sys.stdout.flush()
    sys.stderr.flush()
    dist.barrier()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--dataset", choices=["fashion-mnist", "cifar10"], default="fashion-mnist")
    ap.add_argument("--model", choices=["cnn", "mlp", "wide-mlp", "resnet"], default="cnn")
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--epsilon", type=float, default=0.1)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--seed", type=int, default=0)
    # `builtin` leaves DDP's own C++ all-reduce in place (no communication time), to check
    # that the timed hook costs nothing.
    ap.add_argument("--hook", choices=["timed", "builtin"], default="timed")
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.global_batch % world:
        raise SystemExit(f"--global-batch {a.global_batch} is not divisible by {world} ranks")
    per_rank = a.global_batch // world
    torch.set_num_threads(a.threads)
    # The same seed on every rank: the same initial weights (DDP broadcasts rank 0's anyway)
    # and the same sample order, from which each rank cuts its own shard.
    torch.manual_seed(a.seed)

    x, mean, std, y, model = load(a.data, a.dataset, a.model, a.depth)
    # Standardised once: the timed steps are the exchange's, not the data's.
    x = (x - mean) / std
    # lsgd-host keeps each rank's BatchNorm running statistics to itself, so DDP does not
    # broadcast rank 0's buffers before every forward either. At the default 25 MiB DDP is
    # left its default, whose first bucket is 1 MiB as lsgd-host's; an explicit bucket_cap_mb
    # makes DDP's first bucket that size too (lsgd-host's stays at most 1 MiB).
    cap = None if a.bucket_mb == 25.0 else a.bucket_mb
    ddp = DDP(model, bucket_cap_mb=cap, **without_buffer_sync())
    timer = None
    if a.hook == "timed":
        timer = BucketTimes()
        ddp.register_comm_hook(timer, timed_allreduce)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9, weight_decay=a.weight_decay)

    order = torch.randperm(len(y))
    pos, start, loss_value = 0, None, None
    comm, buckets = [], []
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            dist.barrier()
            start = time.perf_counter()
        if pos + a.global_batch > len(order):
            order, pos = torch.randperm(len(y)), 0
        idx = order[pos + rank * per_rank : pos + (rank + 1) * per_rank]
        pos += a.global_batch
        xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(ddp(xb), yb, label_smoothing=a.epsilon)
        loss.backward()
        opt.step()
        loss_value = loss.item()  # lsgd-host reads the loss every step too
        if timer is not None:
            seconds = timer.take()
            if step >= a.warmup:
                comm.append(sum(seconds))
                buckets.append(len(seconds))
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({
            "samples_per_s": a.steps * a.global_batch / elapsed,
            "seconds": elapsed,
            "steps": a.steps,
            "step_s": elapsed / a.steps,
            "comm_s_per_step": sum(comm) / len(comm) if comm else None,
            "buckets_per_step": sum(buckets) / len(buckets) if buckets else None,
            "last_loss": loss_value,
            "torch": torch.__version__,
            "backend": dist.get_backend(),
            "world_size": world,
            "threads": torch.get_num_threads(),
            "hook": a.hook,
        }), flush=True)
    exit_ranks()


if __name__ == "__main__":
    main()
