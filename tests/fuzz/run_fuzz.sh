#!/bin/sh
# Runs the GGUF fuzzer for a bounded time on a fresh seed corpus (CTest fuzz_gguf_short).
# usage: run_fuzz.sh FUZZER MAKE_SEEDS WORKDIR SECONDS
set -eu
fuzzer=$1 make_seeds=$2 work=$3 seconds=$4
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
"$make_seeds" "$work/corpus"
# max_len 64 KiB: enough for every structure the reader has; larger inputs only slow the search.
# rss_limit 2 GiB: a parse that allocates more than that from a small input is a bug.
exec "$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 -timeout=10 \
  -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus"
