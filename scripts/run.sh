#!/usr/bin/env bash
# Quick start, the main job: installs what is missing, builds the `switchyard` binary alone, and
# starts the Switchyard server (`switchyard serve`) on tcp://127.0.0.1:5555 until Ctrl-C. Without
# --model it serves a generated demo model and says so. Send it a job from another shell, e.g.
#   /usr/bin/python3 clients/python/example_submit.py tcp://127.0.0.1:5555 "Once upon a time"
# Usage: scripts/run.sh [serve options...]   e.g. scripts/run.sh --model my.gguf --config my.yaml
# (`build/switchyard generate ...` still runs one prompt without a server.)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
# Only the server binary: the tests and benchmarks are built by scripts/test.sh.
"$root/scripts/build.sh" --target switchyard
exec "${SWITCHYARD_BUILD_DIR:-$root/build}/switchyard" serve "$@"
