#!/usr/bin/env bash
# Builds this C plugin into a component: ./build.sh [OUT.wasm]   (default: target/codec-int8-c.wasm)
# Prerequisites and steps: ../lsgd-plugin-build/kit/c/build.sh, shared by the C plugins.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../lsgd-plugin-build/kit/c/build.sh" \
    "$(dirname "${BASH_SOURCE[0]}")" codec-int8-c codec-plugin "$@"
