#!/usr/bin/env bash
# Runs every check and test of lsgd-host; installs what is missing first. CI runs this.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
# Each step's wall time, printed at the end: the budget of a cold run is 35 minutes on CI's
# 2-core machine (docs/testing.md), and this says which step grew.
timings=() last_step="setup" last_at=$SECONDS
lap() {
  timings+=("$(printf '%5d s  %s' $((SECONDS - last_at)) "$last_step")")
  last_step="$*" last_at=$SECONDS
}
step() { lap "$@"; printf '\n== %s\n' "$*" >&2; }

# The tests need an importable torch (bench ddp's PyTorch side, torch oracles), not only libtorch.
bash scripts/setup.sh --python-torch

step "format"
cargo fmt --all -- --check
cargo fmt --manifest-path plugins/lsgd-plugin-build/Cargo.toml -- --check

# Clippy's lints, as errors, inside the builds themselves: cargo passes the workspace's crates
# (never their dependencies) through clippy-driver, which lints each and then compiles it as
# rustc would. A separate `cargo clippy` would compile every dependency (wasmtime, cranelift,
# the libtorch bindings) a second time in check mode on a cold machine.
clippy_driver="$(dirname "$(rustup which cargo)")/clippy-driver"
[ -x "$clippy_driver" ] || rustup component add clippy
linted() {
  RUSTC_WORKSPACE_WRAPPER="$clippy_driver" CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__" "$@"
}
crates=(-p lsgd-host -p lsgd-runtime -p lsgd-collective -p lsgd-train -p lsgd-policy -p lsgd-codec)

step "build the plugins and test guests (wasm32-wasip2; clippy -D warnings)"
linted bash scripts/build-plugins.sh
bash scripts/build-guests.sh  # C, Python, JavaScript, Go plugins (toolchains, clippy'd build tool)

step "crate boundaries"
# The plugin runtime builds without libtorch and MPI, the collectives without libtorch and
# wasmtime (docs/architecture.md); a dependency that creeps in fails here.
forbidden() {  # crate, pattern of dependencies it must not pull in
  if cargo tree --locked -p "$1" -e normal --prefix none | grep -E "^($2) v" >&2; then
    echo "$1 must not depend on the crates above" >&2
    exit 1
  fi
}
forbidden lsgd-runtime 'tch|torch-sys|mpi|mpi-sys'
forbidden lsgd-collective 'tch|torch-sys|wasmtime'

step "build the host and its tests (clippy -D warnings), run the examples"
# The examples run the binary that the tests' build makes: a plain `cargo build` resolves the
# dependencies' features without the dev-dependencies, so it would compile ~100 crates
# (cranelift, wasmtime-environ, wit-component …) a second time on a cold machine.
# The build's messages (JSON on stdout) name the test binaries for the runner below.
artifacts="$(mktemp)"
trap 'rm -f "$artifacts"' EXIT
linted cargo test --locked --no-run "${crates[@]}" --lib --bins --tests \
  --message-format=json-render-diagnostics >"$artifacts"
for ex in examples/*.sh; do
  echo "-- $ex" >&2
  LSGD_BIN="$CARGO_TARGET_DIR/debug/lsgd-host" bash "$ex" >/dev/null
done

step "netlab: the emulated cluster's tests (tests/all/netlab.rs)"
# Two hosts at 1 Gbit/s: training across them with bit-identical ranks, a cut link, a dead
# host under launch, a slow link. They need root and network namespaces, and pass after
# saying why where the lab cannot run.
bash scripts/netlab.sh check >&2 || echo "the netlab tests will skip" >&2

step "tests"
# Doc examples are guest code (`ignore` blocks), so only library, binary and integration tests run.
# scripts/run-tests.py runs every binary the build above made, as `cargo test --no-fail-fast`
# would (a failing binary does not hide the ones after it), two at a time (the integration
# binary beside the unit-test binaries), and records each test's time for the list at the end.
# The netlab tests mostly wait on network timeouts: they run in a process of their own beside
# the two slots, so their waits do not leave a core idle.
log="$(mktemp)" pylog="$(mktemp)" junit="$(mktemp --suffix .xml)"
trap 'rm -f "$artifacts" "$log" "$pylog" "$junit"' EXIT
times="$LSGD_CACHE_ROOT/test-times.tsv"
status=0
python3 scripts/run-tests.py --beside=netlab:: "$artifacts" "$times" 2>&1 | tee "$log" || status=$?

step "lsgd-torch: build the Python package, install it into the venv, run its pytest suite"
# Its tests compare against the binary and plugins built above, and torch as the oracle.
pystatus=0
LSGD_BIN="$CARGO_TARGET_DIR/debug/lsgd-host" linted bash scripts/python-package.sh --test -p no:cacheprovider \
  --junitxml "$junit" 2>&1 | tee "$pylog" || pystatus=$?
python3 scripts/run-tests.py --slowest 10 "$times" "$junit" >&2
lap
printf '\nwall time of each step:\n' >&2
printf '%s\n' "${timings[@]}" >&2
printf '%5d s  in all\n' "$SECONDS" >&2
# pytest's closing line: "N passed, M failed, … in Ts"; every cargo binary's "test result:" line.
awk -v status="$status" -v pystatus="$pystatus" '
  /^test result:/ { p += $4; f += $6 }
  /^(=+ )?[0-9]+ (passed|failed).* in [0-9.]+s/ {
    for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^(failed|errors?)/) f += $i } }
  END { printf "\ntests: %d passed, %d failed\n", p, f
        exit (p == 0 || f > 0 || status != 0 || pystatus != 0) }' "$log" "$pylog"
