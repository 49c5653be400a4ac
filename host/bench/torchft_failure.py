"""How much time torchft (Meta's per-step fault tolerance for data-parallel training) loses
when one replica group of a small CPU job is SIGKILLed, how many samples the job drops while
that group is gone, and how long a fresh replacement takes to rejoin.

    source scripts/env.sh
    $LSGD_VENV/bin/pip install torchft==0.2.0      # keeps the venv's torch (needs torch>=2.7)
    $LSGD_VENV/bin/python host/bench/torchft_failure.py                   # 2 groups
    $LSGD_VENV/bin/python host/bench/torchft_failure.py --groups 3
    $LSGD_VENV/bin/python host/bench/torchft_failure.py --kill-mode parent --hook safe
    $LSGD_VENV/bin/python host/bench/torchft_failure.py --steps 1200 --rejoin 10
    $LSGD_VENV/bin/python host/bench/torchft_failure.py --heartbeat-timeout-ms 1000

The job. The parent starts torchft's Rust lighthouse (the `torchft_lighthouse` console script
of the wheel: `--bind [::]:PORT --min_replicas M --quorum_tick_ms 100 --join_timeout_ms 60000
--heartbeat_timeout_ms 5000`, torchft's defaults but for --min_replicas) and N replica groups
(--groups, default 2), each one CPU process with torch.set_num_threads(1), its own TCPStore, a
torchft.Manager (ProcessGroupGloo, replica_id group_<g>, min_replica_size M, use_async_quorum,
init_sync=False since every group draws the same seeded weights, timeout/quorum_timeout/
connect_timeout 60 s), torchft.DistributedDataParallel and torchft.Optimizer (the loop of
torchft's train_ddp.py: zero_grad() starts the quorum, backward all-reduces through the
manager, should_commit() decides whether SGD steps). The model is host/bench/pytorch_train.py's
`mlp` (784-256-256-10) on Fashion-MNIST read from the Debian package's IDX files
(/usr/share/datasets/fashion-mnist, or where `dpkg -L dataset-fashion-mnist` puts them),
--train-subset 12000 images standardised, SGD lr 0.1 momentum 0.9 weight decay 1e-4, global
batch 256 split over the groups (128+128, or 86+85+85 for 3): the global batch of step s is
positions s*256.. of one seeded sample stream, indexed by the Manager's committed step so a
retried or healed step trains on the right batch. M (--min-replicas) defaults to a majority,
N//2+1, except 1 for 2 groups: a majority of 2 is 2, and then no quorum can form after one
failure (measured below). Training runs --steps 60 steps; at --kill-at 20 the last group dies:

- --kill-mode self (default): it SIGKILLs itself just before starting step 20, i.e. before
  asking for that step's quorum;
- --kill-mode parent: the parent SIGKILLs it as soon as its log shows step 19 committed, so it
  dies somewhere inside step 20, usually inside the gradient all-reduce.

Every group logs one JSON line per step attempt (time.monotonic at its end, committed or not,
participants, error) to --out/group<g>.<incarnation>.jsonl; stderr, with torchft's INFO log,
goes to group<g>.<i>.log and the lighthouse's to lighthouse.log. The parent prints (and writes
to --out/summary.json) the median step before the failure (committed steps 1..19 of the first
survivor), the median degraded step, the attempts around the failure, time_lost_s = (end of
the first step the survivors committed without the victim) - (end of their last step with it)
- one median step, the steps each survivor committed and its failed attempts, and the samples
dropped. Samples dropped: for every step index the survivors committed, the global batch minus
the shares of the groups that committed that step while participating (torchft's DYNAMIC world
size averages over the groups present, so the lost group's share is simply not trained on and
the effective batch shrinks; a healing replica contributes zeros, so its heal step counts too);
a failed attempt is retried on the same batch, so it costs time, not samples. --rejoin M starts
a fresh process for the dead group once the survivors have committed step kill_at+M and reports
the seconds from spawning it to its being ready (Manager built: mostly `import torch`), to its
first committed step (it heals: fetches the weights and step over torchft's HTTP checkpoint
transport, taking no part in that step) and to its first participating step, and what that
join cost the survivors' slowest step.

Measured here (2-core VM, no GPU, torch 2.13.0 CPU wheel in the project venv, torchft 0.2.0
from PyPI, Python 3.11; all 3 runs of each line unless said; step times vary ~2x run to run on
this shared 2-core machine):

  groups  kill    median step  time lost (s)          survivor steps      samples dropped
  2       self    13-21 ms     5.02 5.06 5.08         60/60, 0 failed     5120 (40 x 128)
  2       parent  12-13 ms     5.02 5.04 5.05 (safe)  60/60, 1 failed     5120 (40 x 128)
  3       self    23-27 ms     5.06 5.03 5.00         60/60 each          3400 (40 x 85)
  3       parent  21-39 ms     5.03-5.11 in 15 runs,  60/60 each, 0-1     3400 (40 x 85)
                               60.03 in 1 (safe)      failed attempt
  2 / 3   self, --heartbeat-timeout-ms 1000: lost 1.03 0.99 / 0.99 1.06 s
  no failure (--kill-at -1): median step 16 ms (2 groups), 25 ms (3 groups); with one group
  gone the survivors' steps take 6-8 ms (2 groups) and 11-21 ms (3 groups)
  rejoin (--rejoin 10, --steps 1200 / 800), 2 runs each: spawn->ready 4.58 4.59 s (2 groups),
  4.67 4.66 s (3 groups); ready->participating 0.05-0.08 s; spawn->participating 4.64 4.64 /
  4.74 4.74 s; the survivors' join step cost 18-36 ms over the median; one heal step (not
  participating) then participating from the next step.

What sets the lost time. The survivors' next quorum waits for the lighthouse: the dead group
is no longer asking, but it counts as healthy until its last heartbeat (every 100 ms) is
--heartbeat_timeout_ms old, and until then the lighthouse refuses a quorum ("need at least
half of 2 healthy workers" for 2 groups; "waiting for 1 healthy but not participating
stragglers due to join timeout" for 3, where --join_timeout_ms 60000 would be the other bound).
So the time lost per failure is the heartbeat timeout, 5.0-5.1 s by default and 1.0 s with
1000, independent of the step time; a kill inside the all-reduce adds one failed attempt
(30-70 ms: gloo reports "Connection reset by peer" at once). Surprises:

- torchft 0.2.0's DistributedDataParallel crashes the survivors when a peer dies inside the
  all-reduce (--kill-mode parent with the default --hook stock: every survivor exited with
  AssertionError in 6 of 7 runs, 2 and 3 groups; in the 7th the victim had already committed
  step 20 and the survivor just waited 5.08 s): torchft/ddp.py's comm hook asserts
  `work.get_future()._fut`, which _ManagedWork.wait() leaves None after catching the gloo
  error. --hook safe (safe_ddp_class below) returns the buffer instead and the step is
  retried; all parent-mode time-lost figures above use it. A self-kill before the quorum never
  reaches that path.
- With 3 groups, 1 of 16 mid-all-reduce kills lost 60 s: one survivor got "Connection reset by
  peer" and left the collective, the other waited in a gloo recv for the other survivor until
  ProcessGroupGloo's timeout ("Timed out waiting 60000ms for recv operation to complete";
  --timeout-s, the Manager's `timeout`, which this script also passes to ProcessGroupGloo).
  torchft does not abort the other groups' collective when one group errors.
- --min-replicas 2 with 2 groups (a strict majority): after the kill the survivor never gets a
  quorum and dies after the Manager's quorum_timeout (--quorum-timeout-s 15: "TimeoutError:
  status: Cancelled, message: "Timeout expired"") since TORCHFT_QUORUM_RETRIES is 0.
- A replacement that arrives after the survivors have finished (or while none are asking)
  forms a quorum of its own with min_replicas 1 and trains from step 0 alone: runs with
  --rejoin need enough --steps (`joined_survivors` in the summary says which happened).
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_CANDIDATES = ("/usr/share/datasets/fashion-mnist", "/usr/share/games/fashion-mnist")


# --- shared -------------------------------------------------------------------------------------

def find_data(given):
    """The directory holding Fashion-MNIST's IDX files: --data, the Debian package's directory,
    or wherever `dpkg -L dataset-fashion-mnist` lists them."""
    if given:
        return given
    for d in DATA_CANDIDATES:
        if os.path.exists(os.path.join(d, "train-images-idx3-ubyte.gz")) or os.path.exists(
                os.path.join(d, "train-images-idx3-ubyte")):
            return d
    try:
        files = subprocess.run(["dpkg", "-L", "dataset-fashion-mnist"], capture_output=True,
                               text=True, check=True).stdout.split()
        for f in files:
            if os.path.basename(f).startswith("train-images-idx3-ubyte"):
                return os.path.dirname(f)
    except (OSError, subprocess.CalledProcessError):
        pass
    raise SystemExit("no Fashion-MNIST IDX files: apt-get install dataset-fashion-mnist or --data")


def shares(global_batch, groups):
    """Samples of each group per step: the global batch cut into `groups` contiguous pieces
    differing by at most one (256 over 3 groups: 86, 85, 85)."""
    base, extra = divmod(global_batch, groups)
    return [base + (1 if g < extra else 0) for g in range(groups)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            if line.endswith("\n"):
                out.append(json.loads(line))
    return out


# --- one replica group (one process) ------------------------------------------------------------

def worker(a):
    import logging

    import torch
    import torch.nn.functional as F
    from torch.distributed import TCPStore

    import torchft
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo

    sys.path.insert(0, HERE)
    from pytorch_train import find, mlp, read_idx

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    g, inc = a.group, a.incarnation
    log = open(os.path.join(a.out, f"group{g}.{inc}.jsonl"), "w", buffering=1)

    def record(**kw):
        kw.update(group=g, incarnation=inc, pid=os.getpid())
        log.write(json.dumps(kw) + "\n")
        log.flush()

    t_started = time.monotonic()
    data = find_data(a.data)
    x = read_idx(find(data, "train-images-idx3-ubyte"))[:a.train_subset].float().div_(255)
    y = read_idx(find(data, "train-labels-idx1-ubyte"))[:a.train_subset].long()
    x = ((x - x.mean()) / x.std()).contiguous()
    n = len(y)
    # One sample stream for every group: the same seeded permutation per epoch; the global
    # batch of step s is stream[s*B : (s+1)*B], of which group g trains its contiguous share.
    gen = torch.Generator().manual_seed(a.seed)
    need = a.steps * a.global_batch
    stream = torch.cat([torch.randperm(n, generator=gen) for _ in range(need // n + 1)])
    sh = shares(a.global_batch, a.groups)
    lo = sum(sh[:g])

    torch.manual_seed(a.seed)  # identical initial weights in every group (init_sync=False)
    model = mlp(10)
    sgd = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum,
                          weight_decay=a.weight_decay)

    def state_dict():
        return {"model": model.state_dict(), "optim": sgd.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        sgd.load_state_dict(sd["optim"])

    # The replica group's own TCPStore (torchrun's, in torchft's examples): one process, rank 0.
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=a.timeout_s)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=a.min_replicas,
        replica_id=f"group_{g}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=a.lighthouse,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=a.quorum_timeout_s),
        connect_timeout=timedelta(seconds=a.timeout_s),
        init_sync=False,
    )
    ddp = (DistributedDataParallel if a.hook == "stock" else safe_ddp_class())(manager, model)
    opt = torchft.Optimizer(manager, sgd)
    record(kind="ready", t=time.monotonic(), t_started=t_started)

    # Start together: every group's manager heartbeats before any asks for a quorum, so the
    # lighthouse's first quorum has all of them (else it may start with a majority).
    go = os.path.join(a.out, "go")
    while not os.path.exists(go):
        time.sleep(0.005)

    while True:
        step = manager.current_step()
        if step >= a.steps:
            break
        if (a.kill_mode == "self" and inc == 0 and g == a.groups - 1 and step == a.kill_at):
            record(kind="kill", step=step, t=time.monotonic())
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        opt.zero_grad()  # Manager.start_quorum(): asks the lighthouse (asynchronously)
        idx = stream[step * a.global_batch + lo: step * a.global_batch + lo + sh[g]]
        loss = F.cross_entropy(ddp(x.index_select(0, idx)), y.index_select(0, idx))
        loss.backward()  # the comm hook waits for the quorum, then all-reduces (average)
        participating = manager.is_participating()
        participants = manager.num_participants()
        errored = manager.errored()
        # torchft.Optimizer.step() is `if manager.should_commit(): optim.step()`; done here by
        # hand to keep the verdict.
        committed = manager.should_commit()
        if committed:
            sgd.step()
        after = manager.current_step()
        record(kind="step", step=after - 1 if committed else after, attempt_of=step,
               committed=committed, participating=participating, participants=participants,
               quorum_id=manager._quorum_id,
               errored=None if errored is None else str(errored)[:300],
               loss=float(loss.detach()), samples=sh[g], t_start=t0, t=time.monotonic())
    record(kind="done", t=time.monotonic(), step=manager.current_step())
    log.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without finalizing: torchft's and gloo's threads may outlive a clean shutdown.
    os._exit(0)


def safe_ddp_class():
    """torchft.DistributedDataParallel with a comm hook that survives a failed all-reduce.

    torchft 0.2.0's hook (torchft/ddp.py) is `work = manager.allreduce(buf); work.wait();
    assert work.get_future()._fut; return it`. When a peer dies inside the all-reduce,
    _ManagedWork.wait() catches gloo's "Connection reset by peer", reports it to the manager and
    returns False without building the future chain, so `_fut` is None and the assert kills the
    surviving group (and once the manager has errored, allreduce returns a _DummyWork whose plain
    Future has no `_fut` at all). This hook returns the (garbage) buffer instead: the manager
    has recorded the error, so should_commit() is False and the step is retried."""
    import torch
    from torchft import DistributedDataParallel

    class SafeDDP(DistributedDataParallel):
        @staticmethod
        def _comm_hook(state, bucket):
            work = state.allreduce(bucket.buffer())
            ok = work.wait()
            fut = work.get_future()
            inner = getattr(fut, "_fut", fut)
            if ok and inner is not None:
                return inner
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

    return SafeDDP


# --- the parent: lighthouse, groups, kill, rejoin, summary -------------------------------------

def lighthouse_cmd(a, port):
    exe = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    if not os.path.exists(exe):
        exe = None
    base = [exe] if exe else [sys.executable, "-c",
                              "import sys; from torchft._torchft import lighthouse_main; "
                              "sys.argv[0] = 'torchft_lighthouse'; lighthouse_main()"]
    return base + ["--bind", f"[::]:{port}", "--min_replicas", str(a.min_replicas),
                   "--quorum_tick_ms", str(a.quorum_tick_ms),
                   "--join_timeout_ms", str(a.join_timeout_ms),
                   "--heartbeat_timeout_ms", str(a.heartbeat_timeout_ms)]


def spawn_group(a, g, inc, lighthouse):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--group", str(g),
           "--incarnation", str(inc), "--lighthouse", lighthouse]
    for k in ("groups", "steps", "kill_at", "kill_mode", "hook", "min_replicas", "train_subset",
              "global_batch", "lr", "momentum", "weight_decay", "seed", "timeout_s",
              "quorum_timeout_s", "out"):
        v = getattr(a, k)
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    if a.data:
        cmd += ["--data", a.data]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every group on this machine
    err = open(os.path.join(a.out, f"group{g}.{inc}.log"), "w")
    return subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, env=env)


def wait_port(port, deadline):
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def parent(a):
    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.out):
        if f == "go" or f.startswith("group") or f == "lighthouse.log":
            os.remove(os.path.join(a.out, f))
    t_begin = time.monotonic()
    deadline = t_begin + a.deadline_s
    port = free_port()
    lh_log = open(os.path.join(a.out, "lighthouse.log"), "w")
    lh_env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
    lh = subprocess.Popen(lighthouse_cmd(a, port), stdout=lh_log, stderr=subprocess.STDOUT,
                          env=lh_env)
    if not wait_port(port, time.monotonic() + 20):
        lh.kill()
        raise SystemExit(f"lighthouse did not listen on {port}: see {a.out}/lighthouse.log")
    lighthouse = f"http://127.0.0.1:{port}"
    procs = {(g, 0): spawn_group(a, g, 0, lighthouse) for g in range(a.groups)}
    victim = a.groups - 1
    events = {}

    def records(g, inc):
        return read_jsonl(os.path.join(a.out, f"group{g}.{inc}.jsonl"))

    try:
        # Start barrier: all managers up (and heartbeating), then go.
        while time.monotonic() < deadline:
            if all(any(r["kind"] == "ready" for r in records(g, 0)) for g in range(a.groups)):
                break
            dead = [k for k, p in procs.items() if p.poll() is not None]
            if dead:
                raise SystemExit(f"group(s) {dead} exited before training: see {a.out}/group*.log")
            time.sleep(0.02)
        events["go"] = time.monotonic()
        open(os.path.join(a.out, "go"), "w").close()

        killed = a.kill_at < 0
        rejoin_spawned = a.rejoin is None
        while time.monotonic() < deadline:
            if not killed and a.kill_mode == "parent":
                # SIGKILL once the victim has ended step kill_at - 1: it dies inside step
                # kill_at (after a random part of it), as a crash would.
                if any(r["kind"] == "step" and r["committed"] and r["step"] >= a.kill_at - 1
                       for r in records(victim, 0)):
                    if a.kill_delay_ms:
                        time.sleep(a.kill_delay_ms / 1000)
                    events["kill"] = time.monotonic()
                    procs[(victim, 0)].send_signal(signal.SIGKILL)
                    killed = True
            elif not killed and procs[(victim, 0)].poll() is not None:
                k = [r for r in records(victim, 0) if r["kind"] == "kill"]
                events["kill"] = k[0]["t"] if k else time.monotonic()
                killed = True
            if killed and not rejoin_spawned and "kill" in events:
                done = [r["step"] for r in records(0, 0) if r["kind"] == "step" and r["committed"]]
                if done and max(done) >= a.kill_at + a.rejoin:
                    events["rejoin_spawn"] = time.monotonic()
                    procs[(victim, 1)] = spawn_group(a, victim, 1, lighthouse)
                    rejoin_spawned = True
            if killed and rejoin_spawned and all(
                    p.poll() is not None for k, p in procs.items()
                    if k != (victim, 0) or a.kill_at < 0):
                break
            time.sleep(0.01)
    finally:
        timed_out = time.monotonic() >= deadline
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        lh.kill()
        for p in list(procs.values()) + [lh]:
            p.wait()
    events["end"] = time.monotonic()
    exit_codes = {f"group{g}.{inc}": p.returncode for (g, inc), p in procs.items()}
    crashed = {}
    for (g, inc), p in procs.items():
        if p.returncode not in (0, -signal.SIGKILL) or (g != victim and p.returncode != 0):
            lines = open(os.path.join(a.out, f"group{g}.{inc}.log")).read().splitlines()
            errs = [ln for ln in lines if "Error" in ln or "error" in ln]
            crashed[f"group{g}.{inc}"] = (errs[-1] if errs else (lines or [""])[-1])[:300]
    summary = analyse(a, {k: records(*k) for k in procs}, events, victim)
    summary.update(exit_codes=exit_codes, crashed=crashed, deadline_hit=timed_out,
                   wall_s=round(events["end"] - t_begin, 3))
    print(json.dumps(summary, indent=None if a.compact else 1), flush=True)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


def analyse(a, recs, events, victim):
    sh = shares(a.global_batch, a.groups)
    steps = {k: [r for r in v if r["kind"] == "step"] for k, v in recs.items()}
    survivors = [g for g in range(a.groups) if g != victim]
    ref = steps[(survivors[0], 0)]
    t_kill = events.get("kill")
    out = {
        "torchft": _version("torchft"), "torch": _version("torch"),
        "groups": a.groups, "min_replicas": a.min_replicas, "steps": a.steps,
        "kill_at": a.kill_at, "kill_mode": a.kill_mode, "hook": a.hook,
        "global_batch": a.global_batch,
        "shares": sh, "train_subset": a.train_subset,
        "lighthouse": {"quorum_tick_ms": a.quorum_tick_ms, "join_timeout_ms": a.join_timeout_ms,
                       "heartbeat_timeout_ms": a.heartbeat_timeout_ms},
        "timeout_s": a.timeout_s, "quorum_timeout_s": a.quorum_timeout_s,
    }
    # Step durations of the reference survivor: from one attempt's end to the next's (the first
    # attempt from the start barrier).
    durations, prev_t = [], events.get("go")
    for r in ref:
        durations.append((r, r["t"] - prev_t))
        prev_t = r["t"]
    # The failure as the survivors see it: their first committed step with fewer groups than
    # at the start, and the committed step before it (the last one with the victim). The
    # victim's own log cannot say: it may commit a step and die before writing it down.
    failed = t_kill is not None
    i_first = next((i for i, (r, _) in enumerate(durations)
                    if failed and r["committed"] and r["participants"] < a.groups), None)
    end = i_first if i_first is not None else len(durations)
    i_last = max((i for i, (r, _) in enumerate(durations[:end]) if r["committed"]),
                 default=None)
    before = [d for r, d in durations[1:(i_last + 1 if failed and i_last is not None
                                          else len(durations))] if r["committed"]]
    median = statistics.median(before) if before else None
    out["median_step_before_s"] = _r(median)
    out["steps_before_failure_timed"] = len(before)
    degraded = [d for r, d in durations[(i_first or 0) + 1:] if i_first is not None
                and r["committed"] and r["participants"] == a.groups - 1]
    out["median_step_degraded_s"] = _r(statistics.median(degraded[3:] or degraded)
                                       if degraded else None)
    out["survivor_committed_steps"] = {f"group{g}": sum(r["committed"] for r in steps[(g, 0)])
                                       for g in survivors}
    out["survivor_failed_attempts"] = {f"group{g}": sum(not r["committed"] for r in steps[(g, 0)])
                                       for g in survivors}
    out["last_step_with_victim"] = durations[i_last][0]["step"] if i_last is not None else None
    if failed:
        last_before = durations[i_last][0]["t"] if i_last is not None else events["go"]
        out["kill_minus_last_step_with_victim_end_s"] = _r(t_kill - last_before)
        if i_first is not None:
            gap = durations[i_first][0]["t"] - last_before
            out["gap_s"] = _r(gap)
            out["time_lost_s"] = _r(gap - median) if median is not None else None
            out["first_step_after_failure"] = durations[i_first][0]["step"]
        # The last step with the victim, every attempt up to the first committed one after it,
        # and two more.
        lo_i = i_last if i_last is not None else 0
        hi_i = min(len(durations) - 1, (i_first if i_first is not None else len(durations)) + 2)
        out["steps_around_failure"] = [
            {"step": r["step"], "attempt_of": r["attempt_of"], "committed": r["committed"],
             "participants": r["participants"], "s": _r(d),
             "errored": (r["errored"] or "")[:160] or None}
            for r, d in durations[lo_i:hi_i + 1]]
    # Samples dropped: for every step index the survivors committed, the global batch minus the
    # shares of the groups that committed that step while participating (a healing group
    # contributes zeros, so its share counts as dropped too). A failed (uncommitted) attempt is
    # retried on the same batch, so it costs time, not samples.
    committed_by, counted = {}, {}
    for (g, inc), rs in steps.items():
        for r in rs:
            if r["committed"]:
                committed_by.setdefault(r["step"], set())
                counted[r["step"]] = max(counted.get(r["step"], 0), r["participants"])
                if r["participating"]:
                    committed_by[r["step"]].add(g)
    # The victim may commit a step and be killed before logging it: the survivors' count of
    # participants for that step says it was there.
    for st, gs in committed_by.items():
        if len(gs) < counted[st] and victim not in gs:
            gs.add(victim)
    dropped = {s: a.global_batch - sum(sh[g] for g in gs) for s, gs in committed_by.items()}
    out["samples_dropped"] = sum(dropped.values())
    out["steps_short_of_groups"] = sum(1 for v in dropped.values() if v)
    out["samples_dropped_per_degraded_step"] = sorted({v for v in dropped.values() if v})
    if a.rejoin is not None:
        rj = {}
        t_spawn = events.get("rejoin_spawn")
        rr = recs.get((victim, 1), [])
        rj["spawned_after_step"] = a.kill_at + a.rejoin
        if t_spawn is not None:
            ready = next((r for r in rr if r["kind"] == "ready"), None)
            first_part = next((r for r in rr if r["kind"] == "step" and r["committed"]
                               and r["participating"]), None)
            first_commit = next((r for r in rr if r["kind"] == "step" and r["committed"]), None)
            if ready:
                rj["process_start_to_ready_s"] = _r(ready["t"] - t_spawn)
            if first_commit:
                rj["healed_at_step"] = first_commit["step"]
                rj["spawn_to_first_commit_s"] = _r(first_commit["t"] - t_spawn)
            if first_part:
                rj["first_participating_step"] = first_part["step"]
                rj["spawn_to_participating_s"] = _r(first_part["t"] - t_spawn)
                if ready:
                    rj["ready_to_participating_s"] = _r(first_part["t"] - ready["t"])
                rj["committed_steps"] = sum(r["committed"] for r in rr if r["kind"] == "step")
                # Joined the survivors (a quorum with more than itself), or, the survivors gone
                # or not yet asking, started a job of its own from step 0?
                rj["joined_survivors"] = first_part["participants"] > 1
                rj["participants_when_joined"] = first_part["participants"]
            # What the join cost the survivors: their slowest step while it joined, less the
            # median.
            if ready and first_part:
                win = [d for r, d in durations if ready["t"] - 1e-9 <= r["t"]
                       <= first_part["t"] + 0.5]
                if win and median is not None:
                    rj["survivor_join_step_s"] = _r(max(win))
                    rj["survivor_join_cost_s"] = _r(max(win) - median)
        out["rejoin"] = rj
    out["final_loss"] = {f"group{g}.{inc}": _r(rs[-1]["loss"], 4) for (g, inc), rs in steps.items()
                         if rs}
    return out


def _r(v, nd=4):
    return None if v is None else round(v, nd)


def _version(mod):
    try:
        from importlib.metadata import version
        return version(mod)
    except Exception:  # noqa: BLE001
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=2, help="replica groups (one process each)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kill-at", type=int, default=20,
                    help="the last group dies at this step (-1: never)")
    ap.add_argument("--kill-mode", choices=["self", "parent"], default="self",
                    help="self: the group SIGKILLs itself before starting step K (before its "
                         "quorum request); parent: the parent SIGKILLs it once it has ended "
                         "step K-1, i.e. somewhere inside step K")
    ap.add_argument("--kill-delay-ms", type=float, default=0.0,
                    help="parent mode: wait this long after seeing step K-1 end")
    ap.add_argument("--hook", choices=["stock", "safe"], default="stock",
                    help="stock: torchft.DistributedDataParallel as shipped; safe: the same with "
                         "a comm hook that survives a peer dying inside the all-reduce (see "
                         "safe_ddp_class)")
    ap.add_argument("--rejoin", type=int, default=None, metavar="M",
                    help="start a fresh process for the killed group once the survivors have "
                         "committed step K+M, and time how long until it participates")
    ap.add_argument("--min-replicas", type=int, default=None,
                    help="lighthouse --min_replicas and Manager min_replica_size (default: a "
                         "majority, groups//2+1, but 1 for 2 groups)")
    ap.add_argument("--quorum-tick-ms", type=int, default=100, help="lighthouse flag")
    ap.add_argument("--join-timeout-ms", type=int, default=60000, help="lighthouse flag")
    ap.add_argument("--heartbeat-timeout-ms", type=int, default=5000, help="lighthouse flag")
    ap.add_argument("--timeout-s", type=int, default=60,
                    help="Manager timeout (collectives, should_commit, checkpoint transfer), "
                         "ProcessGroupGloo timeout and connect timeout")
    ap.add_argument("--quorum-timeout-s", type=int, default=60, help="Manager quorum_timeout")
    ap.add_argument("--data", default=None)
    ap.add_argument("--train-subset", type=int, default=12000)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/torchft-failure")
    ap.add_argument("--deadline-s", type=float, default=110.0,
                    help="kill everything after this long")
    ap.add_argument("--compact", action="store_true", help="print the summary on one line")
    # internal: one replica group
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--group", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--incarnation", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--lighthouse", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.min_replicas is None:
        a.min_replicas = 1 if a.groups <= 2 else a.groups // 2 + 1
    if a.groups < 2:
        raise SystemExit("--groups must be at least 2")
    if a.worker:
        worker(a)
    else:
        a.out = os.path.abspath(a.out)
        parent(a)


if __name__ == "__main__":
    main()
