#!/usr/bin/python3
"""Priority across doors: time to the first token of interactive HTTP requests on an idle server,
then beside a running Batch API batch on the same server (docs/http.md).

    /usr/bin/python3 bench/http_priority.py --binary build/switchyard --models ../shared/models \
        [--model FILE.gguf] [--lines 20000] [--line-tokens 16] [--requests 60] [--gap-ms 20]
        [--rounds 1] [--vs-config FILE.yaml] [--keep-alive] [--trace] [--client-rt]
        [-- extra serve flags]

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
the same server with `--config FILE` (for instance `executors: {cpu_priority: background}`
against the default, normal): every round runs both, in alternating order, and each arm's
pooled figures are printed.
--keep-alive sends every request of a series on one connection, as the OpenAI SDKs' connection
pools do (without it, a new connection each, as curl would).
--trace gives every interactive request a traceparent, runs an OTLP collector (a process of its
own) and passes --otlp-endpoint, then splits each request's time to its first token in three
parts by its spans (docs/tracing.md; client and server read the same clock): from the client's
send to the door's receipt (the job span's start), from there to the first token (the `decode`
span's start), and from there to the client's first chunk; p50/p90/p99 of each, idle and busy.
--client-rt runs the client's requests under SCHED_FIFO (root or CAP_SYS_NICE), so that it gets
a core the moment it wakes, as a client on a machine of its own would: on a machine of few cores
its own waits behind the server's threads are otherwise in every sample.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))


def opts():
    a = {"binary": "build/switchyard", "models": "../shared/models", "model": "", "lines": 20000,
         "requests": 60, "gap_ms": 20.0, "line_tokens": 16, "rounds": 1, "vs_config": "",
         "keep_alive": False, "client_rt": False, "trace": False, "extra": []}
    argv = sys.argv[1:]
    if "--" in argv:
        i = argv.index("--")
        a["extra"] = argv[i + 1:]
        argv = argv[:i]
    for flag in ("--keep-alive", "--client-rt", "--trace"):
        if flag in argv:
            a[flag[2:].replace("-", "_")] = True
            argv.remove(flag)
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


# The OTLP collector of --trace: a process of its own (not a thread of the client's, which it
# would hold up while it parses), that writes each POSTed body to a file of its directory.
COLLECTOR = r"""
import http.server, os, sys
d = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        b = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        n = len(os.listdir(d))
        with open(os.path.join(d, "%06d.tmp" % n), "wb") as f:
            f.write(b)
        os.rename(os.path.join(d, "%06d.tmp" % n), os.path.join(d, "%06d.json" % n))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def span_starts(spans_dir):
    """{trace id: {span name: start in s}} of every span the collector wrote."""
    by_trace = {}
    for name in sorted(os.listdir(spans_dir)):
        if name.endswith(".json"):
            with open(os.path.join(spans_dir, name)) as f:
                body = json.load(f)
            for rs in body["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        by_trace.setdefault(sp["traceId"], {})[sp["name"]] = \
                            int(sp["startTimeUnixNano"]) / 1e9
    return by_trace


def server_split(by_trace, traced):
    """Per traced request, its time to the first token in three parts, in ms: from the client's
    send to the door's receipt (the job span's start), from there to the first token (the
    `decode` span's start: docs/tracing.md), and from there to the client's first chunk. Server
    and client read the same clock."""
    out = []
    for trace_id, ms, t0 in traced:
        t = by_trace.get(trace_id, {})
        if "llm_request" in t and "decode" in t:
            receipt, first = t["llm_request"], t["decode"]
            out.append((1e3 * (receipt - t0), 1e3 * (first - receipt), ms - 1e3 * (first - t0)))
    return out


def measure(srv, traced=None):
    """hs.ttft over --requests requests, with the client under SCHED_FIFO for --client-rt."""
    if A["client_rt"]:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except PermissionError:
            sys.exit("--client-rt: SCHED_FIFO was refused (it needs root or CAP_SYS_NICE)")
    try:
        return hs.ttft(srv, A["requests"], A["gap_ms"], keep_alive=A["keep_alive"],
                       traced=traced)
    finally:
        if A["client_rt"]:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def run_once(extra):
    """One server: idle samples, then busy samples beside a batch, and the server's figures
    over the busy window."""
    state = tempfile.mkdtemp(prefix="sy-prio-")
    model = A["model"] or os.path.join(A["models"], "stories260K.gguf")
    collector, traced = None, {"idle": None, "busy": None}
    if A["trace"]:
        os.mkdir(os.path.join(state, "spans"))
        collector = subprocess.Popen([sys.executable, "-c", COLLECTOR,
                                      os.path.join(state, "spans")], stdout=subprocess.PIPE,
                                     text=True)
        port = int(collector.stdout.readline())
        extra = extra + ["--otlp-endpoint", "http://127.0.0.1:%d" % port]
        traced = {"idle": [], "busy": []}
    srv = hs.Server(A["binary"], model, journal=os.path.join(state, "j") + "/", extra=extra)
    try:
        hs.ttft(srv, 5)  # warm-up
        ia = figures(srv)
        idle = measure(srv, traced["idle"])
        iz = figures(srv)
        lines = [{"custom_id": "L%05d" % i, "method": "POST", "url": "/v1/completions",
                  "body": {"prompt": "Story %d:" % i, "max_tokens": A["line_tokens"],
                           "temperature": 0}}
                 for i in range(A["lines"])]
        st, f = hs.upload(srv, lines)
        if st != 200:
            raise RuntimeError("upload: %d %s" % (st, f))
        fid = f["id"]
        st, _, b = srv.post_json("/v1/batches", {"input_file_id": fid,
                                                 "endpoint": "/v1/completions",
                                                 "completion_window": "24h"})
        if st != 200:
            raise RuntimeError("batch: %d %s" % (st, b))
        time.sleep(1.0)
        _, _, cur0 = srv.get_json("/v1/batches/" + b["id"])
        a = figures(srv)
        busy = measure(srv, traced["busy"])
        z = figures(srv)
        _, _, cur = srv.get_json("/v1/batches/" + b["id"])
        split = {}
        if collector:
            time.sleep(2.5)  # the exporter's interval (1 s by default), and its POST
            by_trace = span_starts(os.path.join(state, "spans"))
            split = {k: server_split(by_trace, v) for k, v in traced.items()}
        return {"idle": idle, "busy": busy, "a": a, "z": z, "ia": ia, "iz": iz, "split": split,
                "status": cur["status"],
                "done": cur["request_counts"]["completed"] - cur0["request_counts"]["completed"]}
    finally:
        srv.kill()
        if collector:
            collector.kill()
            collector.wait()
        shutil.rmtree(state, ignore_errors=True)


def report(name, runs):
    idle = sorted(x for r in runs for x in r["idle"])
    busy = sorted(x for r in runs for x in r["busy"])

    def over(key, a="a", z="z"):
        """A mean in ms over the busy (or idle) windows of every round: their (time, count)
        differences."""
        t = sum(r[z][key][0] - r[a][key][0] for r in runs)
        n = sum(r[z][key][1] - r[a][key][1] for r in runs)
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
    print("[%s] server, idle window: interactive queue time mean %.2f ms, first token mean "
          "%.2f ms" % (name, over("queue", "ia", "iz"), over("ttft", "ia", "iz")))
    print("[%s] server, busy window: interactive queue time mean %.2f ms, first token mean "
          "%.2f ms" % (name, over("queue"), over("ttft")))
    print("[%s] batch steps stopped for an interactive prompt (batching.urgent_interrupt): %d "
          "for %d requests" % (name, stopped, len(busy)))
    if A["trace"]:
        for window in ("idle", "busy"):
            parts = [p for r in runs for p in r["split"][window]]
            if not parts:
                print("[%s] %s: no spans came back" % (name, window))
                continue
            print("[%s] %s, %d traced, p50/p90/p99 ms:" % (name, window, len(parts)) + "".join(
                " %s %s;" % (label, "/".join("%.2f" % pct(v, q) for q in (.5, .9, .99)))
                for label, v in (("to the door", sorted(p[0] for p in parts)),
                                 ("door to first token", sorted(p[1] for p in parts)),
                                 ("to the client", sorted(p[2] for p in parts)))))
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
