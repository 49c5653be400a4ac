#!/usr/bin/env bash
# Builds this JavaScript plugin into a component: ./build.sh [OUT.wasm]   (default: target/warmup-js.wasm)
# Needs componentize-qjs 0.4 (npm install componentize-qjs), on PATH or named by $COMPONENTIZE_QJS.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name=warmup-js world=schedule-plugin
out="$(realpath -m -- "${1:-$here/target/$name.wasm}")"
mkdir -p "$(dirname "$out")"
# --sync: no component-model async ABI (the host runs without it). No --stub-wasi: the sandbox's
# (empty) WASI carries stderr, where QuickJS's runtime reports an exception that escapes a call,
# and the host puts its message and stack first in the fault.
# The module root is plugins/, so the import of the shared kit resolves.
"${COMPONENTIZE_QJS:-componentize-qjs}" --wit "$here/wit" --world "$world" --js "$here/warmup.js" \
    --module-root "$here/.." --sync -o "$out" >/dev/null
echo "$name: $out ($(stat -c %s "$out") bytes)"
