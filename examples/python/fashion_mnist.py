"""Fashion-MNIST for the examples, from the IDX files Debian's `dataset-fashion-mnist`
installs, with plain gzip and numpy (no torchvision)."""

import gzip
from pathlib import Path

import numpy as np
import torch


def read_idx(path):
    """An IDX file (MNIST's format, gzipped) as a numpy array: a magic whose last byte is the
    number of dimensions, the sizes as big-endian u32, then the u8 data."""
    raw = gzip.open(path).read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data, split, limit=None):
    """Images `[n, 1, 28, 28]` scaled to [0, 1] and labels of a split (`train` or `t10k`),
    the first `limit` of them."""
    x = read_idx(Path(data, f"{split}-images-idx3-ubyte.gz"))[:limit]
    y = read_idx(Path(data, f"{split}-labels-idx1-ubyte.gz"))[:limit]
    x = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
    return x, torch.from_numpy(y.astype(np.int64))
