#!/usr/bin/env bash
# `lsgd-host bench loader` in a release build: image decoding and augmentation (images/s)
# against `lsgd-host run` on the same image folder (samples/s), from one run. Without
# --data-dir it writes synthetic 500×375 JPEGs first. Arguments go to `lsgd-host bench loader`
# (e.g. --loader-threads 1 --image-size 64).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
bash scripts/setup.sh
cargo build --locked --release -p lsgd-host
"$CARGO_TARGET_DIR/release/lsgd-host" bench loader "$@"
