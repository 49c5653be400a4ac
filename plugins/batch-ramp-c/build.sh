#!/usr/bin/env bash
# Builds this C plugin into a component: ./build.sh [OUT.wasm]   (default: target/batch-ramp-c.wasm)
# Prerequisites and steps: ../lsgd-plugin-build/kit/c/build.sh, shared by the C plugins.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../lsgd-plugin-build/kit/c/build.sh" \
    "$(dirname "${BASH_SOURCE[0]}")" batch-ramp-c batch-size-plugin "$@"
