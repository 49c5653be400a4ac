#!/usr/bin/env bash
# Goyal et al. 2017: ResNet-50 on ImageNet at batch 8192 on 256 workers (32 per 256-sample
# reference batch). LR 0.1 per 256 samples scaled linearly to 3.2, gradual warmup over 5 epochs
# from 0.1, then x0.1 at epochs 30, 60 and 80. 1,281,167 images / 8192 = 157 steps per epoch.
set -euo pipefail
lsgd="${LSGD_BIN:-lsgd-host}"
out="$(mktemp -d)"
shape=(--epochs 90 --steps-per-epoch 157 --global-batch 8192 --world-size 256)

"$lsgd" inspect warmup
"$lsgd" trace --schedule warmup "${shape[@]}" --plot "$out/goyal.svg" > "$out/goyal.csv"
# Step 0 runs at eta/k = 0.1; the end of warmup (step 785 = epoch 5) at exactly 3.2.
grep -q '^0,0,0.1,8192,0$' "$out/goyal.csv"
grep -q '^785,5,3.2,8192,0$' "$out/goyal.csv"

# The paper's "constant warmup" variant differs from step 1 on; compare says where and by how much.
if "$lsgd" compare warmup warmup --set b.warmup=constant "${shape[@]}"; then
  echo "expected gradual and constant warmup to differ" >&2
  exit 1
fi
rm -rf "$out"
