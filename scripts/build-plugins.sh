#!/usr/bin/env bash
# Builds every WebAssembly guest (plugins/* except the lsgd-policy library, and tests/guests/*)
# as a component in one cargo invocation, then copies each to <target>/plugins/<crate-name>.wasm,
# where the host and its tests look for them. Honours CARGO_TARGET_DIR.
#
# Usage: build-plugins.sh          build and copy every guest
#        build-plugins.sh --list   print the guest crate names, one a line, and build nothing
set -euo pipefail

list_only=false
case "${1:-}" in
    "") ;;
    --list) list_only=true ;;
    *) echo "usage: $0 [--list]" >&2; exit 2 ;;
esac

# A relative CARGO_TARGET_DIR means relative to the caller's directory, not the repository's.
if [[ -n "${CARGO_TARGET_DIR:-}" ]]; then
    CARGO_TARGET_DIR="$(realpath -m -- "$CARGO_TARGET_DIR")"
    export CARGO_TARGET_DIR
fi
root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# Guest crates are the cdylibs under plugins/ and tests/guests/; the metadata also tells where
# cargo puts its output (CARGO_TARGET_DIR, a config file's build.target-dir, or ./target).
read -r target_dir crates < <(
    cargo metadata --no-deps --format-version 1 | python3 -c '
import json, os, sys
meta = json.load(sys.stdin)
root = meta["workspace_root"]
names = sorted(
    p["name"]
    for p in meta["packages"]
    if os.path.relpath(p["manifest_path"], root).split(os.sep)[0] in ("plugins", "tests")
    and any("cdylib" in t["crate_types"] for t in p["targets"])
)
print(meta["target_directory"], " ".join(names))
'
)
[[ -n "$crates" ]] || { echo "build-plugins: no guest crates found" >&2; exit 1; }
if $list_only; then
    printf '%s\n' $crates
    exit 0
fi

target=wasm32-wasip2
if ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
fi

args=()
for c in $crates; do args+=(-p "$c"); done
cargo build --profile plugin --target "$target" "${args[@]}"

out="$target_dir/plugins"
mkdir -p "$out"
count=0
bytes=0
for c in $crates; do
    src="$target_dir/$target/plugin/${c//-/_}.wasm"
    dest="$out/$c.wasm"
    # A component starts with \0asm and layer/version 0d 00 01 00; a core module has 01 00 00 00.
    magic="$(head -c 8 "$src" | od -An -tx1 | tr -d ' \n')"
    if [[ "$magic" != "0061736d0d000100" ]]; then
        echo "build-plugins: $src is not a component (header $magic)" >&2
        exit 1
    fi
    cp -- "$src" "$dest"
    count=$((count + 1))
    bytes=$((bytes + $(stat -c %s "$dest")))
done
echo "build-plugins: $count components in $out ($bytes bytes total, $((bytes / 1024)) KiB)"
