#!/usr/bin/env bash
# Builds the C plugin in DIR (every DIR/*.c, WIT in DIR/wit) into a component:
#   build.sh DIR NAME WORLD [OUT.wasm]     (default OUT: DIR/target/NAME.wasm)
# Needs clang-19, lld-19, libclang-rt-19-dev-wasm32 and wasi-libc (Debian), and lsgd-plugin-build
# (on PATH, or named by $LSGD_PLUGIN_BUILD); intermediate files go to $LSGD_WORK_DIR.
set -euo pipefail
dir="$(cd "$1" && pwd)" name="$2" world="$3"
out="$(realpath -m -- "${4:-$dir/target/$name.wasm}")"
tool="${LSGD_PLUGIN_BUILD:-lsgd-plugin-build}"
work="${LSGD_WORK_DIR:-$dir/target/build}"
mkdir -p "$work" "$(dirname "$out")"
"$tool" c-bindings "$dir/wit" "$world" "$work"
# -ffp-contract=off: no fused multiply-add, so every + and * rounds as the Rust reference's does.
clang-19 --target=wasm32-wasi -mexec-model=reactor -O2 -ffp-contract=off -Wall -Wextra \
    -Wno-unused-function -Wno-unused-parameter -I "$work" \
    -Wl,--strip-all -o "$work/core.wasm" "$dir"/*.c "$work/lsgd.c"
"$tool" componentize "$work/core.wasm" "$dir/wit" "$world" "$out"
echo "$name: $out ($(stat -c %s "$out") bytes)"
