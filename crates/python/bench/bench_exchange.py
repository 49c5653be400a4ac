"""Where one bucket's exchange spends its time, on one rank: the codec plugin's encode and
decode (each a call into the sandbox with the bucket's bytes going in and out), the whole
exchange (``Codec.exchange``) without error feedback, with GRACE's residual (one more decode,
of this rank's own payload) and with the mean residual, the mover's collectives within it, and
a plain copy of the bucket for scale.

    python crates/python/bench/bench_exchange.py [--floats N] [--repeat R] [PLUGIN ...]

A world of one rank (gloo), so the collectives cost almost nothing and what is left is the
hook's own work. Milliseconds per bucket, best of the repetitions.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

from lsgd_torch import CodecState
from lsgd_torch._native import Codec
from lsgd_torch.comm import _Mover


class Timed(_Mover):
    """The hook's mover, adding up the time spent in each collective."""

    def __init__(self, *args):
        super().__init__(*args)
        self.spent = 0.0

    def _timed(self, f, *args):
        t = time.perf_counter()
        out = f(*args)
        self.spent += time.perf_counter() - t
        return out

    def lengths(self, length):
        return self._timed(super().lengths, length)

    def sum(self, element, payload):
        return self._timed(super().sum, element, payload)

    def gather(self, payload):
        return self._timed(super().gather, payload)


def best(f, repeat):
    f()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("plugins", nargs="*", default=["codec-identity", "codec-fp16",
                                                    "codec-powersgd", "codec-top-k"])
    ap.add_argument("--floats", type=int, default=1 << 20)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29621")
    dist.init_process_group("gloo", rank=0, world_size=1)
    n = args.floats
    side = int(n**0.5)
    data = torch.randn(n, generator=torch.Generator().manual_seed(0))
    out, residual = torch.empty(n), torch.empty(n)
    scratch = data.clone()
    copy = best(lambda: scratch.copy_(data), args.repeat)
    print(f"one rank, a bucket of {n} floats ({4 * n >> 20} MiB); best of {args.repeat}, ms; "
          f"copying the bucket once: {copy:.2f}")
    print(f"{'codec':<16}{'encode':>8}{'decode':>8}{'exchange':>10}{'+EF own':>9}{'+EF mean':>10}"
          f"{'collectives':>13}")
    for plugin in args.plugins:
        params = {"rank": 2} if plugin == "codec-powersgd" else {}
        if plugin == "codec-top-k":
            params = {"density": 0.01}
        state = CodecState(None, plugin, params=params)
        codec = state.codec
        shape = [side, n // side] if side * (n // side) == n else [n]
        meta = Codec.meta(0, 0, 0, 0, n, [("w", shape, 0, 0, n)], b"")
        payloads = []
        for r in range(codec.rounds):
            payloads.append(codec.encode(meta, data.numpy(), payloads, round=r))
        encode = best(lambda: codec.encode(meta, data.numpy(), payloads[:-1],
                                           round=codec.rounds - 1), args.repeat)
        decode = best(lambda: codec.decode(meta, payloads, out.numpy()), args.repeat)
        mover = Timed(state, dist.group.WORLD, "bucket 0")

        def exchange(own):
            def run():
                scratch.copy_(data)
                codec.exchange(meta, scratch.numpy(), mover, rank=0, size=1, own=own,
                               residual=None if own == "skip" else residual.numpy())
            return run

        plain = best(exchange("skip"), args.repeat)
        mover.spent = 0.0
        own = best(exchange("decode"), args.repeat)
        moved = mover.spent / (args.repeat + 1) * 1e3
        mean = best(exchange("mean"), args.repeat)
        print(f"{plugin:<16}{encode:>8.2f}{decode:>8.2f}{plain:>10.2f}{own:>9.2f}{mean:>10.2f}"
              f"{moved:>13.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
