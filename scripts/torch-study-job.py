"""The compression study's job (host/src/study/compression.rs, `Plan::new(false)`, `Plan::job`)
replicated in PyTorch: DistributedDataParallel over gloo under torchrun, uncompressed or with
PyTorch's own `powerSGD_hook`, to compare with `mpirun -np 2 lsgd-host run ... --codec
codec-powersgd`.

    source scripts/env.sh
    # uncompressed (DDP's built-in all-reduce), seed 1
    OMP_NUM_THREADS=1 nice -n 10 $LSGD_VENV/bin/torchrun --nproc_per_node 2 \
        scripts/torch-study-job.py --seed 1 --out /tmp/torch-plain-s1 \
        [--compare LSGD_RUN/metrics.jsonl] [--compare-weights LSGD_SAVED.safetensors]
    # PowerSGD: rank 2, error feedback, warm start, from step 2 (the hook's minimum)
    OMP_NUM_THREADS=1 nice -n 10 $LSGD_VENV/bin/torchrun --nproc_per_node 2 \
        scripts/torch-study-job.py --seed 1 --hook powersgd --out /tmp/torch-psgd-s1

The lsgd-host job it replicates (`lsgd-host study compression` runs it with `--quiet --device
cpu --threads 1 --dataset fashion-mnist --data-dir ...` under `mpirun --oversubscribe --bind-to
none`):

    mpirun --allow-run-as-root -np 2 lsgd-host run --model cnn --schedule warmup \
        --train-subset 12000 --test-subset 10000 --epochs 2 --global-batch 256 --base-lr 0.1 \
        --seed 1 --set schedule.warmup_epochs=0.5 --set schedule.milestones= \
        [--codec codec-powersgd --error-feedback mean|residual] --threads 1 --out DIR

What is replicated, and how:

- the model: host/bench/pytorch_train.py's `cnn` (lsgd-host's conv-BN-ReLU-pool x2, fc 128,
  fc 10), its parameters renamed as lsgd-host names them (conv1, bn1, conv2, bn2, fc1, fc2);
- the initial weights: lsgd-host's (crates/train/src/model/layers.rs on tch), redrawn here:
  `torch.manual_seed(seed)`, then U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for conv1.weight,
  conv2.weight, fc1.bias, fc1.weight, fc2.bias, fc2.weight in that order (tch draws a Linear's
  bias before its weight), BatchNorm gamma 1, beta 0. The same libtorch generator, so the bits
  are lsgd-host's; `--init-from FILE` loads a `lsgd-host run --stop-after-steps 0 --save-model
  FILE` instead and says whether it equals the redrawn one;
- the sample order: crates/train/src/order.rs (SplitMix64, a Fisher-Yates permutation per
  epoch from seed ^ epoch * 0xD1B54A32D192ED03, the epochs read as one stream so a batch may
  straddle two), each rank training its contiguous 1/k of each global batch
  (crates/train/src/parallel.rs); 94 steps of 256 for 2 epochs of 12,000;
- the inputs: bytes / 255, standardised by the training subset's own mean and (unbiased)
  standard deviation in float32 (crates/train/src/tensors.rs, augment.rs `channel_stats`);
- the LR: the `warmup` plugin's formula (plugins/lsgd-policy/src/lr.rs, warmup.rs) on lsgd-host's
  clock (epoch fraction = samples seen / training samples), base LR 0.1 at reference batch
  256; at global batch 256 its k is 1, so the LR is 0.1 at every step;
- the loss: cross-entropy, no label smoothing (no label-smoothing plugin); the logged loss is
  lsgd-host's: each rank's loss x its batch as float64, summed over ranks in float32, / 256;
- SGD: lsgd-host's default `pytorch` form with its exact tensor operations
  (crates/train/src/optim/sgd.rs): d = g + w*1e-4 (every parameter, BatchNorm and biases
  included), v = v*0.9 + d, w -= v*lr (`--sgd torch` uses torch.optim.SGD instead);
- BatchNorm: each rank keeps its own running statistics (DDP without buffer broadcasts), as
  lsgd-host's ranks do; momentum 0.1, eps 1e-5;
- evaluation: after each completed epoch, rank 0's model in eval mode on the first 10,000 test
  images in chunks of 1000, mean unsmoothed cross-entropy and top-1 accuracy
  (crates/train/src/eval.rs);
- gradients: DDP averages each rank's mean-loss gradient (divide by 2, sum), lsgd-host sums
  gradients of loss x 128/256: the same numbers (scaling by a power of two is exact).

`--hook powersgd` registers torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook with
matrix_approximation_rank=2, min_compression_rate=1, use_error_feedback=True, warm_start=True,
orthogonalization_epsilon=0, random_seed=--seed (or --powersgd-seed) and
start_powerSGD_iter=2, the smallest the hook accepts with error feedback or warm start: steps 0
and 1 are plain all-reduces (lsgd-host's codec compresses from step 0). Its gradients go in one
DDP bucket (--bucket-mb 25 > the model's 1.7 MB; the hook hangs on gloo with several buckets in
flight, crates/python/bench/bench_comm.py); the script checks that every step called the hook
once.

`--sync local-sgd|post-local-sgd|diloco` replicates lsgd-host's sync policies of the same
names (`--sync PLUGIN --set sync.period=H ...`) with PyTorch's own pieces where it has them:

- local-sgd: no DDP (each rank steps on its own shard's mean gradient), then
  `torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager(period=H,
  warmup_steps=H-1)` after every optimizer step, which averages the parameters after steps
  H-1, 2H-1, ... (the plugin's "average when (step+1) % H == 0"); `--last-average` also
  averages after the run's last step, as lsgd-host ends a run's last window;
- post-local-sgd: DDP with `post_localSGD_hook` (`PostLocalSGDState(start_localSGD_iter=W,
  post_local_gradient_allreduce=False)`: gradients all-reduced for the first W steps, then
  each rank's own) and `PeriodicModelAverager(period=H, warmup_steps=W)`, as PyTorch's
  `PostLocalSGDOptimizer` runs it;
- diloco: the algorithm of Douillard et al. (2023) written out, there being no CPU class for it
  in PyTorch: every H steps the pseudo-gradient theta_global - mean_k theta_k (the mean as
  `average_parameters` forms it: each rank's theta_k / k, all-reduced) becomes theta_global's
  gradient for a
  `torch.optim.SGD(lr=--outer-lr, momentum=--outer-momentum, nesterov=True)` step, and every
  rank continues from the new theta_global.

In every mode BatchNorm's statistics stay each rank's, as PeriodicModelAverager averages
parameters only. `--dump-weights DIR` writes rank 0's parameters after every step
(DIR/step-00000007.safetensors holds them after step 7), to compare with lsgd-host's
checkpoints of each step (`--checkpoint-every 1`).

Rank 0 writes --out/metrics.jsonl (lsgd-host's `step` and `eval` records, with the fields this
job has), --out/summary.json and --out/weights.safetensors (rank 0's final weights and BatchNorm
statistics, named as `lsgd-host run --save-model` names them), and prints the summary as one
JSON line. `--compare METRICS` prints the steps' losses beside an lsgd-host run's metrics.jsonl
and both accuracies; `--compare-weights FILE` the largest difference from lsgd-host's saved
weights.
"""

