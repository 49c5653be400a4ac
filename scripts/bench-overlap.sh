#!/usr/bin/env bash
# The overlap lab (README, "Overlap against DDP"): on two emulated hosts (scripts/netlab.sh, one
# rank each) at 1 Gbit/s and 100 Mbit/s, the cnn, ResNet-20 on 3×32×32 and a 105 MB wide MLP,
# lsgd-host with and without --overlap against the step's bounds F+B+C and F+max(B, C), and
# PyTorch DDP (gloo, host/bench/pytorch_ddp.py) at bucket caps 1 (not for the MLP), 5, 25
# (its default) and 100 MiB; 3 interleaved rounds; one Markdown table (scripts/bench-overlap.py
# says how it is read). Release build; needs root; installs the full torch wheel for the DDP
# side. 34 minutes on the 2-core build machine.
#
# Usage: bench-overlap.sh [--rates 1gbit,100mbit] [--models cnn,resnet20,wide-mlp] [--ddp-buckets 1,5,25,100]
# Raw JSON (results.jsonl, each run's metrics) stays in $LSGD_OUT (default out/bench-overlap);
# LSGD_BIN=PATH measures that binary.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
bash scripts/netlab.sh check >/dev/null || { bash scripts/netlab.sh check; exit 3; }
bash scripts/setup.sh --python-torch >&2
if [[ -n "${LSGD_BIN:-}" ]]; then
  lsgd="$LSGD_BIN"
else
  cargo build --locked --release -p lsgd-host >&2
  bash scripts/build-plugins.sh >&2
  lsgd="$CARGO_TARGET_DIR/release/lsgd-host"
fi
out="${LSGD_OUT:-out/bench-overlap}"
rm -f "$out/results.jsonl"
trap 'bash scripts/netlab.sh down' EXIT
"$LSGD_VENV/bin/python" scripts/bench-overlap.py "$lsgd" "$out" "$@"
