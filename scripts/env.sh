# Sourced by the other scripts: where builds and caches live. Kept outside the clone so a fresh
# clone (CI) reuses the compiled dependencies of earlier runs on the same machine.
LSGD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export LSGD_ROOT
export LSGD_CACHE_ROOT="${LSGD_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/lsgd-host}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$LSGD_CACHE_ROOT/target}"
export LSGD_CACHE_DIR="${LSGD_CACHE_DIR:-$LSGD_CACHE_ROOT/components}"
export PATH="$HOME/.cargo/bin:$PATH"
# One Python virtual environment for every Python tool the project uses (libtorch for the
# trainer, guest toolchains such as componentize-py); created by setup.sh.
export LSGD_VENV="${LSGD_VENV:-$LSGD_CACHE_ROOT/venv}"
# tch builds against the venv's libtorch; host/build.rs embeds its path as an rpath.
for _torch in "$LSGD_VENV"/lib/python3*/site-packages/torch; do
  [ -d "$_torch/lib" ] && export LIBTORCH="${LIBTORCH:-$_torch}"
done
unset _torch
