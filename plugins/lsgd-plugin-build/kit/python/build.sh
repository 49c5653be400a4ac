#!/usr/bin/env bash
# Builds the Python plugin in DIR (module DIR/app.py, WIT in DIR/wit) into a component:
#   build.sh DIR NAME WORLD [OUT.wasm]     (default OUT: DIR/target/NAME.wasm)
# Needs componentize-py 0.25 (pip install componentize-py), on PATH or named by $COMPONENTIZE_PY.
set -euo pipefail
dir="$(cd "$1" && pwd)" name="$2" world="$3"
out="$(realpath -m -- "${4:-$dir/target/$name.wasm}")"
kit="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$(dirname "$out")"
# No --stub-wasi: the sandbox's WASI is empty (no files, environment or network; a fixed clock;
# seeded randomness) but carries stderr, where CPython prints the traceback of an exception that
# escapes a call, and the host puts it first in the fault.
"${COMPONENTIZE_PY:-componentize-py}" -d "$dir/wit" -w "$world" componentize app \
    -p "$dir" -p "$kit" -o "$out" >/dev/null
echo "$name: $out ($(stat -c %s "$out") bytes)"
