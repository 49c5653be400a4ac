#!/usr/bin/env bash
# Issue 13's accuracy check: the cnn on the whole of Fashion-MNIST at each --precision (fp32,
# bf16, fp16 with dynamic loss scaling), the same settings and seeds otherwise, in a release
# build. Prints a Markdown table: final test accuracy per seed, the mean, the difference to
# fp32, samples/s, and fp16's skipped steps; every run stays under $LSGD_OUT (default
# out/study-precision). Runs that finished are not trained again (their logs are read).
#
# Usage: scripts/study-precision.sh [EPOCHS [SEED ...]]    default: 3 epochs, seeds 1 2
# Extra settings through the environment: THREADS (default 2), BATCH (default 256),
# PRECISIONS (default "fp32 bf16 fp16").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
bash scripts/setup.sh
cargo build --locked --release -p lsgd-host
bash scripts/build-plugins.sh
lsgd="$CARGO_TARGET_DIR/release/lsgd-host"
epochs="${1:-3}"
shift || true
seeds=("${@:-1 2}")
read -r -a seeds <<<"${seeds[*]}"
read -r -a precisions <<<"${PRECISIONS:-fp32 bf16 fp16}"
root="${LSGD_OUT:-out/study-precision}"
threads="${THREADS:-2}"
batch="${BATCH:-256}"

echo "cnn, Fashion-MNIST 60k/10k, $epochs epochs, batch $batch, warmup plugin, $threads thread(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo " with uncommitted changes")"
echo
printf '| precision | %s | mean | vs fp32 | samples/s | skipped steps |\n' \
  "$(printf 'seed %s | ' "${seeds[@]}" | sed 's/ | $//')"
printf '|---|%s---|---|---|---|\n' "$(printf -- '---|%.0s' "${seeds[@]}")"
fp32_mean=""
for p in "${precisions[@]}"; do
  accs=() speeds=() skips=()
  for s in "${seeds[@]}"; do
    out="$root/$p-seed$s"
    log="$out.log"
    mkdir -p "$root"
    if ! grep -q '^weights blake3' "$log" 2>/dev/null; then
      "$lsgd" run --model cnn --epochs "$epochs" --global-batch "$batch" --threads "$threads" \
        --device cpu --seed "$s" --schedule warmup --precision "$p" --quiet --out "$out" \
        >"$log" 2>&1 || { echo "| $p | run failed, see $log |"; continue 2; }
    fi
    accs+=("$(grep -o 'test accuracy [0-9.]*%' "$log" | awk '{print $3}' | tr -d %)")
    speeds+=("$(grep -o '[0-9.]* samples/s' "$log" | awk '{print $1}')")
    skips+=("$(grep -o '[0-9]* step(s) skipped' "$log" | awk '{print $1}' || true)")
  done
  mean="$(printf '%s\n' "${accs[@]}" | awk '{ s += $1 } END { printf "%.2f", s / NR }')"
  [ "$p" = fp32 ] && fp32_mean="$mean"
  delta="$([ -n "$fp32_mean" ] && awk -v a="$mean" -v b="$fp32_mean" 'BEGIN { printf "%+.2f", a - b }' || echo -)"
  speed="$(printf '%s\n' "${speeds[@]}" | awk '{ s += $1 } END { printf "%.0f", s / NR }')"
  skipped="$([ "$p" = fp16 ] && printf '%s ' "${skips[@]}" || echo -)"
  printf '| %s | %s | %s | %s | %s | %s |\n' "$p" "$(printf '%s%% | ' "${accs[@]}" | sed 's/ | $//')" \
    "$mean%" "$delta" "$speed" "$skipped"
done
