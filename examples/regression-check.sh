#!/usr/bin/env bash
# What a user keeps in CI: a golden trace of their plugin, and a bit-for-bit comparison with a
# reference implementation (exit 0 when identical, 1 at the first differing step).
set -euo pipefail
lsgd="${LSGD_BIN:-lsgd-host}"
out="$(mktemp -d)"
shape=(--epochs 90 --steps-per-epoch 100 --global-batch 8192)

"$lsgd" trace --schedule cosine --set schedule.warmup_epochs=5 "${shape[@]}" > "$out/golden.csv"
"$lsgd" trace --schedule cosine --set schedule.warmup_epochs=5 "${shape[@]}" | diff -q - "$out/golden.csv"

# Here the "port" is the same plugin; a real one would be my-cosine.wasm in another language.
"$lsgd" compare cosine cosine --set both.warmup_epochs=5 "${shape[@]}"
# A tolerance, when the port uses a different libm: --rtol 1e-15.
"$lsgd" compare cosine poly "${shape[@]}" --rtol 1e-15 > "$out/report.txt" || test $? -eq 1
grep -q "result: DIFFERENT" "$out/report.txt"
rm -rf "$out"
