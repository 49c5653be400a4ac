#!/usr/bin/env bash
# Builds the plugins written in C, Python, JavaScript and Go (every plugins/*/build.sh) into
# <target>/plugins/<name>.wasm, next to the Rust ones, after installing their toolchains
# (scripts/setup-guests.sh) and building our build tool (plugins/lsgd-plugin-build). A plugin
# whose sources, kit and tools are unchanged since its last build is not rebuilt.
#
# Usage: build-guests.sh          build what changed
#        build-guests.sh --list   print the plugin names, one a line, and build nothing
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# A relative CARGO_TARGET_DIR means relative to the caller's directory, not the repository's.
CARGO_TARGET_DIR="$(realpath -m -- "$CARGO_TARGET_DIR")"
cd "$LSGD_ROOT"

names=()
for b in plugins/*/build.sh; do names+=("$(basename "$(dirname "$b")")"); done
if [ "${1:-}" = "--list" ]; then printf '%s\n' "${names[@]}"; exit 0; fi

eval "$(bash scripts/setup-guests.sh)"
# Built through clippy-driver with -D warnings (what `cargo clippy` does, but producing the
# binary): the lint check costs no second compilation of the wasm-tools crates (~50 s cold).
clippy="$(dirname "$(rustup which cargo)")/clippy-driver"
if [ -x "$clippy" ]; then
  export RUSTC_WORKSPACE_WRAPPER="$clippy" CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
fi
cargo build --locked --quiet --manifest-path plugins/lsgd-plugin-build/Cargo.toml
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
export LSGD_PLUGIN_BUILD="$CARGO_TARGET_DIR/debug/lsgd-plugin-build"

out="$CARGO_TARGET_DIR/plugins"
work="$CARGO_TARGET_DIR/guests"
mkdir -p "$out" "$work"
tools="$("$GO" version) $("$COMPONENTIZE_PY" --version 2>&1)"
tools+=" $(sha256sum "$(dirname "$COMPONENTIZE_QJS")/../componentize-qjs/package.json")"
tools+=" $(sha256sum "$LSGD_PLUGIN_BUILD") $(clang-19 --version | head -1)"
built=0
for name in "${names[@]}"; do
  stamp="$( { echo "$tools"
              find -L "plugins/$name" plugins/lsgd-plugin-build/kit -type f -not -path '*/target/*' \
                -not -path '*/__pycache__/*' \
                -print0 | sort -z | xargs -0 sha256sum; } | sha256sum)"
  if [ -f "$out/$name.wasm" ] && [ "$(cat "$work/$name.stamp" 2>/dev/null)" = "$stamp" ]; then
    continue
  fi
  start=$SECONDS
  LSGD_WORK_DIR="$work/$name" bash "plugins/$name/build.sh" "$out/$name.wasm" >&2
  echo "build-guests: $name built in $((SECONDS - start)) s" >&2
  echo "$stamp" >"$work/$name.stamp"
  built=$((built + 1))
done
echo "build-guests: ${#names[@]} plugins in $out ($built rebuilt)" >&2
