#!/usr/bin/env bash
# Builds this Python plugin into a component: ./build.sh [OUT.wasm]   (default: target/label-smoothing-python.wasm)
# Prerequisites and steps: ../lsgd-plugin-build/kit/python/build.sh, shared by the Python plugins.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../lsgd-plugin-build/kit/python/build.sh" \
    "$(dirname "${BASH_SOURCE[0]}")" label-smoothing-python label-smoothing-plugin "$@"
