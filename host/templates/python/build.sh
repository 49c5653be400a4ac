#!/usr/bin/env bash
# Builds this plugin into target/{{name}}.wasm (or the path given). Needs componentize-py 0.25
# (`pip install componentize-py`), on PATH or named by $COMPONENTIZE_PY.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$(realpath -m -- "${1:-$here/target/{{name}}.wasm}")"
mkdir -p "$(dirname "$out")"
# --stub-wasi: the plugin imports no WASI at all, as the sandbox offers none.
"${COMPONENTIZE_PY:-componentize-py}" -d "$here/wit" -w {{world}} componentize app -p "$here" \
    --stub-wasi -o "$out" >/dev/null
echo "{{name}}: $out ($(stat -c %s "$out") bytes)"
