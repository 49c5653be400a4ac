#!/usr/bin/env bash
# `lsgd-host bench ddp` in a release build: mpirun -np N lsgd-host run vs the same job in
# PyTorch DistributedDataParallel (gloo) under torchrun (samples/s ratio from one run), and each
# side's communication time per step. Installs the full torch wheel first (the PyTorch side
# needs an importable torch; see docs/training.md, "libtorch") and needs Open MPI's mpirun. Arguments go to
# `lsgd-host bench ddp` (e.g. --np 2 --threads 1 --global-batch 512).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
bash scripts/setup.sh --python-torch
cargo build --locked --release -p lsgd-host
bash scripts/build-plugins.sh
"$CARGO_TARGET_DIR/release/lsgd-host" bench ddp "$@"
