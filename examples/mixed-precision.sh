#!/usr/bin/env bash
# --precision: bf16 autocast stopped and resumed ends with the same weights as a straight run;
# fp16 started at a loss scale its gradients cannot fit (2^30) skips its first steps, halving
# the scale each time, then trains on, and says how many steps it skipped.
set -euo pipefail
lsgd="${LSGD_BIN:-lsgd-host}"
out="$(mktemp -d)"
small=(--model cnn --train-subset 640 --test-subset 200 --epochs 1 --global-batch 32
  --threads 1 --device cpu --seed 4 -q)

"$lsgd" run "${small[@]}" --precision bf16 --out "$out/straight" | grep '^weights blake3' > "$out/straight.txt"
"$lsgd" run "${small[@]}" --precision bf16 --out "$out/split" --stop-after-steps 9 > /dev/null
"$lsgd" run "${small[@]}" --precision bf16 --out "$out/split" --resume "$out/split" \
  | grep '^weights blake3' > "$out/resumed.txt"
diff "$out/straight.txt" "$out/resumed.txt"

"$lsgd" run "${small[@]}" --precision fp16 --loss-scale 1073741824 --out "$out/fp16" > "$out/fp16.txt"
grep -E '^fp16 loss scale [0-9]+ at the end; [1-9][0-9]* step\(s\) skipped on overflow' "$out/fp16.txt"
head -1 "$out/fp16/metrics.jsonl" | grep -q '"loss_scale":1073741824.0,"skipped":true'
rm -rf "$out"
