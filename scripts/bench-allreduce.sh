#!/usr/bin/env bash
# `lsgd-host bench allreduce` at several world sizes, each run RUNS times, and one markdown
# table of the medians: MPI_Allreduce's time and every other algorithm's time as a ratio to it
# (lower is faster), as in docs/collectives.md. Release build; ranks oversubscribe the cores, unbound.
#
# Usage: bench-allreduce.sh [NPS] [SIZES] [RUNS] [ALGOS]
#   defaults: "2 3 4"  4K,64K,1M,16M  3  mpi,ring,halving-doubling,binary-blocks,torus2d,hierarchical
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
nps="${1:-2 3 4}"
sizes="${2:-4K,64K,1M,16M}"
runs="${3:-3}"
algos="${4:-mpi,ring,halving-doubling,binary-blocks,torus2d,hierarchical}"
cargo build --locked --release -p lsgd-host >&2
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
root=()
[[ "$(id -u)" == 0 ]] && root=(--allow-run-as-root)
for np in $nps; do
    for run in $(seq 1 "$runs"); do
        echo "np $np, run $run/$runs ..." >&2
        mpirun "${root[@]}" --oversubscribe --bind-to none -np "$np" \
            "$CARGO_TARGET_DIR/release/lsgd-host" bench allreduce \
            --algo "$algos" --sizes "$sizes" --format json > "$out/np$np-run$run.json"
    done
done
python3 - "$out" "$nps" "$algos" <<'PY'
import glob, json, os, statistics, sys
out, nps, algos = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(",")
others = [a for a in algos if a != "mpi"]
print("| np | floats | mpi | " + " | ".join(others) + " |")
print("|---" * (3 + len(others)) + "|")
def size(n):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)
def when(s):
    return f"{s * 1e6:.0f} µs" if s < 1e-3 else f"{s * 1e3:.3g} ms"
for np in nps:
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, f"np{np}-run*.json"))):
        for r in json.load(open(path)):
            rows.setdefault((r["floats"], r["algorithm"]), []).append(r)
    for floats in sorted({f for f, _ in rows}):
        mpi = statistics.median(r["seconds"] for r in rows[(floats, "mpi")])
        cells = []
        for a in others:
            rs = rows.get((floats, a))
            cells.append("-" if not rs else f"{statistics.median(r['seconds'] for r in rs) / mpi:.2f}×")
        print(f"| {np} | {size(floats)} | {when(mpi)} | " + " | ".join(cells) + " |")
PY
