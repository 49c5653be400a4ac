"""check_ranks across real ranks (torchrun, gloo): the same plugins pass; another parameter,
another step or another snapshot on one rank raises RanksDiffer naming that rank."""

import subprocess
import sys
import textwrap

from conftest import torchrun

SCRIPT = textwrap.dedent("""
    import sys
    import torch, torch.distributed as dist
    import lsgd_torch as lt

    dist.init_process_group("gloo")
    rank, case = dist.get_rank(), sys.argv[1]
    shape = dict(epochs=2, steps_per_epoch=10, global_batch=64, world_size=2)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    params = {"warmup_epochs": 2 if case == "params" and rank == 1 else 1}
    sched = lt.WasmLR(opt, "warmup", params=params, **shape)
    plateau = lt.WasmLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1),
                        "plateau", params={"patience": 0}, **shape)
    for step in range(10 + (case == "step" and rank == 1)):
        if case == "state" and step == 8:
            # Different metrics reach the plateau plugin: its snapshot differs, not its step.
            plateau.observe(metric=0.5 if rank == 1 else 0.9)
        for s in (sched, plateau):
            s.optimizer.step()
            s.step()
    try:
        lt.check_ranks()
        print(f"rank {rank}: same")
    except lt.RanksDiffer as e:
        print(f"rank {rank}: {e}")
    # Unflushed: exit_ranks flushes (the test reads both ranks' lines).
    lt.exit_ranks()
""")


def run(tmp_path, case):
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [torchrun(), "--standalone", "--nproc_per_node", "2", str(script), case],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_check_ranks_passes_the_same_plugins_and_names_the_rank_that_differs(tmp_path):
    out = run(tmp_path, "same")
    assert "rank 0: same" in out and "rank 1: same" in out, out
    out = run(tmp_path, "params")
    assert "schedule: rank 1 runs" in out and "with warmup_epochs=2, rank 0 with warmup_epochs=1" in out, out
    out = run(tmp_path, "step")
    assert "schedule: rank 1 is at step 11, rank 0 at step 10" in out, out
    out = run(tmp_path, "state")
    assert "schedule: rank 1's state at step 10 differs from rank 0's" in out, out


def test_exit_ranks_flushes_and_exits_with_its_code_outside_a_group():
    # stdout is a pipe here, so block-buffered: the line arrives only if exit_ranks flushed it.
    done = subprocess.run(
        [sys.executable, "-c", "import lsgd_torch; print('unflushed'); lsgd_torch.exit_ranks(3)"],
        capture_output=True, text=True, timeout=120,
    )
    assert (done.returncode, done.stdout) == (3, "unflushed\n"), done.stderr[-3000:]
