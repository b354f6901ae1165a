#!/usr/bin/env python3
"""Speculative decoding, side by side (docs/speculation.md).

Starts one `switchyard serve` on a model (stories260K by default) and times `switchyard submit`
runs of the same jobs with "speculative": "off" and then "auto" (and "always"), alternating, in
rounds, each run a fresh client process against the same warm server. Two workloads:

  copy   continue a given passage: the model's own greedy story, then its first words again
         (prompt lookup should shine);
  free   free generation from a story opening.

Reported: batch-1 tokens/s of each mode and the ratio to `off` (median over rounds, ratios taken
pair by pair), then aggregate tokens/s at concurrency 1, 4, 16 and 32 (--window) with `auto`
against `off`; the server's draft and acceptance counters from /metrics.

With --draft-model FILE the server drafts with that model instead of prompt lookup (a draft of
the same vocabulary: `switchyard make-model --from MODEL --keep-layers N --out FILE` makes one).

With --llama-bin DIR (a llama.cpp build's bin/ with llama-lookup, llama-speculative and
llama-bench) it also runs llama.cpp's prompt lookup (or, with --draft-model, llama-speculative
with the same draft) on the same file and copy prompt (its own "decoded ... speed" line) against
llama.cpp's plain batch-1 decode (llama-bench tg), alternating.

    python3 bench/spec_decode.py [--model FILE] [--draft-model FILE] [--rounds N] [--tokens N]
        [--llama-bin DIR]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "switchyard")
MODELS = os.path.join(ROOT, "..", "shared", "models")
OPENINGS = ["Once upon a time", "Lily and Tom", "The cat", "One day, a little boy",
            "Tim had a big", "The sun was"]


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def passage(model, opening, n):
    """The model's own greedy continuation of `opening` (n tokens), with the opening."""
    out = sh([BIN, "generate", "--model", model, "--prompt", opening, "-n", str(n), "--threads",
              "1", "--ignore-eos", "--json"]).stdout
    return opening + json.loads(out)["text"]


def jobs_file(path, prompts, mode, tokens, copies):
    """The jobs of one run; ids unique to the run (a repeated key would attach to the finished
    job and get its stored result instead of running again)."""
    run = time.monotonic_ns()
    with open(path, "w") as f:
        k = 0
        for _ in range(copies):
            for p in prompts:
                f.write(json.dumps({"id": f"r{run}-{k}", "prompt": p, "max_tokens": tokens,
                                    "temperature": 0, "ignore_eos": True,
                                    "speculative": mode}) + "\n")
                k += 1
    return k


def run_submit(server, spec, window, out_dir):
    jobs = os.path.join(out_dir, "jobs.jsonl")
    jobs_file(jobs, *spec)
    out = os.path.join(out_dir, f"out-{time.monotonic_ns()}.jsonl")
    t0 = time.perf_counter()
    sh([BIN, "submit", "--input", jobs, "--output", out, "--server", server, "--window",
        str(window)])
    dt = time.perf_counter() - t0
    tokens = 0
    with open(out) as f:
        for line in f:
            r = json.loads(line)
            if "error" in r:
                raise SystemExit(f"job failed: {line}")
            tokens += r.get("completion_tokens", len(r.get("ids", [])))
    os.unlink(out)
    return tokens, dt


def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    vals = {}
    for line in text.splitlines():
        m = re.match(r"^(switchyard_spec_[a-z_]+)(?:\{\})? ([0-9.e+-]+)$", line)
        if m:
            vals[m.group(1)] = float(m.group(2))
    return vals


def compare(server, url, files, modes, window, rounds, tmp, label):
    """Alternates the modes' runs; returns {mode: (median tok/s, median ratio to off)}."""
    rates = {m: [] for m in modes}
    ratios = {m: [] for m in modes}
    before = metrics(url)
    for _ in range(rounds):
        per = {}
        for m in modes:
            tokens, dt = run_submit(server, files[m], window, tmp)
            per[m] = tokens / dt
            rates[m].append(per[m])
        for m in modes:
            ratios[m].append(per[m] / per["off"])
    after = metrics(url)
    drafted = after.get("switchyard_spec_draft_tokens_total", 0) - before.get(
        "switchyard_spec_draft_tokens_total", 0)
    accepted = after.get("switchyard_spec_accepted_tokens_total", 0) - before.get(
        "switchyard_spec_accepted_tokens_total", 0)
    cells = []
    for m in modes:
        r = statistics.median(ratios[m])
        cells.append(f"{m} {statistics.median(rates[m]):9.0f} tok/s"
                     + ("" if m == "off" else f" ({r:.2f}x, min {min(ratios[m]):.2f}x)"))
    acc = f"{accepted / drafted:.2f}" if drafted else "-"
    print(f"{label:<28} " + " | ".join(cells) + f" | drafted {drafted:.0f}, accepted {acc}",
          flush=True)


