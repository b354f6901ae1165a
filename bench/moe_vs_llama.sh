#!/usr/bin/env bash
# Mixture-of-experts speed side by side with llama.cpp: a Mixtral-style random-weight model of
# the 110M shape (8 experts, 2 per token; `make-model --arch mixtral`) in f16, q8_0 and q4_k_m,
# our CPU engine (bench_engine) against llama-bench on the same files, alternating file by file
# and round by round in one run, then a table of tokens/s and ratios (ours / llama.cpp).
#
#   bench/moe_vs_llama.sh LLAMA_CPP_BIN_DIR [--build DIR] [--dir DIR] [--threads N]
#                         [--rounds N] [--dtypes f16,q8_0,q4_k_m] [--shape 110M]
#
# LLAMA_CPP_BIN_DIR holds a llama-bench built from llama.cpp's public sources for the CPU (this
# script never builds it). --build: this repository's build folder with `switchyard` and
# bench/bench_engine (default ./build). --dir: where the model files are written once and reused
# (default /tmp/sy-moe-bench, outside the repository: keep the models out of it). Figures: pp512
# (one 512-token prompt in one step) and batch-1 decode tokens/s of both (llama-bench -p 512
# -n 128), then ours at batch 8 and 32; each the median of --rounds rounds, the ratios the
# median of the per-round ratios. The full JSON is kept beside the models (results.json).
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
}

[[ $# -ge 1 && $1 != -* ]] || usage
llama_dir=$1
shift
build=./build
dir=/tmp/sy-moe-bench
threads=2
rounds=3
dtypes=f16,q8_0,q4_k_m
shape=110M
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || usage
  case $1 in
    --build) build=$2 ;;
    --dir) dir=$2 ;;
    --threads) threads=$2 ;;
    --rounds) rounds=$2 ;;
    --dtypes) dtypes=$2 ;;
    --shape) shape=$2 ;;
    *) usage ;;
  esac
  shift 2
done

llama_bench=$llama_dir/llama-bench
bench_engine=$build/bench/bench_engine
for f in "$llama_bench" "$build/switchyard" "$bench_engine"; do
  [[ -x $f ]] || { echo "moe_vs_llama: no executable $f" >&2; exit 1; }
done

# The experts are part of the folder's name: bench_engine reuses any file named
# SHAPE-DTYPE.gguf in its --dir, so these files must not share a folder with dense ones.
models=$dir/mixtral-$shape-e8k2
mkdir -p "$models"
IFS=, read -r -a dtype_list <<< "$dtypes"
for d in "${dtype_list[@]}"; do
  f=$models/$shape-$d.gguf
  if [[ ! -f $f ]]; then
    # Written under a temporary name, so an interrupted run leaves no torn file to reuse.
    "$build/switchyard" make-model --shape "$shape" --arch mixtral --experts 8 --experts-used 2 \
      --dtype "$d" --seed 1 --out "$f.tmp"
    mv "$f.tmp" "$f"
  fi
done

echo "moe_vs_llama: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) before" >&2
"$bench_engine" --dir "$models" --shape "$shape" --dtypes "$dtypes" --threads "$threads" \
  --prompt 512 --decode-steps 128 --batches 1,8,32 --peer-llama-bench "$llama_bench" \
  --rounds "$rounds" > "$models/results.json"
echo "moe_vs_llama: load average $(cut -d' ' -f1-3 /proc/loadavg) after" >&2

python3 - "$models/results.json" <<'EOF'
import json, statistics, sys

r = json.load(open(sys.argv[1]))
print(f"{r['shape']} mixtral (8 experts, top-2), {r['threads']} threads, {r['rounds']} rounds; "
      "tokens/s, each the median of the rounds; ratio: ours / llama.cpp, the median of the "
      "per-round ratios")
head = ("dtype", "pp512 ours", "pp512 llama.cpp", "ratio", "tg b1 ours", "tg128 llama.cpp",
        "ratio", "b8 ours", "b32 ours")
rows, rounds = [], []
for x in r["results"]:
    peer = x["llama_cpp"]
    ratio = x["ours_over_llama_cpp"]
    dec = x["decode_tok_s"]
    rows.append((x["dtype"], f"{x['prefill_tok_s']:.1f}",
                 f"{statistics.median(peer['pp512']):.1f}", f"{ratio['prefill']:.2f}",
                 f"{dec['1']:.1f}", f"{statistics.median(peer['tg128']):.1f}",
                 f"{ratio['decode_batch1']:.2f}", f"{dec['8']:.1f}", f"{dec['32']:.1f}"))
    per = ratio.get("prefill_per_round", [ratio["prefill"]])
    per_tg = ratio.get("decode_batch1_per_round", [ratio["decode_batch1"]])
    rounds.append(f"{x['dtype']}: pp512 " + " ".join(f"{v:.2f}" for v in per) + ", tg b1 "
                  + " ".join(f"{v:.2f}" for v in per_tg))
widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
for row in [head] + rows:
    print("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
# A round far from the others was disturbed (other processes on the cores: llama.cpp's threads
# wait for each other spinning, so it loses far more than ours then).
print("ratios per round: " + "; ".join(rounds))
EOF
