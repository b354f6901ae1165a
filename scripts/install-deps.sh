#!/usr/bin/env bash
# Installs the Debian 12 packages Switchyard needs to build, test and run. Idempotent: packages
# already present are skipped, and nothing is fetched when all are there.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libcaf-dev cppzmq-dev libzmq3-dev libmsgpack-cxx-dev
  libboost-dev libboost-system-dev libboost-test-dev
  libyaml-cpp-dev
  nlohmann-json3-dev libcli11-dev libspdlog-dev prometheus-cpp-dev
  nats-server libnats-dev           # the cluster: JetStream (tests start their own nats-server)
  clang libclang-rt-14-dev          # libFuzzer for the GGUF fuzz target
  python3 python3-zmq python3-msgpack
  python3-matplotlib                # bench_loadgen --plot (latency CDFs as PNG)
  python3-prometheus-client         # it_metrics parses /metrics with the reference parser
  python3-numpy                     # independent forward passes that check the architectures
  python3-regex                     # reference for the BPE pre-tokenizer patterns
  python3-jinja2                    # reference renderer for the chat templates
  python3-jsonschema                # independent validator of constrained JSON output
  prometheus                        # promtool and a real Prometheus for tests/prometheus
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node.js runs tests/node (the official `openai` npm package against the HTTP door): Debian's
# nodejs and npm, only where no `node` is on PATH already (one installed another way counts).
if ! command -v node >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The SDK at the version tests/node/package-lock.json pins, into tests/node/node_modules.
node_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/node"
if [ ! -d "$node_dir/node_modules/openai" ]; then
  echo "install-deps: npm ci in tests/node"
  (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error)
fi