def llama_speed(cmd):
    """tokens/s of a llama.cpp example from its timing lines (the decode's eval speed)."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    text = p.stdout + p.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([0-9.]+) s(?:econds)?, speed:\s+([0-9.]+) t/s", text)
    if m:
        return float(m.group(3))
    m = re.search(r"n_predict = (\d+).*?speed: *([0-9.]+) t/s", text, re.S)
    if m:
        return float(m.group(2))
    raise SystemExit("no speed line from " + " ".join(cmd) + ":\n" + text[-2000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(MODELS, "stories260K.gguf"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128, help="max_tokens of every job")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-bin", default="")
    ap.add_argument("--draft-model", default="")
    args = ap.parse_args()
    if not os.path.exists(BIN):
        raise SystemExit("build first: " + BIN)
    model = os.path.abspath(args.model)
    passages = [passage(model, o, 160) for o in OPENINGS]
    # A passage, a blank line, and its first words again: the continuation can copy.
    copy = [p + "\n\n" + " ".join(p.split()[:6]) for p in passages]
    free = OPENINGS
    with tempfile.TemporaryDirectory() as tmp:
        srv = subprocess.Popen(
            [BIN, "serve", "--model", model, "--backend", "cpu", "--threads", str(args.threads),
             "--bind", "tcp://127.0.0.1:*", "--metrics", "127.0.0.1:0", "--no-journal",
             "--speculative", "auto"]
            + (["--draft-model", os.path.abspath(args.draft_model)] if args.draft_model else []),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        server = url = None
        try:
            for line in srv.stdout:
                m = re.search(r"listening on (tcp://\S+)", line)
                if m and not server:
                    server = m.group(1)
                m = re.search(r"metrics on (http://\S+)", line)
                if m:
                    url = m.group(1)
                if server and url:
                    break
            if not (server and url):
                raise SystemExit("the server did not start")
            drafter = ("draft model " + os.path.basename(args.draft_model)
                       if args.draft_model else "prompt lookup")
            print(f"model {os.path.basename(model)}, {drafter}, {args.threads} threads, "
                  f"{args.tokens} tokens a job, greedy, {args.rounds} rounds alternating",
                  flush=True)
            print("batch 1 (window 1):", flush=True)
            for name, prompts in (("copy", copy), ("free", free)):
                # About a second a run at stories260K's speed: process start-up stays small.
                files = {m: (prompts, m, args.tokens, 6) for m in ("off", "auto", "always")}
                compare(server, url, files, ("off", "auto", "always"), 1, args.rounds, tmp,
                        f"  {name}")
            print("aggregate, auto against off:", flush=True)
            for name, prompts in (("copy", copy), ("free", free)):
                for c in (1, 4, 16, 32):
                    copies = max(6, (8 * c + len(prompts) - 1) // len(prompts))
                    files = {m: (prompts, m, args.tokens, copies) for m in ("off", "auto")}
                    compare(server, url, files, ("off", "auto"), c, args.rounds, tmp,
                            f"  {name} concurrency {c}")
        finally:
            srv.terminate()
            srv.wait(timeout=30)
        if args.llama_bin:
            # llama.cpp's prompt lookup on the same file and copy prompt, against its plain
            # batch-1 decode (llama-bench tg) on the same file, alternating.
            lookup = os.path.join(args.llama_bin, "llama-lookup")
            bench = os.path.join(args.llama_bin, "llama-bench")
            sp, sl = [], []
            for _ in range(args.rounds):
                out = sh([bench, "-m", model, "-t", str(args.threads), "-p", "0", "-n",
                          str(args.tokens), "-r", "3", "-o", "json"]).stdout
                sp.append(json.loads(out)[0]["avg_ts"])
                if args.draft_model:
                    cmd = [os.path.join(args.llama_bin, "llama-speculative"), "-m", model, "-md",
                           os.path.abspath(args.draft_model), "-t", str(args.threads), "-n",
                           str(args.tokens), "--draft-max", "6", "--temp", "0", "-p", copy[0]]
                else:
                    cmd = [lookup, "-m", model, "-t", str(args.threads), "-n", str(args.tokens),
                           "--draft", "6", "--temp", "0", "-p", copy[0]]
                sl.append(llama_speed(cmd))
            name = "llama-speculative" if args.draft_model else "llama-lookup"
            print(f"llama.cpp, batch 1: plain decode (llama-bench tg{args.tokens}) "
                  f"{statistics.median(sp):.0f} tok/s, {name} on the copy prompt "
                  f"{statistics.median(sl):.0f} tok/s "
                  f"({statistics.median(sl) / statistics.median(sp):.2f}x)", flush=True)

if __name__ == "__main__":
    sys.exit(main())
