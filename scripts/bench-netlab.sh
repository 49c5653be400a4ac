#!/usr/bin/env bash
# The α-β model against the emulated cluster (docs/cluster.md): for each link rate, bring the
# lab up, fit α, β, γ with `bench calibrate` across two hosts, then at 2, 3 and 4 hosts (one
# rank each) time every all-reduce with `bench allreduce --model` and print one Markdown table
# of predicted time, measured median and their ratio. Release build; needs root.
#
# Usage: bench-netlab.sh [RATES] [HOSTS] [SIZES] [ITERS]
#   defaults: "1gbit 100mbit"  "2 3 4"  4K,64K,1M,4M,16M  3
# Raw JSON stays in $LSGD_OUT (default out/bench-netlab); LSGD_BIN=PATH measures that binary.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
rates="${1:-1gbit 100mbit}"
hosts="${2:-2 3 4}"
sizes="${3:-4K,64K,1M,4M,16M}"
iters="${4:-3}"
algos=mpi,ring,halving-doubling,binary-blocks,torus2d,hierarchical
out="${LSGD_OUT:-out/bench-netlab}"
bash scripts/netlab.sh check >/dev/null || { bash scripts/netlab.sh check; exit 3; }
# LSGD_BIN: a binary built earlier (measuring while the tree changes); else the release build.
if [[ -n "${LSGD_BIN:-}" ]]; then
  lsgd="$LSGD_BIN"
else
  cargo build --locked --release -p lsgd-host >&2
  lsgd="$CARGO_TARGET_DIR/release/lsgd-host"
fi
mkdir -p "$out"
trap 'bash scripts/netlab.sh down' EXIT
for rate in $rates; do
  for p in $hosts; do
    echo "== $rate, $p hosts" >&2
    bash scripts/netlab.sh up "$p" --rate "$rate"
    if [[ ! -s "$out/calibration-$rate.json" ]]; then
      bash scripts/netlab.sh run -np 2 -- "$lsgd" bench calibrate --out "$out/calibration-$rate.json" >&2
    fi
    bash scripts/netlab.sh run -np "$p" -- "$lsgd" bench allreduce --algo "$algos" \
      --sizes "$sizes" --iters "$iters" --model "$out/calibration-$rate.json" --format json \
      > "$out/$rate-p$p.json"
  done
done
python3 - "$out" "$rates" "$hosts" <<'PY'
import json, os, sys
out, rates, hosts = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def size(n):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)
def when(s):
    return f"{s * 1e6:.0f} µs" if s < 1e-3 else f"{s * 1e3:.3g} ms"
for rate in rates:
    cal = json.load(open(os.path.join(out, f"calibration-{rate}.json")))
    print(f"\n{rate}: α = {cal['alpha'] * 1e6:.1f} µs, β = {cal['beta'] * 1e9:.3f} ns/B "
          f"({8 / cal['beta'] / 1e6:.0f} Mbit/s), γ = {cal['gamma'] * 1e9:.3f} ns/B\n")
    rows = {}
    for p in hosts:
        for r in json.load(open(os.path.join(out, f"{rate}-p{p}.json"))):
            rows.setdefault((int(p), r["floats"]), []).append(r)
    algos = [r["algorithm"] for r in next(iter(rows.values()))]
    print("| hosts | floats | " + " | ".join(f"{a}: model / measured / ratio" for a in algos) + " |")
    print("|---" * (2 + len(algos)) + "|")
    for (p, floats), rs in sorted(rows.items()):
        cells = [f"{when(r['predicted_s'])} / {when(r['seconds'])} / {r['ratio']:.2f}" for r in rs]
        print(f"| {p} | {size(floats)} | " + " | ".join(cells) + " |")
PY
