#!/usr/bin/env bash
# The main job: builds lsgd-host and the reference plugins, then traces and plots Goyal et al.'s
# gradual warmup (90 epochs, batch 8192 = 32 x 256, warmup over 5 epochs, x0.1 at 30/60/80).
# Extra arguments go to `lsgd-host trace` (e.g. --set schedule.warmup_epochs=2).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
bash scripts/setup.sh
cargo build --locked --release -p lsgd-host
bash scripts/build-plugins.sh
out="${LSGD_OUT:-out}"
mkdir -p "$out"
"$CARGO_TARGET_DIR/release/lsgd-host" trace --schedule warmup \
  --epochs 90 --steps-per-epoch 156 --global-batch 8192 --world-size 32 \
  --plot "$out/warmup.png" --output "$out/warmup.csv" "$@"
echo "wrote $out/warmup.csv ($(($(wc -l <"$out/warmup.csv") - 1)) steps) and $out/warmup.png"
# A few landmarks: step 0 (eta/k), mid-warmup, end of warmup (eta), after each milestone.
awk -F, 'BEGIN { split("0 390 780 4680 9360 12480", s, " "); for (i in s) want[s[i]] = 1 }
         NR > 1 && ($1 in want) { printf "  step %5d  epoch %5.1f  lr %s\n", $1, $2, $3 }' "$out/warmup.csv"
