#!/usr/bin/env bash
# What one lost rank costs (docs/cluster.md, "Fault tolerance"): the same job, its last rank
# killing itself before step K's exchange (`run --lose-rank`), survived three ways:
#   tolerant  `run --fault-tolerance` on Open MPI 5 (ULFM): the survivors shrink and redo step K;
#   restart   `lsgd-host launch` on the machine's Open MPI: the job ends, and launch restarts it
#             on the ranks left from the newest checkpoint (`--checkpoint-every C`);
#   torchft   host/bench/torchft_failure.py (torchft's lighthouse and replica groups, gloo), one
#             process per group on this machine only (its figures are its own job's).
# Time lost by the tolerant run: its rank-lost record's detect_s + recover_s minus the redone
# step's own time (the work thrown away, detection, agreement and shrink). By the restart: the
# tolerant run's loss plus what the restart run spent beyond its steps' own work (wall time
# minus the sum of its step records' times) more than the tolerant run did, both losing the
# same rank and ending on the same ranks. That leaves in Open MPI 5's slower start (~0.5 s
# here), so it is the restart's cost less that: it favours the restart. Prints one Markdown
# table. Release build.
# REPORT_ONLY=1 prints the table of the runs already in $LSGD_OUT.
#
# Usage: bench-faults.sh [HOSTS] [REPEATS]        defaults: "2 3 4"  3
#   NETLAB=1: N lab hosts (scripts/netlab.sh, 1 Gbit/s links, needs root) instead of N ranks here
# Raw logs and metrics stay in $LSGD_OUT (default out/bench-faults); LSGD_BIN=PATH measures that
# binary.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
hosts="${1:-2 3 4}"
repeats="${2:-3}"
out="${LSGD_OUT:-out/bench-faults}"
if [[ -z "${REPORT_ONLY:-}" ]]; then
  bash scripts/setup.sh
  if [[ -n "${LSGD_BIN:-}" ]]; then
    lsgd="$LSGD_BIN"
  else
    cargo build --locked --release -p lsgd-host >&2
    lsgd="$CARGO_TARGET_DIR/release/lsgd-host"
  fi
  bash scripts/build-plugins.sh >&2
fi
export LSGD_PLUGIN_PATH="$CARGO_TARGET_DIR/plugins"
mkdir -p "$out"
# 50 steps of the cnn at global batch 120 (divisible by 4, 3, 2 and 1); the loss before step 25,
# checkpoints every 10 steps: a restart redoes steps 20..24.
K=25
job=(run --model cnn --schedule warmup --train-subset 6000 --test-subset 1000 --epochs 1
  --global-batch 120 --threads 1 --device cpu --quiet --collective-timeout 3
  --checkpoint-every 10 --overwrite)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ulfm_mpirun=("$LSGD_OMPI5/bin/mpirun" --with-ft ulfm --oversubscribe --bind-to none -x LD_LIBRARY_PATH)
if [[ -n "${NETLAB:-}" ]]; then
  trap 'bash scripts/netlab.sh down' EXIT
fi
# Runs "$@" (an mpirun-less command: `-np N lsgd-host run …` for the tolerant runs) and prints
# its wall seconds.
timed() { local s; s=$(date +%s.%N); "$@" >"$log" 2>&1 || true; echo "$(date +%s.%N) - $s" | bc; }
for n in $hosts; do
  [[ -z "${REPORT_ONLY:-}" ]] || break
  if [[ -n "${NETLAB:-}" ]]; then bash scripts/netlab.sh up "$n" --rate 1gbit >&2; fi
  last=$((n - 1))
  for r in $(seq 1 "$repeats"); do
    d="$out/n$n-r$r"; mkdir -p "$d"
    echo "== $n ranks, repeat $r" >&2
    for lose in loss; do
      extra=(--lose-rank "$last@$K")
      log="$d/tolerant-$lose.log"
      if [[ -n "${NETLAB:-}" ]]; then
        t=$(timed bash scripts/netlab.sh run --ulfm -np "$n" -- "$lsgd" "${job[@]}" \
          --out "$d/tolerant-$lose" --fault-tolerance "${extra[@]}")
      else
        t=$(timed env LD_LIBRARY_PATH="$LSGD_OMPI5/lib" "${ulfm_mpirun[@]}" -np "$n" "$lsgd" \
          "${job[@]}" --out "$d/tolerant-$lose" --fault-tolerance "${extra[@]}")
      fi
      echo "$t" > "$d/tolerant-$lose.s"
      log="$d/restart-$lose.log"
      if [[ -n "${NETLAB:-}" ]]; then
        t=$(timed bash scripts/netlab.sh run -- "$lsgd" launch -np "$n" --min-np 1 -- "${job[@]}" \
          --out "$d/restart-$lose" "${extra[@]}")
      else
        t=$(timed "$lsgd" launch -np "$n" --min-np 1 -- "${job[@]}" --out "$d/restart-$lose" "${extra[@]}")
      fi
      echo "$t" > "$d/restart-$lose.s"
    done
  done
  if [[ -n "${NETLAB:-}" ]]; then bash scripts/netlab.sh down >&2; fi
