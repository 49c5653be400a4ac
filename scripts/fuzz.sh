#!/usr/bin/env bash
# The long fuzzing campaign: the property tests that scripts/test.sh runs briefly
# (plugins/lsgd-codec/tests/fuzz.rs and tests/all/fuzz.rs), in a release build, drawing fresh
# random seeds for about SECONDS in all (default 1800), split evenly between the targets and run
# one at a time. Prints per target `fuzz TARGET: N cases in S s, F failures`, and every failure
# with its shrunk input and the LSGD_FUZZ_SEED that replays it:
#
#   LSGD_FUZZ_SEED=<hex> cargo test --release -p lsgd-host --test all fuzz::<test> -- --nocapture
#
# Usage: fuzz.sh [SECONDS]        (run it under `nice -n 19` on a shared machine)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"

total="${1:-1800}"
# The sandboxed targets decode with the plugins as built from this tree.
bash scripts/build-plugins.sh >/dev/null

# Built first, then run directly: a long `cargo test` would hold the build directory's lock.
exe() {  # the test executable of a `cargo test` selection
  # shellcheck disable=SC2086
  cargo test --locked --release --no-run --message-format=json "$@" |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1
}
codec="$(exe -p lsgd-codec --test fuzz)"
host="$(exe -p lsgd-host --test all)"
n=$(( $("$codec" --list | grep -c ': test$') + $("$host" fuzz:: --list | grep -c ': test$') ))
per=$(( total / n > 0 ? total / n : 1 ))
echo "fuzz: $n targets, about $per s each" >&2

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
# The integration tests find the plugins and examples relative to the repository.
LSGD_FUZZ_SECONDS="$per" "$codec" --nocapture --test-threads=1 2>&1 | tee -a "$log" || status=1
(cd host && LSGD_FUZZ_SECONDS="$per" "$host" fuzz:: --nocapture --test-threads=1) 2>&1 |
  tee -a "$log" || status=1
echo >&2
echo "== summary" >&2
grep -oE 'fuzz [a-z-]+: ([0-9]+ cases[^,]*, [0-9]+ failures|FAILURE.*)' "$log" >&2 || true
exit "$status"
