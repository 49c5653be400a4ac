"""The overlap lab (scripts/bench-overlap.sh runs it): lsgd-host with and without `--overlap`
and PyTorch DDP (gloo, host/bench/pytorch_ddp.py) on two emulated hosts, one rank each, same
model, data, global batch and threads, at each link rate; prints one Markdown table.

Per model and rate, lsgd-host's sequential step (--no-overlap) is F+B+C: B its last backward
pass, C its communication, F the rest (forward, update, policies, copying into and out of the
buckets); an exchange behind the backward pass can hide at most min(B, C), so F+max(B, C) is
the overlapped step's bound. The overlapped step is set against it, and lsgd-host's samples/s
against DDP's at its default buckets and at the best of the bucket caps tried.

Each configuration runs once per round, the rounds interleaved (a slow minute on a shared
machine then falls on every configuration alike); each figure is the median over the rounds.

Usage: python3 bench-overlap.py LSGD_BIN OUT [--rates 1gbit,100mbit] [--models cnn,resnet20,wide-mlp]
                                [--ddp-buckets 1,5,25,100] [--rounds 3] [--steps 5,30]
Needs root (the lab), the venv's full torch and the release binary; the .sh builds them.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NETLAB = ROOT / "scripts" / "netlab.sh"
DDP = ROOT / "host" / "bench" / "pytorch_ddp.py"
FASHION = "/usr/share/datasets/fashion-mnist"
GLOBAL_BATCH = 256
LR, WEIGHT_DECAY, EPSILON = 0.1, 1e-4, 0.1

# Per model: lsgd-host's flags, pytorch_ddp.py's, (warm-up, timed) steps, fewer where a step
# takes seconds, and DDP's bucket caps (MiB) to try: below 25 for the small models, whose whole
# gradient fits DDP's first bucket; not 1 for the wide MLP, whose tensors of 6-17 M floats
# each make a bucket of their own at any cap below 25.
MODELS = {
    "cnn": {"ours": ["--model", "cnn"], "ddp": ["--model", "cnn"], "steps": (5, 30),
            "buckets": [1, 5, 25, 100]},
    "resnet20": {
        "ours": ["--model", "resnet", "--depth", "20", "--dataset", "cifar10", "--data-dir", "{cifar}"],
        "ddp": ["--model", "resnet", "--depth", "20", "--dataset", "cifar10", "--data", "{cifar}"],
        "steps": (3, 12),
        "buckets": [1, 5, 25, 100],
    },
    "wide-mlp": {"ours": ["--model", "{wide}"], "ddp": ["--model", "wide-mlp"], "steps": (1, 4),
                 "buckets": [5, 25, 100]},
}


def sh(*args, **kw):
    return subprocess.run([str(a) for a in args], check=True, **kw)


def fixtures(out, models):
    """What `models` need: 3×32×32 images in CIFAR-10's binary layout (random pixels and
    labels: the lab times steps, it does not learn), the wide MLP as a TorchScript file."""
    cifar = out / "cifar10"
    if "resnet20" in models and not (cifar / "test_batch.bin").exists():
        cifar.mkdir(parents=True, exist_ok=True)
        import random
        rng = random.Random(0)
        for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
            records = bytearray()
            for _ in range(1000):
                records.append(rng.randrange(10))
                records += rng.randbytes(3072)
            (cifar / name).write_bytes(bytes(records))
    wide = out / "wide-mlp.pt"
    if "wide-mlp" in models and not wide.exists():
        sh(sys.executable, "-c", f"""
