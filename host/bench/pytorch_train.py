"""The PyTorch side of `lsgd-host bench train`: the same model, data, batch, optimiser,
label smoothing, augmentation and threads as `lsgd-host run`, timed the same way (steps after a
warmup, including the data gather, augmentation, forward, backward and update). Prints one JSON
line.

Reads the IDX and CIFAR binary files itself (gzip + torch.frombuffer) so it needs nothing but
torch.
"""
import argparse
import gzip
import json
import os
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, kind, ndim = struct.unpack(">HBB", data[:4])
    assert zero == 0 and kind == 0x08, f"{path}: not a u8 IDX file"
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim :]), dtype=torch.uint8).view(*dims)


def find(data_dir, stem):
    for name in (stem, stem + ".gz"):
        p = os.path.join(data_dir, name)
        if os.path.exists(p):
            return p
    raise SystemExit(f"{data_dir}: no {stem}[.gz]")


def cnn(classes):
    # lsgd-host's `cnn` (host/src/model/cnn.rs): bias-free convs followed by BatchNorm.
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, classes))


def mlp(classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, classes))


def wide_mlp(classes, widths=(4096, 4096, 1536)):
    """An MLP whose gradient fills several 25 MiB buckets (26.3 M parameters, 105 MB): the
    overlap lab's (`scripts/bench-overlap.sh`), which gives lsgd-host the same module as a
    TorchScript file."""
    layers, inputs = [nn.Flatten()], 784
    for w in widths:
        layers += [nn.Linear(inputs, w), nn.ReLU()]
        inputs = w
    return nn.Sequential(*layers, nn.Linear(inputs, classes))


class Block(nn.Module):
    """lsgd-host's ResNet basic block (crates/train/src/model/resnet.rs), option A shortcut."""

    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.pad = (outputs - inputs) // 2 if stride != 1 or inputs != outputs else None

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        skip = x if self.pad is None else F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))
        return F.relu(y + skip)


def resnet(channels, classes, depth):
    n = (depth - 2) // 6
    layers, inputs = [nn.Conv2d(channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()], 16
    for stage, width in enumerate((16, 32, 64)):
        for i in range(n):
            layers.append(Block(inputs, width, 2 if stage > 0 and i == 0 else 1))
            inputs = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes)]
    return nn.Sequential(*layers)


def read_cifar(data_dir, dataset):
    """CIFAR's binary training records as [N, 3, 32, 32] bytes and labels."""
    names, record, label_at = {
        "cifar10": ([f"data_batch_{i}.bin" for i in range(1, 6)], 3073, 0),
        "cifar100": (["train.bin"], 3074, 1),
    }[dataset]
    sub = {"cifar10": "cifar-10-batches-bin", "cifar100": "cifar-100-binary"}[dataset]
    if not os.path.exists(os.path.join(data_dir, names[0])):
        data_dir = os.path.join(data_dir, sub)
    raw = b"".join(open(os.path.join(data_dir, n), "rb").read() for n in names)
    r = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(-1, record)
    return r[:, record - 3072 :].reshape(-1, 3, 32, 32), r[:, label_at].long()


def load(data_dir, dataset, model, depth):
    """The training images scaled to [0, 1], the per-channel mean and std, their labels and a
    fresh `model`."""
    if dataset in ("cifar10", "cifar100"):
        x, y = read_cifar(data_dir, dataset)
        classes = 10 if dataset == "cifar10" else 100
    else:
        x = read_idx(find(data_dir, "train-images-idx3-ubyte")).unsqueeze(1)
        y = read_idx(find(data_dir, "train-labels-idx1-ubyte")).long()
        classes = int(y.max()) + 1
    x = x.float().div_(255)
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    std = x.std(dim=(0, 2, 3), keepdim=True)
    c, h = x.shape[1], x.shape[2]
    net = {"cnn": lambda: cnn(classes), "mlp": lambda: mlp(classes),
           "wide-mlp": lambda: wide_mlp(classes),
           "resnet": lambda: resnet(c, classes, depth)}[model]()
    if model != "resnet" and (c, h) != (1, 28):
        raise SystemExit(f"the script's {model} is for 1×28×28 images")
    net.train()
    return x, mean, std, y, net


def cifar_augment(x):
    """torchvision's RandomCrop(size, padding=4) + RandomHorizontalFlip on a batch."""
    h, w = x.shape[2], x.shape[3]
    padded = F.pad(x, (4, 4, 4, 4))
    out = []
    for i in range(x.shape[0]):
        top, left = torch.randint(0, 9, (2,)).tolist()
        crop = padded[i, :, top : top + h, left : left + w]
        out.append(crop.flip(2) if torch.rand(()) < 0.5 else crop)
    return torch.stack(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--dataset", choices=["fashion-mnist", "mnist", "cifar10", "cifar100"],
                    default="fashion-mnist")
    ap.add_argument("--model", choices=["cnn", "mlp", "resnet"], default="cnn")
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--augment", choices=["none", "cifar"], default="none")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--epsilon", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    x, mean, std, y, model = load(a.data, a.dataset, a.model, a.depth)
    # On a GPU the whole data set lives there, as lsgd-host's batches are made on its device.
    x, mean, std, y, model = (t.to(a.device) for t in (x, mean, std, y, model))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4)
    # torch.amp as lsgd-host's --precision: autocast of the forward, fp32 loss, fp32 master
    # weights; fp16 with GradScaler's dynamic loss scaling.
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler(a.device, enabled=a.precision == "fp16")
    order = torch.randperm(len(y))
    pos, start, loss = 0, None, None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            if a.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        if pos + a.batch > len(order):
            order, pos = torch.randperm(len(y)), 0
        idx = order[pos : pos + a.batch].to(a.device)
        pos += a.batch
        xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        if a.augment == "cifar":
            xb = cifar_augment(xb)
        xb = (xb - mean) / std
        opt.zero_grad(set_to_none=False)
        with torch.autocast(a.device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(xb)
        loss = F.cross_entropy(logits.float(), yb, label_smoothing=a.epsilon)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        loss_value = loss.item()  # lsgd-host reads the loss every step too
    elapsed = time.perf_counter() - start
    print(json.dumps({"samples_per_s": a.steps * a.batch / elapsed, "seconds": elapsed,
                      "steps": a.steps, "last_loss": loss_value, "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "precision": a.precision,
                      "device": a.device}))


if __name__ == "__main__":
    main()
