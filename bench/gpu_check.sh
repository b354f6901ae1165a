#!/usr/bin/env bash
# Device check of the CUDA backend on one GPU (an H200, in under 8 minutes): builds the CUDA
# targets, runs the GPU tests, then bench_gpu (copy bandwidth, bf16 GEMM rate, decode and prefill
# of an 8B-shaped Llama with random weights made on the device). Run from the repository root:
#   bash bench/gpu_check.sh
# Figures and logs go under $OUT when it is set. Optional environment: SY_MODELS_DIR (folder with
# stories260K.gguf and reference-llamacpp.json; default ../shared/models, else ./build-models, a
# git-ignored folder a device session can carry),
# BUILD_DIR (default build-gpucheck), JOBS (default: all cores), BENCH_ARGS (extra bench_gpu flags),
# GRAPH_BATCHES (decode batches measured again with CUDA graphs, default 1,16; empty: none),
# QUANT_BATCHES (decode batches measured again with Q8_0 weights read by the quantized GEMV,
# default 1,8; empty: none), KV_DTYPE (bench_gpu's KV cache type, f16 as in serving or f32;
# default f16).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build-gpucheck}
jobs=${JOBS:-$(nproc)}
out=${OUT:-}
[ -n "$out" ] && mkdir -p "$out"
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
log() { echo "== $* ($(date +%T))"; }
t_start=$(date +%s)

log "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv 2>&1 || true
nvcc --version | tail -2

models=${SY_MODELS_DIR:-}
if [ -z "$models" ]; then
  for d in "$root/../shared/models" "$root/shared/models" "$root/build-models"; do
    if [ -f "$d/stories260K.gguf" ]; then models=$(cd "$d" && pwd); break; fi
  done
fi
[ -z "$models" ] && models="$root/build-models"  # absent: the model tests fail, the rest run
log "models: $models"

# The full tree needs the serving stack's packages (CAF, ZeroMQ, msgpack, yaml-cpp, Boost);
# without them, the GPU-only project builds the same CUDA targets.
common=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$(command -v nvcc)"
        -DSY_MODELS_DIR="$models")
log "configure"
if cmake -S "$root" -B "$build" "${common[@]}" -DSWITCHYARD_CUDA=ON -DSWITCHYARD_TESTS=ON \
     -DSWITCHYARD_BENCH=OFF > /tmp/sy_configure_full.log 2>&1; then
  echo "full tree"
else
  echo "full tree does not configure here (see /tmp/sy_configure_full.log): GPU-only project"
  tail -n 3 /tmp/sy_configure_full.log
  rm -rf "$build"
  cmake -S "$root/bench/gpu_standalone" -B "$build" "${common[@]}" || exit 1
fi
targets=(bench_gpu)
# The GPU test targets (with Boost.Test, or with the stand-in of the GPU-only project); every
# generator lists its targets in this file.
for t in $(grep -o 'test_gpu_[a-z_0-9]*\.dir' "$build/CMakeFiles/TargetDirectories.txt" 2>/dev/null \
           | sed 's/\.dir$//' | sort -u); do
  targets+=("$t")
done
log "build ${targets[*]}"
cmake --build "$build" --target "${targets[@]}" -j "$jobs" 2>&1 \
  | tee /tmp/sy_gpu_build.log ${out:+"$out/build.log"} | tail -n 30
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "build failed"; exit 1; }

status=0
if [ "${#targets[@]}" -gt 1 ]; then
  log "GPU tests"
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 240) 2>&1 \
    | tee /tmp/sy_gpu_tests.log ${out:+"$out/gpu_tests.log"}
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  if grep -q "(Skipped)" /tmp/sy_gpu_tests.log; then
    echo "GPU tests SKIPPED: no usable device seen by the CUDA runtime"
    status=1
  fi
else
  echo "GPU tests not configured"
  status=1
fi

kv_dtype=${KV_DTYPE:-f16}
log "bench_gpu (KV cache $kv_dtype)"
graph_batches=${GRAPH_BATCHES-1,16}
quant_batches=${QUANT_BATCHES-1,8}
# shellcheck disable=SC2086
timeout 360 "$build/bench_gpu" ${out:+--json "$out/bench_gpu.json"} \
  ${graph_batches:+--graph-batches "$graph_batches"} --quant-batches "$quant_batches" \
  --kv-dtype "$kv_dtype" ${BENCH_ARGS:-} 2>&1 \
  | tee /tmp/sy_bench_gpu.log ${out:+"$out/bench_gpu.log"}
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if [ -n "$graph_batches" ]; then
  log "decode without and with CUDA graphs (batches $graph_batches)"
  for b in ${graph_batches//,/ }; do
    grep -E "^\| decode ctx [0-9]+( graphs)? \| $b \|" /tmp/sy_bench_gpu.log
  done
fi
if [ -n "$quant_batches" ]; then
  log "decode with bf16 and with Q8_0 weights (batches $quant_batches)"
  for b in ${quant_batches//,/ }; do
    grep -E "^\| decode ctx [0-9]+( graphs)?( q8_0)? \| $b \|" /tmp/sy_bench_gpu.log
  done
fi
log "done in $(( $(date +%s) - t_start )) s, status $status"
exit $status