done
torchft=""
if [[ -z "${NETLAB:-}" ]]; then
  for n in $hosts; do [[ -s "$out/torchft-$n.json" ]] && torchft="$torchft $n"; done
fi
if [[ -z "${NETLAB:-}" && -z "${REPORT_ONLY:-}" ]]; then
  torchft=""
  "$LSGD_VENV/bin/python" -m pip install -q --disable-pip-version-check torchft==0.2.0
  for n in $hosts; do
    (( n >= 2 )) || continue
    "$LSGD_VENV/bin/python" host/bench/torchft_failure.py --groups "$n" --kill-at "$K" \
      --out "$(realpath -m "$out")/torchft-$n" --compact > "$out/torchft-$n.json" 2>"$out/torchft-$n.log" || true
    torchft="$torchft $n"
  done
fi
python3 - "$out" "$hosts" "$repeats" "$K" "${NETLAB:+lab}" "$torchft" <<'PY'
import json, os, statistics, sys
out, hosts, repeats, K, lab, torchft = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6].split()
def records(path):
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows
print(f"\n{'lab hosts at 1 Gbit/s' if lab else 'ranks on this machine'}, cnn, 50 steps of 120, "
      f"the last rank lost before step {K}; medians of {repeats}\n")
print("| ranks | step before / after (ms) | tolerant: detect / recover (s) | tolerant: lost (s) | restart: lost (s) | restart ÷ tolerant |")
print("|---|---|---|---|---|---|")
def overhead(d, name):
    """Wall seconds beyond the step records' own, the step times, the run's records."""
    rows = records(os.path.join(d, name, "metrics.jsonl"))
    wall = float(open(os.path.join(d, name + ".s")).read())
    steps = {x["step"]: x["global_batch"] / x["samples_per_s"] for x in rows if x.get("kind") == "step"}
    if len(steps) != 50:
        raise ValueError(f"{name}: {len(steps)} step records")
    return wall - sum(steps.values()), steps, rows
m = statistics.median
for n in hosts:
    det, rec, lost_t, lost_r, before, after = [], [], [], [], [], []
    for r in range(1, repeats + 1):
        d = os.path.join(out, f"n{n}-r{r}")
        try:
            loss_t, steps, rows = overhead(d, "tolerant-loss")
            loss_r, _, _ = overhead(d, "restart-loss")
        except (OSError, ValueError) as e:
            print(f"<!-- n{n}-r{r}: {e}: skipped -->")
            continue
        lost = [x for x in rows if x.get("kind") == "rank-lost"]
        if len(lost) != 1:
            print(f"<!-- n{n}-r{r}: {len(lost)} rank-lost records: skipped -->")
            continue
        det.append(lost[0]["detect_s"]); rec.append(lost[0]["recover_s"])
        # The failed attempt and everything until the redone step began, beyond one step.
        lost_t.append(lost[0]["detect_s"] + lost[0]["recover_s"] - steps[K])
        lost_r.append(lost_t[-1] + loss_r - loss_t)
        before.append(m(steps[s] for s in range(5, K)))
        after.append(m(steps[s] for s in range(K + 1, 50)))
    if not det:
        print(f"| {n} | no complete repeat | | | | |")
        continue
    print(f"| {n} → {int(n) - 1} | {m(before) * 1e3:.0f} / {m(after) * 1e3:.0f} | {m(det):.3f} / {m(rec):.3f} | "
          f"{m(lost_t):.2f} | {m(lost_r):.2f} | {m(lost_r) / max(m(lost_t), 0.05):.0f}× |")
for n in torchft:
    try:
        s = json.load(open(os.path.join(out, f"torchft-{n}.json")))
    except (OSError, ValueError):
        print(f"\ntorchft, {n} groups: no result (see {out}/torchft-{n}.log)")
        continue
    print(f"\ntorchft 0.2.0, {n} replica groups on this machine (its own MLP job): "
          f"time lost {s.get('time_lost_s', float('nan')):.2f} s, samples dropped "
          f"{s.get('samples_dropped', '?')}")
PY
