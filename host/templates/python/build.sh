#!/usr/bin/env bash
# Builds this plugin into target/{{name}}.wasm (or the path given). Needs componentize-py 0.25
# (`pip install componentize-py`): $COMPONENTIZE_PY, lsgd-host's venv, or PATH.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$(realpath -m -- "${1:-$here/target/{{name}}.wasm}")"
{{find_tool}}
componentize_py="$(find_tool COMPONENTIZE_PY componentize-py "${LSGD_VENV:-$lsgd_cache/venv}/bin/componentize-py")"
mkdir -p "$(dirname "$out")"
# No --stub-wasi: the sandbox's (empty) WASI carries stderr, where CPython prints the
# traceback of an exception that escapes a call, and the host shows it in the fault.
"$componentize_py" -d "$here/wit" -w {{world}} componentize app -p "$here" -o "$out" >/dev/null
echo "{{name}}: $out ($(stat -c %s "$out") bytes)"
