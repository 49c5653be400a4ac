#!/usr/bin/env bash
# The main job: installs what is missing, builds lsgd-host and the reference plugins, and trains
# the `cnn` on Fashion-MNIST with Goyal et al.'s warmup schedule as a WASM plugin: global batch
# 1024 (k = 4 reference batches of 256, so the LR warms up from 0.1 to 0.4 over the first epoch),
# ×0.1 at epoch 3, 4 epochs; a few minutes on 2 cores. Prints the test accuracy and plots the
# curves. Extra arguments go to `lsgd-host run` (e.g. --epochs 10, --model resnet).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
bash scripts/setup.sh
# The dev profile builds dependencies (libtorch bindings, wasmtime) optimised and shares them
# with the test command, so a fresh machine compiles wasmtime once, not twice.
cargo build --locked -p lsgd-host
bash scripts/build-plugins.sh
out="${LSGD_OUT:-out/main}"
lsgd="$CARGO_TARGET_DIR/debug/lsgd-host"
# The main job is meant to be re-run: each run replaces the last one's files in $out, unless
# the arguments continue it (--resume).
fresh=(--overwrite)
for a in "$@"; do [[ "$a" == --resume* ]] && fresh=(); done
# The job's flags, less those the caller gives (a single-valued flag given twice is refused).
job=()
defaults=(--schedule warmup --model cnn --epochs 4 --global-batch 1024 --base-lr 0.1 --out "$out")
for ((i = 0; i < ${#defaults[@]}; i += 2)); do
  flag="${defaults[i]}" given=
  for a in "$@"; do [[ "$a" == "$flag" || "$a" == "$flag="* ]] && given=1; done
  [[ -n "$given" ]] || job+=("$flag" "${defaults[i + 1]}")
done
"$lsgd" run "${job[@]}" --set schedule.warmup_epochs=1 --set schedule.milestones=3 \
  "${fresh[@]}" "$@"
"$lsgd" plot "$out/metrics.jsonl" -o "$out/curves.png"
