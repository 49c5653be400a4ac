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
# tch builds against the venv's libtorch; crates/train/build.rs embeds its path as an rpath. The path is
# known before setup.sh creates the venv (scripts source this file first), so it is computed
# from the interpreter the venv is made with, not looked up.
if [ -z "${LIBTORCH:-}" ]; then
  _py="$(python3 -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')"
  export LIBTORCH="$LSGD_VENV/lib/$_py/site-packages/torch"
  unset _py
fi
