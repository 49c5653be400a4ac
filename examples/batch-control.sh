#!/usr/bin/env bash
# Mikami et al. 2018 / Smith et al. 2018: instead of decaying the LR at epochs 30, 60, 80,
# multiply the global batch by 2 there (capped at 32768). The schedule sees the batch the
# batch-size plugin returned, so with linear scaling and no LR decay the LR doubles with it:
# the noise scale lr/B stays constant, as in warmup alone.
set -euo pipefail
lsgd="${LSGD_BIN:-lsgd-host}"
out="$(mktemp -d)"
"$lsgd" trace --batch-size batch-ramp --set batch_size.max_batch=32768 \
  --schedule warmup --set schedule.milestones= \
  --epochs 90 --steps-per-epoch 100 --global-batch 8192 --world-size 32 \
  --plot "$out/ramp.png" > "$out/ramp.csv"
# Epoch 30 onwards: batch 16384, LR 0.1 x 16384/256 = 6.4 (fewer steps per epoch, too).
awk -F, '$2 >= 30 && $2 < 60 { if ($4 != 16384 || $3 != 6.4) bad = 1 } END { exit bad }' "$out/ramp.csv"
# Epochs are counted in samples: 90 epochs of 819,200 samples, whatever the batch.
awk -F, 'NR > 1 { n += $4 } END { exit !(n == 90 * 819200) }' "$out/ramp.csv"
rm -rf "$out"
