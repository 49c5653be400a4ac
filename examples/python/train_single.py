"""Single-process Fashion-MNIST training with three lsgd-host plugins driving PyTorch.

The same .wasm files that `lsgd-host run` loads set, at every step:

- the learning rate: `warmup` (Goyal et al.: `--base-lr` scaled linearly from 256 samples to
  the batch, reached by a gradual warmup over the first epoch) through `WasmLR`, an ordinary
  `torch.optim.lr_scheduler.LRScheduler`;
- the label-smoothing epsilon: `label-smoothing` through `WasmLabelSmoothing`;
- each layer's share of that rate: `lars` (You et al.) through `WasmLayerRate`, which wraps
  the SGD optimizer.

A small CNN with BatchNorm trains on the first `--steps-per-epoch × --global-batch` training
images (one "epoch") and is evaluated on the test set after every epoch.

    python examples/python/train_single.py            # 50 steps: 5 epochs of 5120 images
    python examples/python/train_single.py --steps 1170 --steps-per-epoch 117   # 10 real epochs

The plugins are looked up by name in LSGD_PLUGIN_PATH, as `lsgd-host` does.
"""

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from fashion_mnist import load
from lsgd_torch import WasmLabelSmoothing, WasmLayerRate, WasmLR


class Cnn(nn.Module):
    """Two conv–BN–ReLU–pool stages and a linear head: weights, biases and BatchNorm
    parameters, the three roles a layer-rate plugin tells apart."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 7 * 7, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


@torch.no_grad()
def evaluate(model, x, y):
    """Mean loss and accuracy (%) on a held-out set, in eval mode (BatchNorm's running
    statistics)."""
    model.eval()
    logits = model(x)
    model.train()
    return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item() * 100


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                   help="directory of the gzipped IDX files")
    p.add_argument("--steps", type=int, default=50, help="optimizer steps to take")
    p.add_argument("--steps-per-epoch", type=int, default=10,
                   help="steps per epoch: an epoch is this many batches of the training set")
    p.add_argument("--global-batch", type=int, default=512)
    p.add_argument("--base-lr", type=float, default=0.1,
                   help="learning rate at 256 samples; warmup scales it to the batch")
    p.add_argument("--test-subset", type=int, default=None, help="evaluate on this many images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    per_epoch = args.steps_per_epoch * args.global_batch
    x, y = load(args.data, "train", per_epoch)
    if len(x) < per_epoch:
        p.error(f"--steps-per-epoch × --global-batch = {per_epoch} is more than the "
                f"{len(x)} training images")
    # Standardised with the training images' own statistics, as lsgd-host does.
    mean, std = x.mean(), x.std()
    x = (x - mean) / std
    test_x, test_y = load(args.data, "t10k", args.test_subset)
    test_x = (test_x - mean) / std

    # The run's shape: every plugin sees the same clock (step, epoch, batch) as in lsgd-host.
    epochs = math.ceil(args.steps / args.steps_per_epoch)
    shape = dict(steps_per_epoch=args.steps_per_epoch, epochs=epochs,
                 global_batch=args.global_batch)

    model = Cnn()
    sgd = torch.optim.SGD(model.parameters(), lr=args.base_lr, momentum=0.9, weight_decay=1e-4)
    # LARS = SGD + the `lars` plugin. model= names the tensors and finds the BatchNorm ones,
    # which lars leaves at multiplier 1 (as it does biases).
    optimizer = WasmLayerRate(sgd, "lars", {"coefficient": 0.01}, model=model, **shape)
    # The scheduler takes the wrapper like any optimizer: they share the parameter groups.
    schedule = WasmLR(optimizer, "warmup", params={"warmup_epochs": 1}, **shape)
    # ε from 0.1 down to 0 over the run.
    smoothing = WasmLabelSmoothing("label-smoothing",
                                   params={"epsilon": 0.1, "final_epsilon": 0.0}, **shape)

    print(f"{args.steps} steps of {args.global_batch} ({epochs} epochs of "
          f"{args.steps_per_epoch} steps) with {schedule.policy.name}, {smoothing.policy.name} "
          f"and {optimizer.policy.name}")
    generator = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    for step in range(args.steps):
        at = step % args.steps_per_epoch
        if at == 0:
            order = torch.randperm(per_epoch, generator=generator)
        batch = order[at * args.global_batch : (at + 1) * args.global_batch]
        lr, epsilon = optimizer.param_groups[0]["lr"], float(smoothing)

        loss = F.cross_entropy(model(x[batch]), y[batch], label_smoothing=epsilon)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # LARS: each tensor at lr × its multiplier

        # Plugins that react to training (plateau, say) read the loss as `last-loss`.
        schedule.observe(loss=loss)
        smoothing.observe(loss=loss)
        schedule.step()
        smoothing.step()
        print(f"step {step:4d}  lr {lr:.4f}  epsilon {epsilon:.3f}  loss {loss.item():.4f}")

        if (step + 1) % args.steps_per_epoch == 0 or step + 1 == args.steps:
            test_loss, accuracy = evaluate(model, test_x, test_y)
            # An evaluation becomes `last-metric`, as after an epoch in lsgd-host.
            schedule.observe(metric=accuracy / 100)
            smoothing.observe(metric=accuracy / 100)
            rates = "  ".join(f"{name} {s:.3g}" for name, s in optimizer.last_multipliers.items()
                              if s != 1.0)
            print(f"epoch {(step + 1) / args.steps_per_epoch:.2f}: test loss {test_loss:.4f}, "
                  f"test accuracy {accuracy:.2f}%  (lars multipliers: {rates})")
    print(f"test accuracy {accuracy:.2f}% after {args.steps} steps "
          f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