import sys, torch
sys.path.insert(0, {str(DDP.parent)!r})
from pytorch_train import wide_mlp
torch.manual_seed(0)
torch.jit.script(wide_mlp(10)).save({str(wide)!r})
""")
    return {"cifar": str(cifar), "wide": str(wide)}


def fill(flags, paths):
    return [f.format(**paths) for f in flags]


def ours(lsgd, model, paths, run_dir, overlap, steps):
    """`lsgd-host run` on h1 and h2 and the means of rank 0's timed steps."""
    warmup, steps = steps
    flags = fill(MODELS[model]["ours"], paths) + [
        "--global-batch", GLOBAL_BATCH, "--max-micro-batch", GLOBAL_BATCH, "--max-batch", GLOBAL_BATCH,
        "--reference-batch", GLOBAL_BATCH, "--base-lr", LR, "--momentum", "0.9",
        "--weight-decay", WEIGHT_DECAY, "--threads", "1", "--device", "cpu", "--seed", "0",
        "--epochs", "1000", "--test-subset", "1", "--stop-after-steps", warmup + steps,
        "--allreduce", "ring", "--batch-size", "constant-batch", "--schedule", "warmup",
        "--set", "schedule.warmup=none", "--label-smoothing", "label-smoothing",
        "--set", f"label_smoothing.epsilon={EPSILON}", "--quiet",
        "--overlap" if overlap else "--no-overlap", "--out", run_dir,
    ]
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    sh("bash", NETLAB, "run", "-np", "2", "--per-host", "1", "--", lsgd, "run", *flags,
       stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    rows = [r for r in rows if r.get("kind") == "step" and r["step"] >= warmup]
    n = len(rows)
    mean = lambda k: sum(r[k] for r in rows) / n
    wall = sum(r["global_batch"] / r["samples_per_s"] for r in rows)
    return {
        "samples_per_s": sum(r["global_batch"] for r in rows) / wall,
        "step_s": wall / n,
        "compute_s": mean("compute_s"),
        "backward_s": mean("backward_s"),
        "communication_s": mean("communication_s"),
        "exposed_s": mean("exposed_communication_s"),
        "hidden_s": mean("hidden_communication_s"),
    }


def ddp(python, model, paths, bucket_mb, steps):
    """pytorch_ddp.py as rank 0 on h1 and rank 1 on h2 (gloo over the lab's links)."""
    warmup, steps = steps
    # h1's address on the lab's subnet (netlab.sh's NETLAB_NET).
    master = os.environ.get("NETLAB_NET", "10.77.0") + ".1"
    args = fill(MODELS[model]["ddp"], paths)
    if "--data" not in args:
        args += ["--data", FASHION]
    args += ["--global-batch", GLOBAL_BATCH, "--threads", "1", "--steps", steps, "--warmup", warmup,
             "--lr", LR, "--weight-decay", WEIGHT_DECAY, "--epsilon", EPSILON, "--bucket-mb", bucket_mb]
    procs = []
    for rank in (0, 1):
        env = ["env", f"MASTER_ADDR={master}", "MASTER_PORT=29577", f"RANK={rank}", "WORLD_SIZE=2",
               "GLOO_SOCKET_IFNAME=eth0", "OMP_NUM_THREADS=1", "PYTHONWARNINGS=ignore::UserWarning"]
        procs.append(subprocess.Popen(
            ["bash", str(NETLAB), "exec", f"h{rank + 1}", "--", *env, python, str(DDP), *map(str, args)],
            stdout=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=1800)[0] for p in procs]
    except subprocess.TimeoutExpired:
        # A rank that failed leaves the other waiting for it in gloo.
        for p in procs:
            p.kill()
        raise SystemExit("pytorch_ddp.py did not finish within 30 minutes")
    if any(p.returncode for p in procs):
        raise SystemExit(f"pytorch_ddp.py failed: {outs}")
    line = next(l for l in reversed(outs[0].splitlines()) if l.startswith("{"))
    return json.loads(line)


def median(runs):
    """Per key, the median over the rounds (of the numbers)."""
    return {k: statistics.median(r[k] for r in runs)
            for k, v in runs[0].items() if isinstance(v, (int, float))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lsgd")
    ap.add_argument("out", type=Path)
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--models", default="cnn,resnet20,wide-mlp")
    ap.add_argument("--ddp-buckets", help="the caps to try for every model (default: per model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", help="WARMUP,TIMED for every model (default: per model)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    paths = fixtures(a.out, a.models.split(","))
    results = a.out / "results.jsonl"
    rows = []
    for rate in a.rates.split(","):
        sh("bash", NETLAB, "up", "2", "--rate", rate, stdout=subprocess.DEVNULL)
        for model in a.models.split(","):
            caps = a.ddp_buckets.split(",") if a.ddp_buckets else [str(c) for c in MODELS[model]["buckets"]]
            steps = tuple(map(int, a.steps.split(","))) if a.steps else MODELS[model]["steps"]
            runs = {}
            for _ in range(a.rounds):
                for overlap in (False, True):
                    key = "overlap" if overlap else "sequential"
                    r = ours(a.lsgd, model, paths, a.out / f"run-{rate}-{model}-{key}", overlap, steps)
                    runs.setdefault(key, []).append(r)
                    print(f"{rate} {model} lsgd-host {key}: {r}", file=sys.stderr, flush=True)
                for mb in caps:
                    r = ddp(sys.executable, model, paths, float(mb), steps)
                    runs.setdefault(mb, []).append(r)
                    print(f"{rate} {model} DDP {mb} MiB: {r}", file=sys.stderr, flush=True)
            row = {"rate": rate, "model": model, "rounds": runs,
                   "sequential": median(runs["sequential"]), "overlap": median(runs["overlap"]),
                   "ddp": {mb: median(runs[mb]) for mb in caps}}
            with open(results, "a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
    table(rows)


def table(rows):
    ms = lambda s: f"{s * 1e3:,.0f}"
    print("| link | model | F+B+C ms | F+max(B,C) ms | sequential ms (samples/s) | overlapped ms "
          "(samples/s) | overlapped ÷ F+max(B,C) | DDP 25 MiB ms (samples/s) | DDP best ms "
          "(samples/s, bucket) | ours ÷ DDP best |")
    print("|---" * 10 + "|")
    for r in rows:
        s, o = r["sequential"], r["overlap"]
        b, c = s["backward_s"], s["communication_s"]
        f = s["step_s"] - b - c
        best_mb, best = max(r["ddp"].items(), key=lambda kv: kv[1]["samples_per_s"])
        default = r["ddp"].get("25") or r["ddp"].get("25.0")
        print(f"| {r['rate']} | {r['model']} | {ms(f + b + c)} | {ms(f + max(b, c))} | "
              f"{ms(s['step_s'])} ({s['samples_per_s']:,.0f}) | {ms(o['step_s'])} "
              f"({o['samples_per_s']:,.0f}) | {o['step_s'] / (f + max(b, c)):.2f} | "
              + (f"{ms(default['step_s'])} ({default['samples_per_s']:,.0f})" if default else "–")
              + f" | {ms(best['step_s'])} ({best['samples_per_s']:,.0f}, {best_mb} MiB) | "
              f"{o['samples_per_s'] / best['samples_per_s']:.2f} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--table":
        table([json.loads(l) for l in open(sys.argv[2])])
    else:
        main()
