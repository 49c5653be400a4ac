#!/usr/bin/env bash
# Issue 11's accuracy study: plain SGD (Goyal: linear scaling + gradual warmup) against LARS
# (SGD + the `lars` layer-rate plugin) and LAMB (AdamW + `lamb`) on Fashion-MNIST with the cnn,
# at global batches where plain SGD breaks down, same epochs for every row. Prints a Markdown
# table of the final test accuracy (or "diverged" and the step) and leaves every run under
# $LSGD_OUT (default out/study-layerwise).
#
# Usage: scripts/study-layerwise.sh [EPOCHS [BATCH ...]]    default: 6 epochs, batches 4096 8192
# Extra settings through the environment: THREADS (default 2).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
bash scripts/setup.sh
cargo build --locked -p lsgd-host
bash scripts/build-plugins.sh
lsgd="$CARGO_TARGET_DIR/debug/lsgd-host"
epochs="${1:-6}"
shift || true
batches=("${@:-4096 8192}")
read -r -a batches <<<"${batches[*]}"
root="${LSGD_OUT:-out/study-layerwise}"
threads="${THREADS:-2}"

# One row: name, then `lsgd-host run` flags. The LR of every row is given at the reference batch
# 256 and scaled by the schedule (linear for SGD and LARS, square root for LAMB, as its paper).
rows=(
  "SGD|--schedule warmup --base-lr 0.1"
  "LARS (SGD + lars)|--schedule warmup --base-lr 0.1 --layer-rate lars --set layer_rate.coefficient=0.01"
  "AdamW|--schedule warmup --set schedule.scaling=sqrt --optimizer adamw --base-lr 0.001 --weight-decay 0.01"
  "LAMB (AdamW + lamb)|--schedule warmup --set schedule.scaling=sqrt --optimizer adamw --base-lr 0.005 --weight-decay 0.01 --layer-rate lamb"
)

printf '| optimizer | %s |\n|---|%s\n' "$(printf 'batch %s | ' "${batches[@]}" | sed 's/ | $//')" \
  "$(printf -- '---|%.0s' "${batches[@]}")"
for row in "${rows[@]}"; do
  name="${row%%|*}"
  read -r -a flags <<<"${row#*|}"
  line="| $name |"
  for b in "${batches[@]}"; do
    out="$root/$(echo "$name" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | tr 'A-Z' 'a-z')-$b"
    log="$out.log"
    mkdir -p "$(dirname "$out")"
    # Warmup over the first third of the run, no decay (the milestones lie beyond it): the rows
    # differ only in the update.
    if "$lsgd" run --model cnn --epochs "$epochs" --global-batch "$b" --reference-batch 256 \
        --threads "$threads" --device cpu --seed 1 \
        --set schedule.warmup_epochs="$(python3 -c "print($epochs/3)")" \
        "${flags[@]}" --out "$out" >"$log" 2>&1; then
      acc="$(grep -o 'test accuracy [0-9.]*%' "$log" | tail -1 | awk '{print $3}')"
    else
      acc="$(grep -o 'diverged at step [0-9]*' "$log" | head -1 || true)"
      acc="${acc:-failed (see $log)}"
    fi
    line+=" $acc |"
  done
  echo "$line"
done
