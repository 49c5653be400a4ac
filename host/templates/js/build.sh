#!/usr/bin/env bash
# Builds this plugin into target/{{name}}.wasm (or the path given). Needs componentize-qjs 0.4
# (`npm install componentize-qjs`): $COMPONENTIZE_QJS, lsgd-host's npm folder, or PATH.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$(realpath -m -- "${1:-$here/target/{{name}}.wasm}")"
{{find_tool}}
componentize_qjs="$(find_tool COMPONENTIZE_QJS componentize-qjs "$lsgd_cache/npm/node_modules/.bin/componentize-qjs")"
mkdir -p "$(dirname "$out")"
# --sync: no component-model async ABI (the host runs without it). No --stub-wasi: the sandbox's
# (empty) WASI carries stderr, where QuickJS's runtime reports an exception that escapes a call,
# and the host puts its message and stack first in the fault.
"$componentize_qjs" --wit "$here/wit" --world {{world}} --js "$here/plugin.js" \
    --module-root "$here" --sync -o "$out" >/dev/null
echo "{{name}}: $out ($(stat -c %s "$out") bytes)"
