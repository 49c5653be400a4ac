#!/usr/bin/env bash
# Runs every check and test of lsgd-host; installs what is missing first. CI runs this.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"
# The tests need an importable torch (bench ddp's PyTorch side, torch oracles), not only libtorch.
bash scripts/setup.sh --python-torch

step() { printf '\n== %s\n' "$*" >&2; }

step "format"
cargo fmt --all -- --check
cargo fmt --manifest-path plugins/lsgd-plugin-build/Cargo.toml -- --check

step "build the plugins and test guests (wasm32-wasip2)"
bash scripts/build-plugins.sh
bash scripts/build-guests.sh  # C, Python, JavaScript, Go plugins (toolchains, clippy'd build tool)

step "clippy: host (native) and guests (wasm32-wasip2)"
crates=(-p lsgd-host -p lsgd-runtime -p lsgd-collective -p lsgd-train -p lsgd-policy -p lsgd-codec)
cargo clippy --locked "${crates[@]}" -p lsgd-torch --all-targets -- -D warnings
mapfile -t guests < <(bash scripts/build-plugins.sh --list)
cargo clippy --locked --profile plugin --target wasm32-wasip2 "${guests[@]/#/-p=}" -- -D warnings

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

step "examples"
# The examples run the binary that the tests' build makes: a plain `cargo build` resolves the
# dependencies' features without the dev-dependencies, so it would compile ~100 crates
# (cranelift, wasmtime-environ, wit-component …) a second time on a cold machine.
cargo test --locked --no-run "${crates[@]}" --lib --bins --tests
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
# --no-fail-fast: a failing test binary must not hide the binaries after it; the closing line
# counts every test of every binary, and a binary that did not build or run fails the command.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --locked --no-fail-fast "${crates[@]}" --lib --bins --tests 2>&1 | tee "$log" || status=$?

step "lsgd-torch: build the Python package, install it into the venv, run its pytest suite"
# Its tests compare against the binary and plugins built above, and torch as the oracle.
pylog="$(mktemp)"
trap 'rm -f "$log" "$pylog"' EXIT
pystatus=0
LSGD_BIN="$CARGO_TARGET_DIR/debug/lsgd-host" bash scripts/python-package.sh --test -p no:cacheprovider \
  2>&1 | tee "$pylog" || pystatus=$?
# pytest's closing line: "N passed, M failed, … in Ts"; every cargo binary's "test result:" line.
awk -v status="$status" -v pystatus="$pystatus" '
  /^test result:/ { p += $4; f += $6 }
  /^(=+ )?[0-9]+ (passed|failed).* in [0-9.]+s/ {
    for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^(failed|errors?)/) f += $i } }
  END { printf "\ntests: %d passed, %d failed\n", p, f
        exit (p == 0 || f > 0 || status != 0 || pystatus != 0) }' "$log" "$pylog"
