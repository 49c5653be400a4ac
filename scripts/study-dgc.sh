#!/usr/bin/env bash
# Deep Gradient Compression's parts, one at a time, on the codec issue's accuracy job: 2 ranks
# (mpirun), the cnn for 2 epochs on 12,000 Fashion-MNIST samples at batch 256 (94 steps),
# warmup over half an epoch, seed 1, one thread per rank (what tests/all/codecs.rs and
# tests/all/dgc.rs run). Prints a Markdown table: test accuracy, the difference to the
# uncompressed run, rank 0's payload bytes at the last step and the mean compression over the
# run. Every run stays under $LSGD_OUT (default out/study-dgc); runs that finished are not
# trained again. Accuracy does not depend on the build profile (PROFILE=debug by default;
# PROFILE=release builds and uses the release binary).
#
# Usage: scripts/study-dgc.sh        WARMUPS="5 8" sets the extra warm-up lengths (default 5 8 10 11 15)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
bash scripts/setup.sh
profile="${PROFILE:-debug}"
if [ "$profile" = release ]; then
  cargo build --locked --release -p lsgd-host
else
  cargo build --locked -p lsgd-host
fi
bash scripts/build-plugins.sh >&2
lsgd="$CARGO_TARGET_DIR/$profile/lsgd-host"
export LSGD_PLUGIN_PATH="$CARGO_TARGET_DIR/plugins"
root="${LSGD_OUT:-out/study-dgc}"
mkdir -p "$root"

# name | flags after the shared ones
jobs=(
  "uncompressed|"
  "top-k 1%, residual|--codec codec-top-k --set codec.density=0.01 --error-feedback residual"
  "top-k 0.1%, residual|--codec codec-top-k --set codec.density=0.001 --error-feedback residual"
  "top-k 0.1%, momentum|--codec codec-top-k --set codec.density=0.001 --error-feedback momentum"
  "dgc 99.9%, no warm-up, momentum|--codec codec-dgc --set codec.warmup_steps=0 --error-feedback momentum"
  "dgc 99.9%, warm-up stages of 12 steps, residual|--codec codec-dgc --set codec.warmup_steps=12 --error-feedback residual"
  "dgc 99.9%, warm-up stages of 12 steps, momentum|--codec codec-dgc --set codec.warmup_steps=12 --error-feedback momentum"
  "dgc 99.9%, warm-up stages of 12 steps, momentum, clip 5 (the test)|--codec codec-dgc --set codec.warmup_steps=12 --error-feedback momentum --local-clip-norm 5"
  "dgc 99.9% per tensor, warm-up stages of 12 steps, momentum|--codec codec-dgc --set codec.warmup_steps=12 --set codec.selection=tensor --error-feedback momentum"
)
# How much the warm-up's length matters: stages of N steps (12 above), momentum, no clipping.
for n in ${WARMUPS:-5 8 10 11 15}; do
  jobs+=("dgc 99.9%, warm-up stages of $n steps, momentum|--codec codec-dgc --set codec.warmup_steps=$n --error-feedback momentum")
done

echo "cnn, 2 ranks, Fashion-MNIST 12k/2k, 2 epochs (94 steps), batch 256, warmup plugin, seed 1, 1 thread per rank, $profile build, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo " with uncommitted changes")"
echo
echo "| job | flags | test accuracy | vs uncompressed | payload bytes, last step | mean compression |"
echo "|---|---|---|---|---|---|"
base=""
for i in "${!jobs[@]}"; do
  name="${jobs[$i]%%|*}"
  flags="${jobs[$i]#*|}"
  out="$root/job$i"
  log="$out.log"
  if ! grep -q '^weights blake3' "$log" 2>/dev/null; then
    # shellcheck disable=SC2086 # the flags are words
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$lsgd" run \
      --model cnn --train-subset 12000 --test-subset 2000 --epochs 2 --global-batch 256 \
      --threads 1 --device cpu --seed 1 --schedule warmup \
      --set schedule.warmup_epochs=0.5 --set schedule.milestones=10 --quiet --out "$out" \
      $flags >"$log" 2>&1 || { echo "| $name | run failed, see $log |"; continue; }
  fi
  acc="$(grep -o 'test accuracy [0-9.]*%' "$log" | awk '{print $3}' | tr -d %)"
  [ -z "$base" ] && base="$acc"
  delta="$(awk -v a="$acc" -v b="$base" 'BEGIN { printf "%+.2f", a - b }')"
  read -r bytes ratio < <(python3 - "$out/metrics.jsonl" <<'EOF'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "payload_bytes" in r]
print(steps[-1]["payload_bytes"], f'{sum(s["compression_ratio"] for s in steps) / len(steps):.1f}x')
EOF
)
  printf '| %s | `%s` | %s%% | %s | %s | %s |\n' "$name" "${flags:-}" "$acc" "$delta" "$bytes" "$ratio"
done
