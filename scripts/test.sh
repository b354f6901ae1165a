#!/usr/bin/env bash
# Quick start, the tests: installs what is missing, builds, and runs every test with CTest.
# Tests read the shared models from ../shared/models beside the checkout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
cd "${SWITCHYARD_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "$@"
