"""``check_ranks``: the proof that every rank runs the same policies, at the same step, in the
same state, which no scheduler or comm-hook library gives."""

import os
import sys

import torch.distributed as dist

from ._plugins import live


class RanksDiffer(RuntimeError):
    """Ranks loaded different plugins or parameters, or are at different steps or states;
    ``problems`` has one line per difference, each naming the rank."""

    def __init__(self, problems):
        super().__init__("the ranks' plugins differ:\n  " + "\n  ".join(problems))
        #: One line per difference.
        self.problems = problems


def _records():
    return [h._rank_record() for h in live()]


def _differences(rank, theirs, root):
    """How rank ``rank``'s records differ from rank 0's, one line each (the host's wording
    for plugins, then the step and the state)."""
    out = []
    if len(theirs) != len(root):
        kinds = lambda rs: ", ".join(r["kind"] for r in rs) or "none"
        return [f"rank {rank} has {len(theirs)} plugins ({kinds(theirs)}), rank 0 has "
                f"{len(root)} ({kinds(root)})"]
    for a, b in zip(theirs, root):
        kind = b["kind"]
        if a["kind"] != kind:
            out.append(f"rank {rank} has a {a['kind']} plugin where rank 0 has a {kind} plugin")
        elif a["blake3"] != b["blake3"]:
            out.append(f"{kind}: rank {rank} runs {a['label']} (blake3 {a['blake3'][:12]}…), "
                       f"rank 0 runs {b['label']} (blake3 {b['blake3'][:12]}…)")
        elif a["params"] != b["params"]:
            mine = ", ".join(f"{k}={v}" for k, v in a["params"] if [k, v] not in _pairs(b))
            root_ = ", ".join(f"{k}={v}" for k, v in b["params"] if [k, v] not in _pairs(a))
            out.append(f"{kind}: rank {rank} runs {a['label']} with {mine}, rank 0 with {root_}")
        elif a["step"] != b["step"]:
            out.append(f"{kind}: rank {rank} is at step {a['step']}, rank 0 at step {b['step']}")
        elif a.get("window") != b.get("window"):
            out.append(f"{kind}: rank {rank} is at window {a.get('window')}, rank 0 at window "
                       f"{b.get('window')} (local steps, windows ended)")
        elif a["state"] != b["state"]:
            out.append(f"{kind}: rank {rank}'s state at step {a['step']} differs from rank 0's "
                       f"(snapshot blake3 {str(a['state'])[:12]}… vs {str(b['state'])[:12]}…)")
    return out


def _pairs(record):
    return [list(p) for p in record["params"]]


def check_ranks(group=None):
    """Checks that all ranks of ``group`` (default: the world) hold the same lsgd-torch plugins
    (component bytes and parameters), at the same step, with the same snapshots of stateful
    plugins and, for a codec hook, the same bucket layouts and codec states (its residuals
    differ by rank: reported, not compared); raises ``RanksDiffer`` naming each rank that
    differs.
    A collective: every rank calls it at the same point. Returns this rank's records."""
    mine = _records()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return mine
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    problems = []
    for rank, theirs in enumerate(everyone[1:], start=1):
        problems += _differences(rank, theirs, everyone[0])
    if problems:
        raise RanksDiffer(problems)
    return mine


def exit_ranks(code=0, group=None):
    """Ends this rank's process with ``code`` once every rank of ``group`` has called it:
    flushes standard output and error, waits at a barrier, then leaves without finalizing the
    interpreter (``os._exit``), so close the files you wrote first.
    torch 2.13's gloo worker threads outlive ``destroy_process_group``; one that drops a
    finished collective's tensors while the interpreter finalizes cannot take the GIL, and the
    process aborts ("terminate called without an active exception"), now and then, more often
    on a loaded machine. A collective: every rank calls it."""
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group)
    os._exit(code)
