#!/usr/bin/env bash
# Issue 16's systems on 1-3 ranks: asynchronous SGD with one worker ends with a single
# process's weights, and with two workers reports how stale the applied gradients were; the
# binary-blocks all-reduce trains 3 ranks (not a power of two) to bit-identical weights (the
# run's final consistency check); codec-dgc with DGC's momentum correction sends fewer bytes
# as its sparsity warm-up ramps to 99.9%. Issue 45's sync policies: DiLoCo on 2 ranks sends
# nothing in its local steps, and its plans trace without training.
set -euo pipefail
lsgd="${LSGD_BIN:-lsgd-host}"
mpi=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
out="$(mktemp -d)"
small=(--model mlp --train-subset 640 --test-subset 200 --epochs 1 --threads 1 --device cpu
  --seed 4 -q)

"$lsgd" run "${small[@]}" --global-batch 64 --out "$out/single" | grep '^weights blake3' > "$out/single.txt"
"${mpi[@]}" -np 2 "$lsgd" run "${small[@]}" --global-batch 64 --mode async --out "$out/one" > "$out/one.txt"
grep '^weights blake3' "$out/one.txt" | diff "$out/single.txt" -
grep -q 'staleness mean 0.00, max 0 ' "$out/one.txt"
"${mpi[@]}" -np 3 "$lsgd" run "${small[@]}" --global-batch 64 --mode async --out "$out/two" \
  | grep -E '^asynchronous SGD: 10 gradients applied, staleness mean'

"${mpi[@]}" -np 3 "$lsgd" run "${small[@]}" --global-batch 96 --allreduce binary-blocks \
  --out "$out/blocks" | grep -q '^weights blake3'

"${mpi[@]}" -np 2 "$lsgd" run "${small[@]}" --global-batch 64 --codec codec-dgc \
  --set codec.warmup_steps=2 --error-feedback momentum --out "$out/dgc" > /dev/null
bytes() { grep -o '"payload_bytes":[0-9]*' "$out/dgc/metrics.jsonl" | cut -d: -f2; }
first="$(bytes | head -1)" last="$(bytes | tail -1)"
[ "$last" -lt "$first" ] || { echo "dgc payload did not shrink: $first -> $last bytes" >&2; exit 1; }
"${mpi[@]}" -np 2 "$lsgd" run "${small[@]}" --global-batch 64 --sync diloco \
  --set sync.period=4 --out "$out/diloco" | grep -q '^weights blake3'
[ "$(grep -c '"sync":"local"' "$out/diloco/metrics.jsonl")" = 7 ]
local_bytes="$(grep '"sync":"local"' "$out/diloco/metrics.jsonl" | grep -vc '"bytes_sent":0,' || true)"
[ "$local_bytes" = 0 ] || { echo "$local_bytes local step(s) sent bytes" >&2; exit 1; }
"$lsgd" trace --sync diloco --set sync.period=4 --epochs 1 --steps-per-epoch 10 \
  --global-batch 64 --world-size 2 | grep -c ',average,' | grep -qx 3

rm -rf "$out"
