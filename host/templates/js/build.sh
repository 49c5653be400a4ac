#!/usr/bin/env bash
# Builds this plugin into target/{{name}}.wasm (or the path given). Needs componentize-qjs 0.4
# (`npm install componentize-qjs`), on PATH or named by $COMPONENTIZE_QJS.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$(realpath -m -- "${1:-$here/target/{{name}}.wasm}")"
mkdir -p "$(dirname "$out")"
# --sync: no component-model async ABI (the host runs without it); --stub-wasi: no WASI imports.
"${COMPONENTIZE_QJS:-componentize-qjs}" --wit "$here/wit" --world {{world}} --js "$here/plugin.js" \
    --module-root "$here" --sync --stub-wasi -o "$out" >/dev/null
echo "{{name}}: $out ($(stat -c %s "$out") bytes)"
