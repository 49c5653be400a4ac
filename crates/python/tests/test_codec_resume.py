"""The codec hook survives PyTorch's checkpoint: a 2-rank DDP run whose CodecState went through
torch.save and torch.load(weights_only=True) and resumed in new processes equals the
uninterrupted run bit for bit (losses, parameters, residuals and codec states), for top-k with
error feedback and for PowerSGD (warm-start state and error feedback), with and without
parameter names. What cannot resume exactly says so: a checkpoint taken before DDP's first
bucket rebuild, and one rank's state loaded on every rank."""

import json
import subprocess
import textwrap

import pytest

from conftest import torchrun

STEPS = 5
# name: (plugin, params, error_feedback, names given, checkpoint after step, rank whose file
# every rank loads (None: its own), DDP's options).
RUNS = {
    "top-k": ["codec-top-k", {"density": 0.05}, True, True, 2, None, {}],
    "powersgd": ["codec-powersgd", {"rank": 2}, True, False, 3, None, {}],
    "powersgd-mean": ["codec-powersgd", {"rank": 1}, "mean", True, 2, None, {}],
    # DDP rebuilds its buckets after its second iteration here: two steps on its first ones.
    "static-graph": ["codec-powersgd", {"rank": 2}, True, False, 3, None, {"static_graph": True}],
    "before-rebuild": ["codec-top-k", {"density": 0.05}, True, False, 1, None, {}],
    "rank-0-file": ["codec-top-k", {"density": 0.05}, True, False, 2, 0, {}],
}

SCRIPT = textwrap.dedent(
    """
    import gc, hashlib, json, logging, sys
    from pathlib import Path
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    import lsgd_torch
    from lsgd_torch import CodecState, codec_hook

    mode, out, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    runs = json.loads(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    log = out / f"{mode}-rank{rank}.log"
    logging.basicConfig(filename=log, level=logging.WARNING, format="%(message)s")
    report = {}
    for run, (plugin, params, feedback, named, k, file_rank, options) in runs.items():
        logging.warning("=== %s", run)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                              nn.Linear(64, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        start = 0
        if mode == "resume":
            ckpt = out / f"{run}-rank{rank if file_rank is None else file_rank}.pt"
            saved = torch.load(ckpt, weights_only=True)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            state, start = saved["codec"], saved["step"]
        else:
            state = CodecState(None, plugin, params=params, error_feedback=feedback, seed=3)
        # Several buckets once DDP has rebuilt them; its first step has one of everything.
        ddp = DDP(model, bucket_cap_mb=0.01, **options)
        if named:
            state.set_names(ddp)
        ddp.register_comm_hook(state, codec_hook)
        steps_seen = []
        for step in range(start, steps):
            if mode == "full" and step == k:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                            "codec": state, "step": step}, out / f"{run}-rank{rank}.pt")
            # Each rank its own batch, so that the ranks' residuals differ.
            g = torch.Generator().manual_seed(100 * rank + step)
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
            steps_seen.append([step, loss.item().hex(), hashlib.sha256(weights).hexdigest()])
        record = state._rank_record()
        report[run] = {"steps": steps_seen, "state": record["state"],
                       "residuals": record["residuals"], "layouts": repr(state.layouts)}
        del ddp, state
    # Every rank keeps the same layouts and codec states (residuals are each rank's own).
    gc.collect()
    lsgd_torch.check_ranks()
    (out / f"{mode}-rank{rank}.json").write_text(json.dumps(report))
    logging.shutdown()
    lsgd_torch.exit_ranks()
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each rank's report and log of the uninterrupted runs and of the resumed ones."""
    out = tmp_path_factory.mktemp("resume")
    script = out / "resume.py"
    script.write_text(SCRIPT)
    found = {}
    for mode in ["full", "resume"]:
        done = subprocess.run(
            [torchrun(), "--standalone", "--nproc_per_node", "2", str(script), mode, str(out),
             str(STEPS), json.dumps(RUNS)],
            capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr[-5000:]
        for rank in range(2):
            report = json.loads((out / f"{mode}-rank{rank}.json").read_text())
            logs = (out / f"{mode}-rank{rank}.log").read_text().split("=== ")
            for run in RUNS:
                log = next(part for part in logs if part.startswith(run + "\n"))
                found[mode, rank, run] = (report[run], log)
    return found


def resumed_against_full(runs, rank, run):
    """(the uninterrupted run's steps from the checkpoint on, the resumed run's steps, both
    reports, the resumed run's log)."""
    (full, _), (resumed, log) = runs["full", rank, run], runs["resume", rank, run]
    k = RUNS[run][4]
    assert [s[0] for s in resumed["steps"]] == list(range(k, STEPS))
    return full["steps"][k:], resumed["steps"], full, resumed, log


@pytest.mark.parametrize("run", ["top-k", "powersgd", "powersgd-mean", "static-graph"])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_resumed_run_equals_the_uninterrupted_one_bit_for_bit(runs, rank, run):
    want, got, full, resumed, log = resumed_against_full(runs, rank, run)
    # Every step's loss (float.hex) and the parameters after it (sha256 of their bytes).
    assert got == want
    # ... and what the state keeps: layouts, codec states (compared by check_ranks) and this
    # rank's own residuals.
    assert (resumed["layouts"], resumed["state"]) == (full["layouts"], full["state"])
    assert resumed["residuals"] == full["residuals"] is not None
    assert "codec hook" not in log, log


@pytest.mark.parametrize("rank", [0, 1])
def test_a_checkpoint_before_ddps_first_rebuild_resumes_on_its_first_buckets_and_says_so(
    runs, rank
):
    # Saved after step 0 only, the state holds DDP's first buckets, and the rebuilt ones are
    # not known before DDP builds them after the resumed step 1: that step runs on the first
    # buckets (one for every parameter), the uninterrupted run's on the rebuilt ones.
    want, got, _, _, log = resumed_against_full(runs, rank, "before-rebuild")
    assert got[0][1] == want[0][1], "step 1's loss comes before its exchange"
    assert got[0][2] != want[0][2]
    assert "DDP rebuilt its buckets for step 2; step 1 ran on DDP's first buckets" in log, log
    assert "the checkpoint was taken before DDP's first rebuild" in log, log


@pytest.mark.parametrize("rank", [0, 1])
def test_one_ranks_state_loaded_on_every_rank_is_reported(runs, rank):
    # As PyTorch's ImageNet example saves: rank 0's checkpoint only. Rank 1 then adds rank 0's
    # residuals to its gradients, so neither rank's run is the uninterrupted one.
    want, got, _, _, log = resumed_against_full(runs, rank, "rank-0-file")
    assert got[0][2] != want[0][2]
    warned = "rank 1 goes on with the residuals rank 0 saved" in log
    assert warned == (rank == 1), log
