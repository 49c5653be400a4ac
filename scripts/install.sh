#!/usr/bin/env bash
# Puts `lsgd-host` (and `lsgd-plugin-build`, which C and Go plugin projects build with) on the
# PATH: installs what is missing (scripts/setup.sh), builds the binary and the reference
# plugins, and links both binaries into a directory on the PATH (default ~/.cargo/bin, where
# rustup already put cargo). The link keeps the binary next to target/plugins/, so
# `lsgd-host run --schedule warmup` finds the reference plugins by name from anywhere.
#
# Usage: scripts/install.sh [--release] [--bin-dir DIR] [--guests]
#   --release   an optimised build (a few minutes more the first time); default: the dev build
#               the main job and the tests share (dependencies optimised, ours not)
#   --bin-dir   where the links go (default: $CARGO_HOME/bin, else ~/.cargo/bin)
#   --guests    also install the C, Python, JavaScript and Go plugin toolchains
#               (scripts/setup-guests.sh), which `lsgd-host new` projects build with
set -euo pipefail
caller_path="$PATH"  # env.sh adds ~/.cargo/bin; the check at the end is about the caller's PATH
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LSGD_ROOT"

profile=debug
cargo_profile=()
bin_dir="${CARGO_HOME:-$HOME/.cargo}/bin"
guests=false
while [ $# -gt 0 ]; do
  case "$1" in
    --release) profile=release cargo_profile=(--release) ;;
    --bin-dir) bin_dir="${2:?--bin-dir needs a directory}"; shift ;;
    --guests) guests=true ;;
    *) echo "usage: $0 [--release] [--bin-dir DIR] [--guests]" >&2; exit 2 ;;
  esac
  shift
done

bash scripts/setup.sh
cargo build --locked "${cargo_profile[@]}" -p lsgd-host
bash scripts/build-plugins.sh >&2
if $guests; then
  eval "$(bash scripts/setup-guests.sh)"
fi
cargo build --locked --quiet --manifest-path plugins/lsgd-plugin-build/Cargo.toml

mkdir -p "$bin_dir"
ln -sfn "$CARGO_TARGET_DIR/$profile/lsgd-host" "$bin_dir/lsgd-host"
ln -sfn "$CARGO_TARGET_DIR/debug/lsgd-plugin-build" "$bin_dir/lsgd-plugin-build"
echo "install: $bin_dir/lsgd-host -> $CARGO_TARGET_DIR/$profile/lsgd-host"
echo "install: $bin_dir/lsgd-plugin-build -> $CARGO_TARGET_DIR/debug/lsgd-plugin-build"
case ":$caller_path:" in
  *":$bin_dir:"*) ;;
  *) echo "install: $bin_dir is not on your PATH; add it: export PATH=\"$bin_dir:\$PATH\"" >&2 ;;
esac
