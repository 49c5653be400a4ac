#!/usr/bin/env bash
# Builds this plugin into target/{{name}}.wasm (or the path given). Needs Rust >= 1.95 with the
# wasm32-wasip2 target (`rustup target add wasm32-wasip2`); the target's linker makes a component.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$(realpath -m -- "${1:-$here/target/{{name}}.wasm}")"
cargo build --quiet --release --target wasm32-wasip2 --manifest-path "$here/Cargo.toml"
target_dir="$(cd "$here" && cargo metadata --no-deps --format-version 1 |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
mkdir -p "$(dirname "$out")"
cp "$target_dir/wasm32-wasip2/release/{{crate}}.wasm" "$out"
echo "{{name}}: $out ($(stat -c %s "$out") bytes)"
