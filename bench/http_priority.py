#!/usr/bin/python3
"""Priority across doors: time to the first token of interactive HTTP requests on an idle server,
then beside a running Batch API batch on the same server (docs/http.md).

    /usr/bin/python3 bench/http_priority.py --binary build/switchyard --models ../shared/models \
        [--model FILE.gguf] [--lines 20000] [--line-tokens 16] [--requests 60] [--gap-ms 20]
        [--rounds 1] [--vs-config FILE.yaml] [--keep-alive] [-- extra serve flags]

Starts `switchyard serve --http` with a journal on stories260K (or --model); sends --requests
streamed completions one after another (4 tokens, new connection each, as a client would) and
records the time from sending to the first chunk with text (tests/python/http_support.py, ttft),
each request after a random pause in [0, --gap-ms) so that arrivals fall anywhere in the
server's steps (0: each request the moment the previous one ended, which is always just after a
step began, so each waits a whole step); uploads a batch of --lines lines (--line-tokens tokens
each) and, once it runs, sends the same requests again. One step is the mean time of the
engine's steps over that window (switchyard_engine_step_seconds_total over
switchyard_engine_steps_total): a request arriving at a random moment waits for what is left of
the step in flight, at most one step. The batch's time per output token
(switchyard_time_per_output_token_seconds{class="batch"}: every running sequence gets one token
per step, so this is the step as the batch sees it) is printed beside it, and so are the batch
steps stopped for an interactive prompt (switchyard_engine_steps_interrupted_total, not counted
in the engine's steps: docs/architecture.md). The goal: busy p99 <=
idle p99 + one step. Prints the figures; asserts nothing (speed is measured, not tested).

--rounds N runs all of it N times, a fresh server each, and pools the samples (a p99 of 60 or 400
requests is their few slowest, so a single run is noisy). --vs-config FILE adds a second arm,
the same server with `--config FILE` (for instance `executors: {cpu_priority: background}` against the default, normal): every
round runs both, in alternating order, and each arm's pooled figures are printed.
--keep-alive sends every request of a series on one connection, as the OpenAI SDKs' connection
pools do (without it, a new connection each, as curl would).
"""

import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))


def opts():
    a = {"binary": "build/switchyard", "models": "../shared/models", "model": "", "lines": 20000,
         "requests": 60, "gap_ms": 20.0, "line_tokens": 16, "rounds": 1, "vs_config": "",
         "keep_alive": False, "extra": []}
    argv = sys.argv[1:]
    if "--" in argv:
        i = argv.index("--")
        a["extra"] = argv[i + 1:]
        argv = argv[:i]
    if "--keep-alive" in argv:
        a["keep_alive"] = True
        argv.remove("--keep-alive")
    for k, v in zip(argv[::2], argv[1::2]):
        key = k.lstrip("-")
        key = key.replace("-", "_")
        if key in ("lines", "requests", "line_tokens", "rounds"):
            a[key] = int(v)
        else:
            a[key] = float(v) if key == "gap_ms" else v
    return a


A = opts()
sys.argv = [sys.argv[0], "--binary", A["binary"], "--models", A["models"]]
import http_support as hs  # noqa: E402


def figures(srv):
    """(time, count) pairs of one scrape: the engine's steps, and three histograms by class."""
    m = srv.metrics()

    def hist(name, cls):
        return (m.get('switchyard_%s_seconds_sum{class="%s"}' % (name, cls), 0.0),
                m.get('switchyard_%s_seconds_count{class="%s"}' % (name, cls), 0.0))
    return {"step": (m.get("switchyard_engine_step_seconds_total", 0.0),
                     m.get("switchyard_engine_steps_total", 0.0)),
            "stopped": m.get("switchyard_engine_steps_interrupted_total", 0.0),
            "tpot": hist("time_per_output_token", "batch"),
            "queue": hist("queue_time", "interactive"),
            "ttft": hist("time_to_first_token", "interactive")}


def pct(v, p):
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]


