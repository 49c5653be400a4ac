#!/usr/bin/env bash
# `lsgd-host bench train` in a release build: lsgd-host run vs the same job in PyTorch
# (samples/s ratio from one run) and the policies' share of a step. Installs the full torch
# wheel first (the PyTorch side needs an importable torch; see docs/training.md, "libtorch"). Arguments go to
# `lsgd-host bench train` (e.g. --threads 1 --global-batch 512).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
bash scripts/setup.sh --python-torch
cargo build --locked --release -p lsgd-host
bash scripts/build-plugins.sh
"$CARGO_TARGET_DIR/release/lsgd-host" bench train "$@"
