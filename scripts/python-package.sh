#!/usr/bin/env bash
# Builds lsgd-torch (crates/python) with the reference plugins in its package and installs it
# into the project venv; with --test, then runs its pytest suite (extra arguments go to pytest).
# The wheel is built with the dev profile in the shared target directory: the runtime's
# dependencies are already compiled there (at opt-level 2) for the host's tests, so this adds
# seconds, not a release build of wasmtime. The plugins are the ones scripts/build-plugins.sh
# put in $CARGO_TARGET_DIR/plugins (scripts/test.sh runs it first).
#
# Usage: python-package.sh [--test [PYTEST ARGS]]   dev wheel into $LSGD_CACHE_ROOT/wheels, installed
#        python-package.sh --release DIR            release wheel into DIR (plugins built first),
#                                                   not installed: `pip install DIR/lsgd_torch-*.whl`
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
run_tests=0
release_dir=
case "${1:-}" in
  --test) run_tests=1; shift ;;
  --release)
    [ $# -eq 2 ] || { echo "usage: $0 --release DIR" >&2; exit 2; }
    release_dir="$(realpath -m -- "$2")"; shift 2 ;;
esac
py="$LSGD_VENV/bin/python"
backend=crates/python/build_backend/lsgd_torch_build.py
pip_install() { "$py" -m pip install -q --disable-pip-version-check "$@"; }
"$py" -c 'import maturin' 2>/dev/null || "$LSGD_VENV/bin/maturin" --version >/dev/null 2>&1 ||
  { echo "setup: installing maturin and pytest into $LSGD_VENV" >&2; pip_install maturin==1.16.0 pytest==9.2.0; }
"$py" -c 'import pytest' 2>/dev/null || pip_install pytest==9.2.0
wheels="$LSGD_CACHE_ROOT/wheels"
mkdir -p "$wheels"
# One build and install at a time (parallel test runs share the venv, the target dir and the
# package's plugins folder).
exec 9>"$wheels/.lock"
flock 9
# Fails unless the wheel $1 carries the reference plugins.
check_plugins() {
  local listing
  listing="$("$py" -m zipfile -l "$1")"
  grep -q 'lsgd_torch/plugins/codec-top-k.wasm' <<<"$listing" ||
    { echo "python-package: $1 holds no reference plugins" >&2; exit 1; }
}
if [ -n "$release_dir" ]; then
  # The reference plugins built now, then the extension; a cold build takes ~20 min on 2 cores.
  mkdir -p "$release_dir"
  "$py" "$backend" stage-plugins --build
  "$LSGD_VENV/bin/maturin" build --release --locked -m crates/python/Cargo.toml -i "$py" \
    -o "$release_dir" >&2
  wheel="$(ls -t "$release_dir"/lsgd_torch-*.whl | head -1)"
  check_plugins "$wheel"
  echo "$wheel"
  exit 0
fi
rm -f "$wheels"/lsgd_torch-*.whl
# The plugins scripts/build-plugins.sh built, into the package folder (gitignored) the wheel
# carries (pyproject.toml's include).
"$py" "$backend" stage-plugins
"$LSGD_VENV/bin/maturin" build --quiet --profile dev --locked -m crates/python/Cargo.toml \
  -i "$py" -o "$wheels" >&2
check_plugins "$(ls "$wheels"/lsgd_torch-*.whl)"
pip_install --force-reinstall --no-deps "$wheels"/lsgd_torch-*.whl
flock -u 9
if [ "$run_tests" = 1 ]; then
  # A lint wrapper the caller set (scripts/test.sh) is for this build, not for what tests build.
  unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
  export LSGD_PLUGIN_PATH="${LSGD_PLUGIN_PATH:-$CARGO_TARGET_DIR/plugins}"
  export LSGD_BIN="${LSGD_BIN:-$CARGO_TARGET_DIR/debug/lsgd-host}"
  # The whole suite unless the arguments name tests of their own.
  case " $* " in *" crates/python/tests"*) ;; *) set -- crates/python/tests "$@" ;; esac
  exec "$py" -m pytest -q "$@"
fi
