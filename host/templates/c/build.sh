#!/usr/bin/env bash
# Builds this plugin into target/{{name}}.wasm (or the path given). Needs clang-19, lld-19,
# libclang-rt-19-dev-wasm32 and wasi-libc (Debian), and lsgd-plugin-build from lsgd-host's
# plugins/ ($LSGD_PLUGIN_BUILD, where lsgd-host's scripts put it, or PATH), which writes the C
# bindings and lsgd_kit.h and turns the core module into a component.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$(realpath -m -- "${1:-$here/target/{{name}}.wasm}")"
{{find_tool}}
tool="$(find_tool LSGD_PLUGIN_BUILD lsgd-plugin-build "$lsgd_cache/target/debug/lsgd-plugin-build")"
work="$here/target/build"
mkdir -p "$work" "$(dirname "$out")"
"$tool" c-bindings "$here/wit" {{world}} "$work"
# -ffp-contract=off: no fused multiply-add, so float results match other languages bit for bit.
clang-19 --target=wasm32-wasi -mexec-model=reactor -O2 -ffp-contract=off -Wall -Wextra \
    -Wno-unused-function -Wno-unused-parameter -I "$work" \
    -Wl,--strip-all -o "$work/core.wasm" "$here"/*.c "$work/lsgd.c"
"$tool" componentize "$work/core.wasm" "$here/wit" {{world}} "$out"
echo "{{name}}: $out ($(stat -c %s "$out") bytes)"
