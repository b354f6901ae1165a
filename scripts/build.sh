#!/usr/bin/env bash
# Configures and builds Switchyard into ./build (Release).
# Usage: scripts/build.sh [--target T]... [cmake configure options...]
# With --target only those targets (and what they need) are built; without, everything.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${SWITCHYARD_BUILD_DIR:-$root/build}"
jobs="$(nproc 2>/dev/null || echo 2)"
targets=()
while [ $# -gt 0 ] && [ "$1" = "--target" ]; do
  targets+=(--target "$2")
  shift 2
done
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" -j "$jobs" "${targets[@]}"
