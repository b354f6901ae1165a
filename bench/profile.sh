#!/usr/bin/env bash
# Records where the CPU time of the engine or of a loaded server goes, with `perf record`, and
# draws it as a flame graph (bench/flamegraph.py) with a table of the heaviest frames.
#
#   bench/profile.sh [OPTIONS] engine [bench_engine args...]
#       perf runs BUILD/bench/bench_engine with the given arguments from start to end.
#   bench/profile.sh [OPTIONS] serve [bench_loadgen args...]
#       BUILD/bench/bench_loadgen --spawn starts `switchyard serve` and loads it; perf attaches to
#       that server process (all its threads) once it exists, waits --attach-delay seconds (the
#       model load), and records for --seconds seconds or until the server exits. The load
#       generator itself is not recorded. Its JSON goes to OUT/loadgen.json.
#
# OPTIONS
#   --build DIR          the build directory (default: build)
#   --out DIR            where perf.data, the folded stacks, the SVG and the table go
#                        (default: a new /tmp/sy-profile-XXXXXX)
#   --freq HZ            samples per second and thread (default 499: not a multiple of common
#                        timer periods, so the samples do not beat against them)
#   --call-graph MODE    dwarf (default; works on a Release build, from the unwind tables) or fp
#                        (needs -fno-omit-frame-pointer; a Release build gives broken stacks)
#   --event EV           default cpu-clock:u (user space only: what perf_event_paranoid 2 allows
#                        a user for their own processes); cpu-clock adds kernel time where allowed
#   --seconds S          serve: how long to record (default 20)
#   --attach-delay S     serve: seconds between the server's start and the recording (default 3)
#   --decode-only        engine with --table: record only the timed decode steps (perf starts
#                        disabled, and bench_engine --perf-ctl switches it on and off through
#                        perf's control FIFO), leaving out model load, warm-up and prefill
#   --title TEXT         the flame graph's title
#   --top N              rows of the heaviest-frames table (default 25)
#
# Writes OUT/perf.data, OUT/perf.txt (perf script), OUT/folded.txt, OUT/flame.svg, OUT/top.md.
# Needs perf (Debian: linux-perf) and python3.
set -euo pipefail

build=build
out=""
freq=499
callgraph=dwarf
event=cpu-clock:u
seconds=20
attach_delay=3
title=""
top=25
decode_only=0
here="$(cd "$(dirname "$0")" && pwd)"

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --freq) freq="$2"; shift 2 ;;
    --call-graph) callgraph="$2"; shift 2 ;;
    --event) event="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --attach-delay) attach_delay="$2"; shift 2 ;;
    --title) title="$2"; shift 2 ;;
    --top) top="$2"; shift 2 ;;
    --decode-only) decode_only=1; shift ;;
    -h|--help) usage ;;
    engine|serve) break ;;
    *) echo "profile.sh: unknown option $1" >&2; usage ;;
  esac
done
[[ $# -ge 1 ]] || usage
mode="$1"
shift
case "$callgraph" in
  dwarf|fp) ;;
  *) echo "profile.sh: --call-graph must be dwarf or fp, got '$callgraph'" >&2; exit 2 ;;
esac
command -v perf >/dev/null || { echo "profile.sh: perf not found (Debian: linux-perf)" >&2; exit 2; }
[[ -n "$out" ]] || out="$(mktemp -d /tmp/sy-profile-XXXXXX)"
mkdir -p "$out"
data="$out/perf.data"
record=(perf record -e "$event" -F "$freq" --call-graph "$callgraph" -o "$data")

case "$mode" in
  engine)
    bin="$build/bench/bench_engine"
    [[ -x "$bin" ]] || { echo "profile.sh: no $bin (build bench_engine)" >&2; exit 2; }
    [[ -n "$title" ]] || title="bench_engine $*"
    args=("$@")
    if [[ $decode_only -eq 1 ]]; then
      rm -f "$out/perf.ctl"
      mkfifo "$out/perf.ctl"
      record+=(-D -1 --control "fifo:$out/perf.ctl")
      args+=(--perf-ctl "$out/perf.ctl")
    fi
    "${record[@]}" -- "$bin" "${args[@]}" >"$out/bench_engine.json"
    ;;
  serve)
    [[ $decode_only -eq 0 ]] || { echo "profile.sh: --decode-only is for engine" >&2; exit 2; }
    bin="$build/bench/bench_loadgen"
    [[ -x "$bin" ]] || { echo "profile.sh: no $bin (build bench_loadgen)" >&2; exit 2; }
    [[ -n "$title" ]] || title="switchyard serve under bench_loadgen $*"
    "$bin" --spawn "$@" >"$out/loadgen.json" &
    lg=$!
    server=""
    # The server is bench_loadgen's child; wait for it to appear (up to a minute).
    for _ in $(seq 600); do
      server="$(pgrep -P "$lg" -x switchyard || true)"
      [[ -n "$server" ]] && break
      kill -0 "$lg" 2>/dev/null || break
      sleep 0.1
    done
    if [[ -z "$server" ]]; then
      echo "profile.sh: bench_loadgen started no server" >&2
      wait "$lg" || true
      exit 1
    fi
    sleep "$attach_delay"
    echo "profile.sh: recording server $server for ${seconds}s" >&2
    # perf stops after `sleep`, or earlier when the server exits.
    "${record[@]}" -p "$server" -- sleep "$seconds" || true
    rc=0
    wait "$lg" || rc=$?
    [[ $rc -eq 0 ]] || echo "profile.sh: bench_loadgen exited with status $rc" >&2
    ;;
  *) usage ;;
esac

perf script -i "$data" >"$out/perf.txt" 2>"$out/perf-script.log"
python3 "$here/flamegraph.py" "$out/perf.txt" --svg "$out/flame.svg" --folded "$out/folded.txt" \
  --top "$top" --title "$title" >"$out/top.md"
cat "$out/top.md"
echo "profile.sh: $out/flame.svg ($(du -k "$out/flame.svg" | cut -f1) KiB), $out/top.md" >&2
