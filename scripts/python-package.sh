#!/usr/bin/env bash
# Builds lsgd-torch (crates/python) and installs it into the project venv; with --test, then
# runs its pytest suite (extra arguments go to pytest). The wheel is built with the dev profile
# in the shared target directory: the runtime's dependencies are already compiled there (at
# opt-level 2) for the host's tests, so this adds seconds, not a release build of wasmtime.
# Users install the release build with `pip install ./crates/python` (docs/pytorch.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
run_tests=0
if [ "${1:-}" = "--test" ]; then run_tests=1; shift; fi
py="$LSGD_VENV/bin/python"
pip_install() { "$py" -m pip install -q --disable-pip-version-check "$@"; }
"$py" -c 'import maturin' 2>/dev/null || "$LSGD_VENV/bin/maturin" --version >/dev/null 2>&1 ||
  { echo "setup: installing maturin and pytest into $LSGD_VENV" >&2; pip_install maturin==1.16.0 pytest==9.2.0; }
"$py" -c 'import pytest' 2>/dev/null || pip_install pytest==9.2.0
wheels="$LSGD_CACHE_ROOT/wheels"
mkdir -p "$wheels"
# One build and install at a time (parallel test runs share the venv and the target dir).
exec 9>"$wheels/.lock"
flock 9
rm -f "$wheels"/lsgd_torch-*.whl
"$LSGD_VENV/bin/maturin" build --quiet --profile dev --locked -m crates/python/Cargo.toml \
  -i "$py" -o "$wheels" >&2
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
