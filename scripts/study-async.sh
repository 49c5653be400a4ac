#!/usr/bin/env bash
# Issue 16's comparison of synchronous and asynchronous SGD: the same job at 2 and 3 workers
# in `--mode sync` (every rank a worker, gradients all-reduced, global batch 64 per worker)
# and `--mode async` (one more rank as parameter server, 64 samples per gradient), the same
# number of samples (epochs) and seeds; optionally with one worker slowed (SLOW_MS). Prints a
# Markdown table: test accuracy per seed, samples/s and, for async, the staleness of the
# applied gradients. Every run stays under $LSGD_OUT (default out/study-async); runs that
# finished are not trained again (their logs are read).
#
# Usage: scripts/study-async.sh [EPOCHS [SEED ...]]    default: 2 epochs, seeds 1 2
# Extra settings through the environment: MODEL (default cnn), TRAIN (training samples,
# default all 60000), WORKERS (default "2 3"), SLOW_MS (default 0: nobody slowed; else rank 1
# sleeps that long before each gradient), LSGD_BIN (a binary built earlier: no set-up or build).
# Under `scripts/netlab.sh run -- scripts/study-async.sh …` the ranks run on the emulated
# cluster's hosts (rank 0, the server in async mode, on h1).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
# LSGD_BIN: a binary built earlier (and its plugins, already built); else set up and build.
if [[ -n "${LSGD_BIN:-}" ]]; then
  lsgd="$LSGD_BIN"
else
  bash scripts/setup.sh
  cargo build --locked --release -p lsgd-host
  bash scripts/build-plugins.sh
  lsgd="$CARGO_TARGET_DIR/release/lsgd-host"
fi
epochs="${1:-2}"
shift || true
seeds=("${@:-1 2}")
read -r -a seeds <<<"${seeds[*]}"
read -r -a workers <<<"${WORKERS:-2 3}"
model="${MODEL:-cnn}"
train="${TRAIN:-60000}"
slow="${SLOW_MS:-0}"
root="${LSGD_OUT:-out/study-async}"
[ "$slow" != 0 ] && root="$root-slow$slow"
per_worker=64

echo "$model, Fashion-MNIST first $train training samples, test 10k, $epochs epochs, $per_worker samples per worker per gradient, base LR 0.1 at batch 256 (linear scaling), warmup plugin, 1 thread per rank, $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo " with uncommitted changes")$([ "$slow" != 0 ] && echo ", rank 1 sleeping ${slow} ms before each gradient")"
echo
printf '| mode | workers | ranks | batch per update | %s | mean | samples/s | staleness mean | staleness max | staleness histogram (seed %s) |\n' \
  "$(printf 'seed %s | ' "${seeds[@]}" | sed 's/ | $//')" "${seeds[0]}"
printf '|---|---|---|---|%s---|---|---|---|---|\n' "$(printf -- '---|%.0s' "${seeds[@]}")"
for w in "${workers[@]}"; do
  for mode in sync async; do
    if [ "$mode" = sync ]; then np="$w" batch=$((per_worker * w)); else np=$((w + 1)) batch="$per_worker"; fi
    accs=() speeds=() stale_mean=() stale_max=() hist=""
    for s in "${seeds[@]}"; do
      out="$root/$mode-w$w-seed$s"
      log="$out.log"
      mkdir -p "$root"
      slow_args=()
      [ "$slow" != 0 ] && slow_args=(--slow-rank 1 --slow-ms "$slow")
      if ! grep -q '^weights blake3' "$log" 2>/dev/null; then
        mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
          -x LSGD_PLUGIN_PATH="$CARGO_TARGET_DIR/plugins" \
          "$lsgd" run --mode "$mode" --model "$model" --train-subset "$train" --epochs "$epochs" \
          --global-batch "$batch" --threads 1 --device cpu --seed "$s" --schedule warmup \
          "${slow_args[@]}" --quiet --out "$out" >"$log" 2>&1 \
          || { echo "| $mode | $w | run failed, see $log |"; continue 2; }
      fi
      accs+=("$(grep -o 'test accuracy [0-9.]*%' "$log" | awk '{print $3}' | tr -d %)")
      speeds+=("$(grep -o '[0-9.]* samples/s' "$log" | awk '{print $1}')")
      if [ "$mode" = async ]; then
        stale_mean+=("$(grep -o 'staleness mean [0-9.]*' "$log" | awk '{print $3}')")
        stale_max+=("$(grep -o 'max [0-9]* (steps' "$log" | awk '{print $2}')")
        [ -z "$hist" ] && hist="$(grep -o 'gradients {[^}]*}' "$log" | sed 's/gradients //')"
      fi
    done
    mean="$(printf '%s\n' "${accs[@]}" | awk '{ s += $1 } END { printf "%.2f", s / NR }')"
    speed="$(printf '%s\n' "${speeds[@]}" | awk '{ s += $1 } END { printf "%.0f", s / NR }')"
    if [ "$mode" = async ]; then
      sm="$(printf '%s\n' "${stale_mean[@]}" | awk '{ s += $1 } END { printf "%.2f", s / NR }')"
      sx="$(printf '%s\n' "${stale_max[@]}" | sort -n | tail -1)"
    else
      sm=- sx=- hist=-
    fi
    printf '| %s | %s | %s | %s | %s | %s%% | %s | %s | %s | %s |\n' "$mode" "$w" "$np" "$batch" \
      "$(printf '%s%% | ' "${accs[@]}" | sed 's/ | $//')" "$mean" "$speed" "$sm" "$sx" "$hist"
  done
done