import argparse
import json
import math
import os
import pathlib
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "host" / "bench"))
from pytorch_ddp import exit_ranks, without_buffer_sync  # noqa: E402
from pytorch_train import cnn, find, read_idx  # noqa: E402

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
MASK = (1 << 64) - 1


# --- crates/train/src/order.rs ---------------------------------------------------------------

class SampleOrder:
    """The training set as an endless stream of epochs, each a permutation from (seed, epoch)."""

    def __init__(self, seed, length):
        self.seed, self.len, self.cached = seed, length, None

    def permutation(self, epoch):
        state = (self.seed ^ ((epoch * 0xD1B5_4A32_D192_ED03) & MASK)) & MASK
        p = list(range(self.len))
        for i in range(self.len - 1, 0, -1):
            # SplitMix64's next(), then below(i + 1) by multiply-shift.
            state = (state + 0x9E37_79B9_7F4A_7C15) & MASK
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & MASK
            z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & MASK
            z ^= z >> 31
            j = (z * (i + 1)) >> 64
            p[i], p[j] = p[j], p[i]
        return p

    def take(self, start, count):
        """The sample indices at stream positions start .. start + count."""
        out, pos = [], start
        while len(out) < count:
            epoch = pos // self.len
            if self.cached is None or self.cached[0] != epoch:
                self.cached = (epoch, self.permutation(epoch))
            perm = self.cached[1]
            frm = pos % self.len
            n = min(count - len(out), self.len - frm)
            out.extend(perm[frm:frm + n])
            pos += n
        return out


