#!/usr/bin/env bash
# Contract 0.3 policies without training: ReduceLROnPlateau fed a synthetic accuracy per epoch,
# LARS and LAMB fed synthetic tensor norms (one scale:<tensor> column per tensor), and a
# bit-for-bit comparison of two layer-rate plugins over the same norms (exit 1: they differ).
set -euo pipefail
lsgd="${LSGD_BIN:-lsgd-host}"
inputs="$(cd "$(dirname "${BASH_SOURCE[0]}")/../tests/golden/inputs" && pwd)"
out="$(mktemp -d)"
shape=(--epochs 90 --steps-per-epoch 10 --global-batch 8192)

"$lsgd" trace --schedule plateau --set schedule.patience=3 --set schedule.factor=0.5 \
  --metric-file "$inputs/metric-90-epochs.txt" "${shape[@]}" > "$out/plateau.csv"
# The LR starts at 0.1 · 8192/256 and is halved on every plateau of the accuracy.
test "$(sed -n 2p "$out/plateau.csv" | cut -d, -f3)" = 3.2
test "$(tail -1 "$out/plateau.csv" | cut -d, -f3)" != 3.2

"$lsgd" trace --layer-rate lars --set layer_rate.coefficient=0.02 \
  --norms-file "$inputs/norms-cnn.csv" "${shape[@]}" > "$out/lars.csv"
head -1 "$out/lars.csv" | grep -q ',scale:fc2.weight$'

"$lsgd" compare lars lamb --norms-file "$inputs/norms-cnn.csv" "${shape[@]}" > "$out/report.txt" \
  || test $? -eq 1
grep -q "result: DIFFERENT" "$out/report.txt"
rm -rf "$out"