def run_once(extra):
    """One server: idle samples, then busy samples beside a batch, and the server's figures
    over the busy window."""
    state = tempfile.mkdtemp(prefix="sy-prio-")
    model = A["model"] or os.path.join(A["models"], "stories260K.gguf")
    srv = hs.Server(A["binary"], model, journal=os.path.join(state, "j") + "/", extra=extra)
    try:
        hs.ttft(srv, 5)  # warm-up
        idle = hs.ttft(srv, A["requests"], A["gap_ms"], keep_alive=A["keep_alive"])
        lines = [{"custom_id": "L%05d" % i, "method": "POST", "url": "/v1/completions",
                  "body": {"prompt": "Story %d:" % i, "max_tokens": A["line_tokens"],
                           "temperature": 0}}
                 for i in range(A["lines"])]
        st, f = hs.upload(srv, lines)
        if st != 200:
            raise RuntimeError("upload: %d %s" % (st, f))
        fid = f["id"]
        st, _, b = srv.post_json("/v1/batches", {"input_file_id": fid, "endpoint": "/v1/completions",
                                                 "completion_window": "24h"})
        if st != 200:
            raise RuntimeError("batch: %d %s" % (st, b))
        time.sleep(1.0)
        _, _, cur0 = srv.get_json("/v1/batches/" + b["id"])
        a = figures(srv)
        busy = hs.ttft(srv, A["requests"], A["gap_ms"], keep_alive=A["keep_alive"])
        z = figures(srv)
        _, _, cur = srv.get_json("/v1/batches/" + b["id"])
        return {"idle": idle, "busy": busy, "a": a, "z": z, "status": cur["status"],
                "done": cur["request_counts"]["completed"] - cur0["request_counts"]["completed"]}
    finally:
        srv.kill()
        shutil.rmtree(state, ignore_errors=True)


def report(name, runs):
    idle = sorted(x for r in runs for x in r["idle"])
    busy = sorted(x for r in runs for x in r["busy"])

    def over(key):
        """A mean in ms over the busy windows of every round: their (time, count) differences."""
        t = sum(r["z"][key][0] - r["a"][key][0] for r in runs)
        n = sum(r["z"][key][1] - r["a"][key][1] for r in runs)
        return 1000.0 * t / max(1.0, n)
    step, tpot = over("step"), over("tpot")
    stopped = sum(r["z"]["stopped"] - r["a"]["stopped"] for r in runs)
    print("[%s] %d round(s); batch lines done in the busy windows: %s (last: %s)"
          % (name, len(runs), ", ".join(str(r["done"]) for r in runs), runs[-1]["status"]))
    print("[%s] idle  first token ms (%d): p50 %.2f p90 %.2f p99 %.2f max %.2f"
          % (name, len(idle), pct(idle, .5), pct(idle, .9), pct(idle, .99), idle[-1]))
    print("[%s] busy  first token ms (%d): p50 %.2f p90 %.2f p99 %.2f max %.2f"
          % (name, len(busy), pct(busy, .5), pct(busy, .9), pct(busy, .99), busy[-1]))
    print("[%s] one step (mean engine step) %.2f ms; the batch's time per output token %.2f ms"
          % (name, step, tpot))
    print("[%s] server, busy window: interactive queue time mean %.2f ms, first token mean "
          "%.2f ms" % (name, over("queue"), over("ttft")))
    print("[%s] batch steps stopped for an interactive prompt (batching.urgent_interrupt): %d "
          "for %d requests" % (name, stopped, len(busy)))
    bound = pct(idle, .99) + step
    print("[%s] goal busy p99 <= idle p99 + one step = %.2f ms: %s (busy p99 %.2f)"
          % (name, bound, "met" if pct(busy, .99) <= bound else "NOT met", pct(busy, .99)))


def main():
    arms = [("default", A["extra"])]
    if A["vs_config"]:
        arms.append(("vs " + os.path.basename(A["vs_config"]),
                     A["extra"] + ["--config", A["vs_config"]]))
    runs = {name: [] for name, _ in arms}
    for i in range(A["rounds"]):
        for name, extra in (arms if i % 2 == 0 else arms[::-1]):
            runs[name].append(run_once(extra))
    for name, _ in arms:
        report(name, runs[name])


if __name__ == "__main__":
    main()
