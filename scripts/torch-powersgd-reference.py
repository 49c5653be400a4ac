"""Runs PyTorch's own `powerSGD_hook` on given gradients over a two-rank gloo group and writes,
for every step, what it computed: the oracle for lsgd-host's `codec-powersgd` with warm start
(tests/all/powersgd_torch.rs).

    bash scripts/setup.sh --python-torch
    ~/.cache/lsgd-host/venv/bin/python scripts/torch-powersgd-reference.py IN.json OUT_DIR

IN.json holds `shapes` (the bucket's tensors, in order), `rank` (PowerSGD's r), `ranks`,
`steps`, `error_feedback`, `warm_start`, `grads` (a file of little-endian float32: for each step,
each rank's whole bucket, as DDP hands it to a comm hook: the rank's own gradient, not divided by
the number of ranks) and `q0` (a file of little-endian float32: every compressed tensor's
initial Q, m × r row-major, in bucket order).

The hook runs from its first PowerSGD step (`state.iter` starts at `start_powerSGD_iter`), with
`min_compression_rate=1` and the initial Qs put into `q_memory_dict`, so that with warm start it
begins from `q0` (orthogonalised, as it orthogonalises a kept Q) instead of its own draw. The
tensors must have distinct shapes: the hook groups them by shape, and with distinct shapes its
P and Q memories hold them in bucket order.

OUT_DIR/rank{r}.json gets, per step: `p_hat` and `q` (each compressed tensor's orthogonalised P,
n × r, and its all-reduced Q divided by the number of ranks, m × r, both row-major, as the hook
keeps them), `out` (the bucket the hook returns) and `error` (the rank's error-feedback residual,
empty without). Floats are Python reprs, which read back exactly.
"""

import json
import os
import pathlib
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps


class Bucket:
    """What powerSGD_hook reads of DDP's GradBucket: a flat buffer over the bucket's tensors."""

    def __init__(self, flat, shapes):
        self.flat, self.shapes = flat, shapes

    def buffer(self):
        return self.flat

    def index(self):
        return 0

    def is_last(self):
        return True

    def gradients(self):
        views, at = [], 0
        for shape in self.shapes:
            n = int(np.prod(shape))
            views.append(self.flat[at : at + n].view(shape))
            at += n
        return views


def floats(t):
    return [repr(float(x)) for x in t.reshape(-1).tolist()]


def rank_main(rank, spec, out_dir, store):
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=spec["ranks"]
    )
    torch.set_num_threads(1)
    shapes = [tuple(s) for s in spec["shapes"]]
    n = sum(int(np.prod(s)) for s in shapes)
    grads = np.fromfile(spec["grads"], dtype="<f4").reshape(spec["steps"], spec["ranks"], n)
    q0 = torch.from_numpy(np.fromfile(spec["q0"], dtype="<f4").copy())
    r = spec["rank"]
    state = ps.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=r,
        start_powerSGD_iter=2,
        min_compression_rate=1,
        use_error_feedback=spec["error_feedback"],
        warm_start=spec["warm_start"],
        orthogonalization_epsilon=0,
    )
    state.iter = state.start_powerSGD_iter
    compressed = []
    for s in shapes:
        rows, cols = s[0], int(np.prod(s[1:])) if len(s) > 1 else 1
        rr = min(rows, cols, r)
        if ps._should_compress(rows, cols, rr, 1)[0]:
            compressed.append((rows, cols, rr))
    state.p_memory_dict[0] = torch.empty(sum(a * c for a, _, c in compressed))
    state.q_memory_dict[0] = q0
    steps = []
    for step in range(spec["steps"]):
        flat = torch.from_numpy(grads[step, rank].copy())
        out = ps.powerSGD_hook(state, Bucket(flat, shapes)).wait()
        p_at = q_at = 0
        p_hat, q = [], []
        for rows, cols, rr in compressed:
            p_hat.append(floats(state.p_memory_dict[0][p_at : p_at + rows * rr]))
            q.append(floats(state.q_memory_dict[0][q_at : q_at + cols * rr]))
            p_at += rows * rr
            q_at += cols * rr
        error = state.error_dict.get(0, torch.empty(0)) if spec["error_feedback"] else torch.empty(0)
        steps.append({"p_hat": p_hat, "q": q, "out": floats(out), "error": floats(error)})
    (pathlib.Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(steps))
    dist.barrier()
    # Not destroy_process_group and a normal exit: gloo's worker threads outlive the group and
    # may abort the interpreter's finalization (lsgd_torch.exit_ranks says how).
    os._exit(0)


def main():
    spec = json.loads(pathlib.Path(sys.argv[1]).read_text())
    out_dir = pathlib.Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    store = out_dir / "pg-store"
    store.unlink(missing_ok=True)
    mp.spawn(rank_main, args=(spec, str(out_dir), str(store)), nprocs=spec["ranks"])


if __name__ == "__main__":
    main()
