#!/usr/bin/env bash
# AdamW instead of SGD, stopped and resumed: the moments and step count travel in the
# checkpoint, so 5 steps + resume + 5 steps end with the same weights, bit for bit, as 10 steps
# straight. `run` prints the blake3 of the final weights to make that one `diff`.
set -euo pipefail
lsgd="${LSGD_BIN:-lsgd-host}"
out="$(mktemp -d)"
small=(--model mlp --train-subset 640 --test-subset 200 --epochs 1 --global-batch 64
  --threads 1 --device cpu --seed 2 -q
  --optimizer adamw --base-lr 0.002 --reference-batch 64 --weight-decay 0.01)

"$lsgd" run "${small[@]}" --out "$out/straight" | grep '^weights blake3' > "$out/straight.txt"
"$lsgd" run "${small[@]}" --out "$out/split" --stop-after-steps 5 > /dev/null
"$lsgd" run "${small[@]}" --out "$out/split" --resume "$out/split" \
  | grep '^weights blake3' > "$out/resumed.txt"
diff "$out/straight.txt" "$out/resumed.txt"
# The checkpoint records the optimiser; resuming it as SGD is refused, naming the flag.
if "$lsgd" run "${small[@]/adamw/sgd}" --out "$out/split" --resume "$out/split" 2> "$out/err.txt"; then
  echo "expected an SGD resume of an AdamW run to be refused" >&2
  exit 1
fi
grep -q -- "--optimizer: checkpoint has" "$out/err.txt"
rm -rf "$out"