# --- plugins/lsgd-policy: the `warmup` schedule on lsgd-host's clock ---------------------------

def warmup_lr(a, samples_seen, train_len):
    """lsgd_policy::warmup::Warmup::learning_rate, linear scaling, gradual warmup."""
    r = a.global_batch / a.reference_batch
    eta = a.base_lr * r
    e = samples_seen / train_len
    w = a.warmup_epochs
    if e < w:
        k = r if r > 1.0 else 1.0
        return eta * (1.0 / k) * (1.0 + (k - 1.0) * e / w)
    lr = eta
    for m in a.milestones:
        if e >= m:
            lr *= a.gamma
        else:
            break
    return lr


# --- safetensors, read and written by hand (the venv need not have the package) ---------------

def read_safetensors(path):
    data = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header, base, out = json.loads(data[8:8 + n]), 8 + n, {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        if v["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {v['dtype']}, not F32")
        a, b = v["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[base + a:base + b]),
                                     dtype=torch.float32).view(v["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        b = tensors[name].detach().contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


# --- the model, named and initialised as lsgd-host's ------------------------------------------

def lsgd_names(model):
    """lsgd-host's name of each state_dict entry of pytorch_train's Sequential cnn."""
    names, count = {}, {}
    for idx, module in model.named_children():
        kind = {nn.Conv2d: "conv", nn.BatchNorm2d: "bn", nn.Linear: "fc"}.get(type(module))
        if kind is None:
            continue
        count[kind] = count.get(kind, 0) + 1
        for key in module.state_dict():
            if key != "num_batches_tracked":
                names[f"{idx}.{key}"] = f"{kind}{count[kind]}.{key}"
    return names


def lsgd_init(model, seed):
    """lsgd-host's initial weights (tch's VarStore under tch::manual_seed(seed), layers.rs)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in model.children():
            if isinstance(module, nn.Conv2d):
                bound = 1.0 / math.sqrt(module.weight[0].numel())
                module.weight.copy_(torch.zeros(module.weight.shape).uniform_(-bound, bound))
            elif isinstance(module, nn.Linear):
                bound = 1.0 / math.sqrt(module.in_features)
                # tch's nn::linear creates (and draws) the bias before the weight.
                module.bias.copy_(torch.zeros(module.bias.shape).uniform_(-bound, bound))
                module.weight.copy_(torch.zeros(module.weight.shape).uniform_(-bound, bound))
            elif isinstance(module, nn.BatchNorm2d):
                module.reset_parameters()


def named_state(model, names):
    sd = model.state_dict()
    return {names[k]: sd[k] for k in names}


# --- data: crates/train/src/tensors.rs ---------------------------------------------------------

def unit(raw):
    return raw.to(torch.float32) / 255.0


def load_data(a):
    xtr = read_idx(find(a.data, "train-images-idx3-ubyte")).unsqueeze(1)[:a.train_subset]
    ytr = read_idx(find(a.data, "train-labels-idx1-ubyte")).long()[:a.train_subset]
    xte = read_idx(find(a.data, "t10k-images-idx3-ubyte")).unsqueeze(1)[:a.test_subset]
    yte = read_idx(find(a.data, "t10k-labels-idx1-ubyte")).long()[:a.test_subset]
    images = unit(xtr)
    means, stds = [], []
    for ch in range(images.shape[1]):
        plane = images.select(1, ch)
        means.append(plane.mean(dtype=torch.float32))
        stds.append(plane.std(unbiased=True).clamp_min(1e-6))
    mean = torch.stack(means).view(1, -1, 1, 1)
    std = torch.stack(stds).view(1, -1, 1, 1)
    return xtr.contiguous(), ytr, xte.contiguous(), yte, mean, std


def evaluate(model, xte, yte, mean, std):
    """crates/train/src/eval.rs: eval mode, chunks of 1000, unsmoothed CE and top-1."""
    model.eval()
    loss_sum, correct, n = 0.0, 0, len(yte)
    with torch.no_grad():
        for start in range(0, n, 1000):
            x = (unit(xte[start:start + 1000]) - mean) / std
            y = yte[start:start + 1000]
            logits = model(x).float()
            loss_sum += F.cross_entropy(logits, y, reduction="sum").double().item()
            correct += int(logits.argmax(-1).eq(y).sum())
    model.train()
    return loss_sum / n, correct / n


# --- comparison with an lsgd-host run ---------------------------------------------------------

def compare(path, steps, evals, show):
    theirs = [json.loads(line) for line in open(path) if line.strip()]
    their_steps = {r["step"]: r for r in theirs if r.get("kind") == "step"}
    their_evals = {r["epoch"]: r for r in theirs if r.get("kind") == "eval"}
    print(f"step  loss lsgd-host       loss torch          |diff|     lr lsgd-host  lr torch")
    worst, first_diff = 0.0, None
    for s in steps:
        t = their_steps.get(s["step"])
        if t is None:
            continue
        d = abs(t["loss"] - s["loss"])
        worst = max(worst, d)
        if d != 0.0 and first_diff is None:
            first_diff = s["step"]
        if s["step"] < show or s["step"] == steps[-1]["step"]:
            print(f"{s['step']:4d}  {t['loss']:.12f}  {s['loss']:.12f}  {d:.3e}  "
                  f"{t['lr']:<12g}  {s['lr']:g}")
    print(f"max |loss diff| over {len(steps)} steps: {worst:.3e}; first step that differs: "
          f"{first_diff}; lr equal at every step: "
          f"{all(their_steps.get(s['step'], {}).get('lr') == s['lr'] for s in steps)}")
    for e in evals:
        t = their_evals.get(e["epoch"])
        if t:
            print(f"epoch {e['epoch']}: test accuracy lsgd-host {100 * t['test_acc']:.2f}% "
                  f"(loss {t['test_loss']:.6f}), torch {100 * e['test_acc']:.2f}% "
                  f"(loss {e['test_loss']:.6f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=FASHION_MNIST, help="Fashion-MNIST's IDX files")
    ap.add_argument("--train-subset", type=int, default=12_000)
    ap.add_argument("--test-subset", type=int, default=10_000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--base-lr", type=float, default=0.1)
    ap.add_argument("--reference-batch", type=int, default=256)
    ap.add_argument("--warmup-epochs", type=float, default=0.5)
    ap.add_argument("--milestones", default="", help="comma-separated epochs ('' = none)")
    ap.add_argument("--gamma", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--sgd", choices=["lsgd", "torch"], default="lsgd",
                    help="lsgd: lsgd-host's SGD operations; torch: torch.optim.SGD")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hook", choices=["none", "powersgd"], default="none")
    ap.add_argument("--powersgd-rank", type=int, default=2)
    ap.add_argument("--start-powersgd-iter", type=int, default=2)
    ap.add_argument("--powersgd-seed", type=int,
                    help="the hook's random_seed, which draws its first Q (default: --seed)")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--sync", choices=["none", "local-sgd", "post-local-sgd", "diloco"],
                    default="none", help="a sync policy (see above)")
    ap.add_argument("--period", type=int, default=8, help="H of --sync")
    ap.add_argument("--warmup-steps", type=int, default=0, help="W of post-local-sgd")
    ap.add_argument("--outer-lr", type=float, default=0.7, help="diloco's outer LR")
    ap.add_argument("--outer-momentum", type=float, default=0.9, help="diloco's outer momentum")
    ap.add_argument("--last-average", action="store_true",
                    help="also average after the last step (lsgd-host's end of a run)")
    ap.add_argument("--dump-weights", help="directory for rank 0's parameters after each step")
    ap.add_argument("--init-from", help="lsgd-host --save-model safetensors of step 0")
    ap.add_argument("--out", help="directory for metrics.jsonl, summary.json, weights")
    ap.add_argument("--compare", help="an lsgd-host run's metrics.jsonl to print beside")
    ap.add_argument("--compare-weights", help="an lsgd-host --save-model file of the end")
    ap.add_argument("--show-steps", type=int, default=10)
    a = ap.parse_args()
    a.milestones = [float(m) for m in a.milestones.split(",") if m.strip()]

    started = time.perf_counter()
    if "RANK" not in os.environ:  # plain `python`: one rank
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT="29517", LOCAL_RANK="0")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.global_batch % world:
        raise SystemExit(f"--global-batch {a.global_batch} is not divisible by {world} ranks")
    torch.set_num_threads(a.threads)

    xtr, ytr, xte, yte, mean, std = load_data(a)
    n_train = len(ytr)
    model = cnn(int(ytr.max()) + 1)
    names = lsgd_names(model)
    lsgd_init(model, a.seed)
    init_note = "redrawn as lsgd-host draws it"
    if a.init_from:
        saved = read_safetensors(a.init_from)
        mine = named_state(model, names)
        same = all(torch.equal(mine[k], saved[k]) for k in mine)
        by_name = {v: k for k, v in names.items()}
        model.load_state_dict({by_name[k]: saved[k] for k in mine}, strict=False)
        init_note = f"loaded from {a.init_from} (bit-identical to the redrawn one: {same})"
    model.train()

    if a.sync in ("local-sgd", "diloco"):
        ddp = model  # no gradient exchange: each rank's own mean gradient
    else:
        ddp = DDP(model, bucket_cap_mb=a.bucket_mb, **without_buffer_sync())
    hook_calls = []
    averager, outer, global_params = None, None, None
    if a.sync in ("local-sgd", "post-local-sgd"):
        from torch.distributed.algorithms.model_averaging.averagers import \
            PeriodicModelAverager
        warmup = a.period - 1 if a.sync == "local-sgd" else a.warmup_steps
        averager = PeriodicModelAverager(period=a.period, warmup_steps=warmup)
    if a.sync == "post-local-sgd":
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState, post_localSGD_hook)
        ddp.register_comm_hook(
            PostLocalSGDState(process_group=None, subgroup=None,
                              start_localSGD_iter=a.warmup_steps,
                              post_local_gradient_allreduce=False),
            post_localSGD_hook)
    if a.sync == "diloco":
        global_params = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        outer = torch.optim.SGD(global_params, lr=a.outer_lr, momentum=a.outer_momentum,
                                nesterov=True)
    if a.hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        psgd_seed = a.seed if a.powersgd_seed is None else a.powersgd_seed
        state = psgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=a.powersgd_rank,
            start_powerSGD_iter=a.start_powersgd_iter, min_compression_rate=1,
            use_error_feedback=True, warm_start=True, orthogonalization_epsilon=0,
            random_seed=psgd_seed)

        def counted(st, bucket):
            hook_calls.append((bucket.index(), bucket.buffer().numel()))
            return psgd.powerSGD_hook(st, bucket)

        ddp.register_comm_hook(state, counted)

    params = list(model.parameters())
    if a.sgd == "torch":
        opt = torch.optim.SGD(params, lr=a.base_lr, momentum=a.momentum,
                              weight_decay=a.weight_decay)
    history = [torch.zeros_like(p) for p in params]

    order = SampleOrder(a.seed, n_train)
    per = a.global_batch // world
    total = n_train * a.epochs
    seen, step, evaluated = 0, 0, 0
    steps, evals = [], []
    metrics = None
    if rank == 0 and a.out:
        os.makedirs(a.out, exist_ok=True)
        metrics = open(os.path.join(a.out, "metrics.jsonl"), "w")
    dist.barrier()
    train_start = time.perf_counter()
    while seen < total:
        t0 = time.perf_counter()
        lr = warmup_lr(a, seen, n_train)
        batch = order.take(seen, a.global_batch)
        idx = torch.tensor(batch[rank * per:(rank + 1) * per], dtype=torch.int64)
        x = (unit(xtr.index_select(0, idx)) - mean) / std
        y = ytr.index_select(0, idx)
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        calls_before = len(hook_calls)
        loss = F.cross_entropy(ddp(x).float(), y)
        loss.backward()  # DDP: each rank's gradient / world, summed
        if a.hook != "none" and len(hook_calls) - calls_before != 1:
            raise SystemExit(f"step {step}: {len(hook_calls) - calls_before} hook calls, "
                             "expected one bucket")
        # lsgd-host's `agree`: loss x batch in float64, summed over the ranks in float32.
        agreed = torch.tensor([loss.detach().double().item() * per], dtype=torch.float32)
        dist.all_reduce(agreed)
        mean_loss = float(agreed[0]) / a.global_batch
        with torch.no_grad():
            if a.sgd == "torch":
                for g in opt.param_groups:
                    g["lr"] = lr
                opt.step()
            else:
                for p, v in zip(params, history):
                    d = p.grad
                    if a.weight_decay != 0.0:
                        d = d + p * a.weight_decay
                    if a.momentum == 0.0:
                        p.sub_(d * lr)
                    else:
                        v.mul_(a.momentum).add_(d)
                        p.sub_(v * lr)
            last = seen + a.global_batch >= total
            if averager is not None:
                w = averager.warmup_steps
                averages = step >= w and (step - w) % averager.period == 0
                averager.average_parameters(params)
                if last and a.last_average and not averages:
                    # lsgd-host ends the run's last window; the averager's own counter has
                    # already moved on, so average directly as it would.
                    from torch.distributed.algorithms.model_averaging.utils import \
                        average_parameters
                    average_parameters(iter(params), dist.group.WORLD)
            if outer is not None and ((step + 1) % a.period == 0 or (last and a.last_average)):
                for g, p in zip(global_params, params):
                    avg = p.detach() / world  # average_parameters' order: divide, then sum
                    dist.all_reduce(avg)
                    g.grad = g.detach() - avg
                outer.step()
                for g, p in zip(global_params, params):
                    p.copy_(g.detach())
        if a.dump_weights and rank == 0:
            os.makedirs(a.dump_weights, exist_ok=True)
            write_safetensors(os.path.join(a.dump_weights, f"step-{step:08d}.safetensors"),
                              {names[f"{k}"]: v for k, v in model.state_dict().items()
                               if k in names and not k.endswith(("running_mean", "running_var"))})
        epoch_fraction = seen / n_train
        seen += a.global_batch
        rec = {"kind": "step", "step": step, "epoch": epoch_fraction, "lr": lr,
               "global_batch": a.global_batch, "loss": mean_loss,
               "samples_per_s": a.global_batch / (time.perf_counter() - t0)}
        steps.append(rec)
        step += 1
        if metrics:
            metrics.write(json.dumps(rec) + "\n")
        completed = min(seen // n_train, a.epochs)
        if completed > evaluated:
            evaluated = completed
            if rank == 0:
                test_loss, acc = evaluate(model, xte, yte, mean, std)
                e = {"kind": "eval", "step": step, "epoch": completed, "test_loss": test_loss,
                     "test_acc": acc, "elapsed_s": time.perf_counter() - train_start}
                evals.append(e)
                print(f"epoch {completed}/{a.epochs}: test loss {test_loss:.4f}, "
                      f"test accuracy {100 * acc:.2f}%", flush=True)
                if metrics:
                    metrics.write(json.dumps(e) + "\n")
                    metrics.flush()
    dist.barrier()
    train_s = time.perf_counter() - train_start
    buckets = sorted({b for b, _ in hook_calls})
    if rank == 0:
        summary = {
            "hook": a.hook, "seed": a.seed, "ranks": world, "steps": step,
            "test_acc": evals[-1]["test_acc"] if evals else None,
            "test_loss": evals[-1]["test_loss"] if evals else None,
            "accuracy_per_epoch": [e["test_acc"] for e in evals],
            "last_loss": steps[-1]["loss"], "train_s": train_s,
            "wall_s": time.perf_counter() - started, "init": init_note, "sgd": a.sgd,
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "hook_buckets": buckets,
            "bucket_floats": sorted({n for _, n in hook_calls}),
        }
        if a.hook == "powersgd":
            summary.update(powersgd_rank=a.powersgd_rank, start_powerSGD_iter=a.start_powersgd_iter,
                           random_seed=psgd_seed,
                           compression=state.compression_stats()[0])
        final = named_state(model, names)
        if a.out:
            write_safetensors(os.path.join(a.out, "weights.safetensors"), final)
            # Closed here: exit_ranks leaves without finalizing, so nothing is closed for us.
            with open(os.path.join(a.out, "summary.json"), "w") as f:
                json.dump(summary, f, indent=1)
            metrics.close()
        if a.compare:
            compare(a.compare, steps, evals, a.show_steps)
        if a.compare_weights:
            theirs = read_safetensors(a.compare_weights)
            diffs = {k: float((final[k] - theirs[k]).abs().max()) for k in final}
            identical = all(torch.equal(final[k], theirs[k]) for k in final)
            print(f"final weights vs {a.compare_weights}: bit-identical {identical}, "
                  f"max |diff| {max(diffs.values()):.3e} ({max(diffs, key=diffs.get)})")
        print(json.dumps(summary), flush=True)
    exit_ranks()


if __name__ == "__main__":
    main()
