#!/usr/bin/env bash
# Quick start, the main job: installs what is missing, builds, and runs Switchyard on a model.
# Without --model the command falls back to a generated demo model and says so.
# Usage: scripts/run.sh [generate options...]   e.g. scripts/run.sh --model my.gguf --prompt "Hi"
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
if [ $# -eq 0 ]; then
  set -- --prompt "Once upon a time" -n 48
fi
exec "${SWITCHYARD_BUILD_DIR:-$root/build}/switchyard" generate "$@"
