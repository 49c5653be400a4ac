#!/usr/bin/env bash
# The CUDA path on a machine with one NVIDIA GPU, from a fresh checkout, in one command:
# installs what is missing (setup.sh installs the full torch wheel with its CUDA libraries where
# a driver is present), builds release, runs every CUDA-gated test, trains the cnn and
# ResNet-20 on CUDA in fp32, bf16 and fp16, and times `bench train` on CUDA against PyTorch on
# CUDA. Each part prints its row of the table as soon as it ends (and appends it to
# $GPU_CHECK_TABLE), so a run that is cut off still reports what it did; a part that fails is
# reported and the next one runs. Sized for ~8 minutes on an H100 (docs/gpu.md); each
# training run is one epoch of Fashion-MNIST at batch 256 (235 steps; GPU_CHECK_EPOCHS).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"

epochs="${GPU_CHECK_EPOCHS:-1}"
table="${GPU_CHECK_TABLE:-$LSGD_CACHE_ROOT/gpu-check.md}"
mkdir -p "$(dirname "$table")"
started=$SECONDS
failed=0
row() {  # part, result, detail
  printf '| %s | %s | %s | %4d s |\n' "$1" "$2" "$3" $((SECONDS - started)) | tee -a "$table"
}
part() {  # part name, seconds allowed, command…: runs it, logs it, reports ok/FAILED
  local name="$1" limit="$2" log
  shift 2
  log="$(logof "$name")"
  mkdir -p "$(dirname "$log")"
  timeout "$limit" "$@" >"$log" 2>&1
  local status=$?
  [ "$status" -eq 0 ] && return 0
  failed=$((failed + 1))
  [ "$status" -eq 124 ] && status="timed out after $limit s"
  row "$name" "FAILED ($status)" "log: $log; last line: $(tail -n 1 "$log" | cut -c1-160)"
  return 1
}
logof() { echo "$LSGD_CACHE_ROOT/gpu-check-logs/${1//[^A-Za-z0-9]/_}.log"; }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi -L fails); nothing to check" >&2
  exit 2
fi
printf '\n| part | result | detail | at |\n|---|---|---|---|\n' | tee -a "$table"
row "GPU" "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1)" \
  "driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1); $(nproc) cores"

part "install" 1200 bash scripts/setup.sh --python-torch &&
  row "install" "ok" "$("$LSGD_VENV/bin/python" -W ignore -c \
    'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, sees {torch.cuda.get_device_name(0)}")' 2>&1)"

# One release build of the tests, which also builds the binary they run (target/release), so
# the training below uses the binary the tests checked and nothing is compiled twice.
crates=(-p lsgd-host -p lsgd-runtime -p lsgd-collective -p lsgd-train -p lsgd-policy -p lsgd-codec)
build() {
  cargo test --locked --release "${crates[@]}" --tests --no-run &&
    bash scripts/build-plugins.sh
}
part "build" 1200 build && row "build" "ok" "release: tests, lsgd-host, plugins"
bin="$CARGO_TARGET_DIR/release/lsgd-host"
cuda_linked=$(ldd "$bin" 2>/dev/null | grep -c 'libtorch_cuda' || true)

# Every test whose name says cuda: each skips with a message where libtorch sees no GPU, so a
# skip here means the build did not link libtorch_cuda (see "libtorch" in docs/training.md).
cuda_tests() { cargo test --locked --release "${crates[@]}" --tests cuda -- --nocapture; }
if part "CUDA tests" 600 cuda_tests; then
  log="$(logof "CUDA tests")"
  row "CUDA tests" "ok" "$(awk '/^test result:/ {p+=$4; f+=$6} END {print p " passed, " f " failed"}' "$log"); \
skipped: $(grep -c '^skipped' "$log"); libtorch_cuda linked: $cuda_linked"
fi

# A few hundred steps of each model at each precision: samples/s and the accuracy after them.
train() {  # model flags…, precision
  local precision="${*: -1}" out
  out="$LSGD_CACHE_ROOT/gpu-check-runs/$(date +%s%N)"
  "$bin" run --device cuda --schedule warmup --global-batch 256 --epochs "$epochs" \
    --precision "$precision" --out "$out" --overwrite --quiet "${@:1:$#-1}"
}
for model in "cnn" "resnet-20"; do
  flags=(--model cnn)
  [ "$model" = resnet-20 ] && flags=(--model resnet --depth 20)
  for precision in fp32 bf16 fp16; do
    name="train $model $precision"
    if part "$name" 300 train "${flags[@]}" "$precision"; then
      log="$(logof "$name")"
      row "$name" "ok" "$(grep -E '^test accuracy|^fp16 loss scale' "$log" | sed 's/; metrics in.*//' | tr '\n' ' ' | cut -c1-200)"
    fi
  done
done

# Both sides of `bench train` on the GPU, fp32 and bf16 in the same rounds.
for model in "cnn" "resnet-20"; do
  flags=(--model cnn --global-batch 256)
  [ "$model" = resnet-20 ] && flags=(--model resnet --depth 20 --dataset cifar10 --synthetic 5000 --augment cifar --global-batch 128)
  name="bench train $model"
  if part "$name" 300 "$bin" bench train --device cuda --precision bf16 --rounds 3 --steps 40 \
    --warmup-steps 5 "${flags[@]}"; then
    log="$(logof "$name")"
    row "$name" "ok" "$(grep -E 'ratio|samples/s' "$log" | tr -s ' ' | tr '\n' ';' | cut -c1-300)"
  fi
done

echo "gpu-check: $failed part(s) failed in $((SECONDS - started)) s; table in $table" >&2
[ "$failed" -eq 0 ]
