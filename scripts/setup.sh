#!/usr/bin/env bash
# Installs whatever lsgd-host needs and is missing; quick and silent when everything is there.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

APT_PACKAGES=(fonts-dejavu-core)
RUST_TARGETS=(wasm32-wasip2)

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup: no Rust toolchain; install rustup (https://rustup.rs) first" >&2
  exit 1
fi
installed_targets="$(rustup target list --installed)"
for t in "${RUST_TARGETS[@]}"; do
  grep -qx "$t" <<<"$installed_targets" || { echo "setup: adding rustup target $t" >&2; rustup target add "$t"; }
done
