"""The PyTorch side of `lsgd-host bench train`: the same model, data, batch, optimiser,
label smoothing and threads as `lsgd-host run`, timed the same way (steps after a warmup,
including the data gather, forward, backward and update). Prints one JSON line.

Reads the IDX files itself (gzip + torch.frombuffer) so it needs nothing but torch.
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


def load(data_dir, model):
    """The standardised training images, their labels and a fresh `model` ("cnn" or "mlp")."""
    x = read_idx(find(data_dir, "train-images-idx3-ubyte")).float().div_(255).unsqueeze(1)
    y = read_idx(find(data_dir, "train-labels-idx1-ubyte")).long()
    x = (x - x.mean()) / x.std()
    net = (cnn if model == "cnn" else mlp)(int(y.max()) + 1)
    net.train()
    return x, y, net


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--epsilon", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    x, y, model = load(a.data, a.model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4)
    # torch.amp as lsgd-host's --precision: autocast of the forward, fp32 loss, fp32 master
    # weights; fp16 with GradScaler's dynamic loss scaling.
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler("cpu", enabled=a.precision == "fp16")
    order = torch.randperm(len(y))
    pos, start, loss = 0, None, None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            start = time.perf_counter()
        if pos + a.batch > len(order):
            order, pos = torch.randperm(len(y)), 0
        idx = order[pos : pos + a.batch]
        pos += a.batch
        xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(xb)
        loss = F.cross_entropy(logits.float(), yb, label_smoothing=a.epsilon)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        loss_value = loss.item()  # lsgd-host reads the loss every step too
    elapsed = time.perf_counter() - start
    print(json.dumps({"samples_per_s": a.steps * a.batch / elapsed, "seconds": elapsed,
                      "steps": a.steps, "last_loss": loss_value, "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "precision": a.precision}))


if __name__ == "__main__":
    main()
