#!/usr/bin/python3
"""Traces and GPU telemetry (docs/tracing.md, docs/metrics.md) against a real `switchyard serve`
on stories260K: an OTLP/HTTP receiver made of Python's http.server takes the spans of jobs
submitted with a W3C traceparent (HTTP header and the wire's `trace` field) and checks their
ids, parent/child nesting and attributes; with the receiver stopped, jobs still complete and
the dropped-span counter rises; bad traceparents are refused naming the field; the test-only
NVML stand-in (--test-fake-nvml) fills the switchyard_gpu_* series.

    /usr/bin/python3 tests/python/test_tracing.py --binary build/switchyard --models ../shared/models

SY_CASE=name runs the cases whose name contains it.
"""

import ctypes.util
import http.server
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients",
                                "python"))
from http_support import Server, args, case, check, eq, run_cases  # noqa: E402
import switchyard_client  # noqa: E402

A = args()
STORIES = os.path.join(A["models"], "stories260K.gguf")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = "00-%s-%s-01" % (TRACE_ID, PARENT)


class Receiver:
    """An OTLP/HTTP collector: keeps every span POSTed to /v1/traces."""

    def __init__(self):
        self.spans = []
        self.bodies = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n))
                ok = (self.path == "/v1/traces"
                      and self.headers.get("Content-Type") == "application/json")
                with outer.lock:
                    outer.bodies += 1
                    for rs in body["resourceSpans"]:
                        svc = [a["value"]["stringValue"] for a in rs["resource"]["attributes"]
                               if a["key"] == "service.name"]
                        for ss in rs["scopeSpans"]:
                            for sp in ss["spans"]:
                                sp["_service"] = svc
                                outer.spans.append(sp)
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def of_trace(self, trace_id):
        with self.lock:
            return [s for s in self.spans if s["traceId"] == trace_id]

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def attrs(span):
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        if "stringValue" in v:
            out[a["key"]] = v["stringValue"]
        elif "intValue" in v:
            out[a["key"]] = int(v["intValue"])
        elif "doubleValue" in v:
            out[a["key"]] = float(v["doubleValue"])
        elif "arrayValue" in v:
            out[a["key"]] = [x["stringValue"] for x in v["arrayValue"]["values"]]
    return out


def job_spans(rx, trace_id, job_id, timeout=60):
    """The spans of job `job_id` in `trace_id`, once its job span (the last one made) arrived:
    {name: [spans]}."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        spans = rx.of_trace(trace_id)
        roots = [s for s in spans if s["name"] == "llm_request"
                 and attrs(s).get("gen_ai.request.id") == job_id]
        if roots:
            root = roots[0]
            mine = [s for s in spans if s["spanId"] == root["spanId"]
                    or s.get("parentSpanId") == root["spanId"]]
            out = {}
            for s in mine:
                out.setdefault(s["name"], []).append(s)
            return out
        time.sleep(0.05)
    raise AssertionError("no job span for %s in trace %s; got %r" %
                         (job_id, trace_id, rx.of_trace(trace_id)))


def t0(s):
    return int(s["startTimeUnixNano"])


def t1(s):
    return int(s["endTimeUnixNano"])


def check_job(by, trace_id, parent, usage, finish, journaled):
    """The nesting and attributes every traced job's spans must have. journaled: whether the
    job was journaled (None: either, as the door decides)."""
    if journaled is None:
        journaled = "journal commit" in by
    eq(len(by["llm_request"]), 1, "one job span")
    root = by["llm_request"][0]
    for name, spans in by.items():
        for s in spans:
            eq(s["traceId"], trace_id, name + " trace id")
            check(len(s["spanId"]) == 16 and s["spanId"] != "0" * 16, "a span id: %r" % s)
            check(isinstance(s["startTimeUnixNano"], str) and isinstance(s["endTimeUnixNano"],
                                                                         str),
                  "times are strings in OTLP/JSON")
            check(t0(s) <= t1(s), "%s starts before it ends" % name)
            eq(s["_service"], ["switchyard"], "service.name")
            if s is not root:
                eq(s["parentSpanId"], root["spanId"], name + " is a child of the job span")
                check(t0(root) <= t0(s) and t1(s) <= t1(root),
                      "%s [%d, %d] lies within the job span [%d, %d]" %
                      (name, t0(s), t1(s), t0(root), t1(root)))
    if parent:
        eq(root.get("parentSpanId"), parent, "the job span's parent is the caller's span")
    else:
        check("parentSpanId" not in root, "a job without a caller's span is a root")
    eq(root["kind"], 2, "the job span is SPAN_KIND_SERVER")
    names = {"admission", "queue", "prefill", "decode", "delivery"}
    if journaled:
        names.add("journal commit")
    eq(set(by) - {"llm_request"}, names, "the job's phases")
    for n in names - {"prefill"}:
        eq(len(by[n]), 1, "one %s span" % n)
    one = {n: by[n][0] for n in names - {"prefill"}}
    prefills = sorted(by["prefill"], key=t0)
    # The phases follow each other: admission, (journal), queue, prefill chunks, decode, delivery.
    order = [one["admission"]] + ([one["journal commit"]] if journaled else []) + [one["queue"]]
    order += prefills + [one["decode"], one["delivery"]]
    for a, b in zip(order, order[1:]):
        check(t1(a) <= t0(b), "%s ends (%d) before %s starts (%d)" %
              (a["name"], t1(a), b["name"], t0(b)))
    eq(t0(one["admission"]), t0(root), "the job span starts at the job's arrival")
    eq(t1(one["delivery"]), t1(root), "the job span ends with the delivery")
    ra = attrs(root)
    eq(ra["gen_ai.usage.prompt_tokens"], usage["prompt_tokens"], "prompt tokens")
    eq(ra["gen_ai.usage.input_tokens"], usage["prompt_tokens"], "input tokens")
    eq(ra["gen_ai.usage.completion_tokens"], usage["completion_tokens"], "completion tokens")
    eq(ra["gen_ai.usage.output_tokens"], usage["completion_tokens"], "output tokens")
    eq(ra["gen_ai.response.finish_reasons"], [finish], "finish reasons")
    check(0 <= ra["gen_ai.latency.time_to_first_token"] <= ra["gen_ai.latency.e2e"],
          "time to first token within end to end: %r" % ra)
    # The prompt's tokens were fed by the prefill chunks, but those the prefix cache held.
    fed = sum(attrs(p)["switchyard.prefill.tokens"] for p in prefills)
    eq(fed + ra["switchyard.usage.cached_tokens"], usage["prompt_tokens"], "prefill tokens")
    eq(attrs(one["decode"])["gen_ai.usage.completion_tokens"], usage["completion_tokens"],
       "decode span's tokens")
    return root


def setup():
    rx = Receiver()
    d = tempfile.mkdtemp(prefix="sy-trace-")
    # Export every 100 ms so that the test waits little; a failed POST is given up on after 1 s.
    cfg = ("tracing:\n  otlp_endpoint: \"http://127.0.0.1:%d\"\n  export_interval_ms: 100\n"
           "  export_timeout_ms: 1000\n" % rx.port)
    srv = Server(A["binary"], STORIES, extra=["--test-fake-nvml"], config=cfg,
                 journal=os.path.join(d, "j.journal"))
    return {"rx": rx, "srv": srv}


def teardown(s):
    s["srv"].stop()
    s["rx"].stop()


@case
def traced_http_job(s):
    srv, rx = s["srv"], s["rx"]
    wall0 = time.time_ns()
    st, _, body = srv.post_json("/v1/completions",
                                {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0},
                                headers={"traceparent": TRACEPARENT, "X-Request-Id": "th-1"})
    eq(st, 200, "status")
    wall1 = time.time_ns()
    by = job_spans(rx, TRACE_ID, "th-1")
    root = check_job(by, TRACE_ID, PARENT, body["usage"], body["choices"][0]["finish_reason"],
                     journaled=None)
    # Unix time: the span lies within the request as this process saw it (the two clocks are
    # the same host's; a millisecond of rounding either side).
    check(wall0 - 10**6 <= t0(root) and t1(root) <= wall1 + 10**6,
          "the job span [%d, %d] within the request [%d, %d]" % (t0(root), t1(root), wall0,
                                                                 wall1))
    ra = attrs(root)
    eq(ra["gen_ai.request.max_tokens"], 8, "max_tokens")
    eq(ra["gen_ai.request.temperature"], 0.0, "temperature")


@case
def traced_zmq_job_and_untraced_job(s):
    srv, rx = s["srv"], s["rx"]
    trace = "0af7651916cd43dd8448eb211c80319c"
    c = switchyard_client.Client(srv.zmq)
    # Untraced first: spans leave in order, so once the traced job's spans are in, any span of
    # this one would be too.
    r0 = c.run("tz-plain", "t", "Lily and Tom", max_tokens=4, temperature=0.0)
    check(r0.done is not None, "the untraced job is done: %r" % r0.error)
    r = c.run("tz-1", "t", "Lily and Tom went", max_tokens=6, temperature=0.0, stream=True,
              trace="00-%s-b7ad6b7169203331-01" % trace)
    check(r.done is not None, "the traced job is done: %r" % r.error)
    by = job_spans(rx, trace, "tz-1")
    usage = r.done["usage"]
    check_job(by, trace, "b7ad6b7169203331", usage, r.done["finish_reason"], journaled=True)
    with rx.lock:
        plain = [x for x in rx.spans if attrs(x).get("gen_ai.request.id") == "tz-plain"]
    eq(plain, [], "a job without a traceparent makes no span")
    c.close()


@case
def bad_traceparent_refused(s):
    srv = s["srv"]
    for bad in ["00-%s-%s-0" % (TRACE_ID, PARENT),            # flags one digit
                "00-%s-%s-01" % ("0" * 32, PARENT),           # all-zero trace id
                "00-%s-%s-01" % (TRACE_ID.upper(), PARENT),   # upper case
                "ff-%s-%s-01" % (TRACE_ID, PARENT)]:          # version ff
        st, _, body = srv.post_json("/v1/completions", {"prompt": "x", "max_tokens": 1},
                                    headers={"traceparent": bad})
        eq(st, 400, "status for %r" % bad)
        check("traceparent" in body["error"]["message"], "names the header: %r" % body)
        eq(body["error"]["param"], "traceparent", "param")
    c = switchyard_client.Client(srv.zmq)
    r = c.run("tz-bad", "t", "x", max_tokens=1, trace="00-abc-01")
    check(r.error is not None, "an error reply")
    eq(r.error["code"], "bad_request", "code")
    check("'trace'" in r.error["message"], "names the field: %r" % r.error)
    c.close()


@case
def gpu_series_from_the_stand_in(s):
    srv = s["srv"]
    m1 = srv.metrics()
    k = '{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"}'
    eq(m1["switchyard_gpu_utilization_ratio" + k], 0.5, "utilization")
    eq(m1["switchyard_gpu_memory_used_bytes" + k], float(1 << 30), "memory used")
    eq(m1["switchyard_gpu_memory_capacity_bytes" + k], float(80 << 30), "memory capacity")
    eq(m1["switchyard_gpu_power_watts" + k], 300.0, "power")
    e1 = m1["switchyard_gpu_energy_joules_total" + k]
    check(e1 >= 1000.0, "the energy counter starts at 1,000,000 mJ: %r" % e1)
    time.sleep(0.1)
    m2 = srv.metrics()
    check(m2["switchyard_gpu_energy_joules_total" + k] > e1, "the energy counter grows")
    cpu1, cpu2 = (m1["switchyard_process_cpu_seconds_total"],
                  m2["switchyard_process_cpu_seconds_total"])
    check(0 < cpu1 <= cpu2, "process CPU seconds: %r then %r" % (cpu1, cpu2))
    if not os.environ.get("SY_CASE"):  # the traced cases before this one exported spans
        check(m2["switchyard_trace_spans_exported_total"] >= 1, "spans were exported")
    # Run on the CUDA emulator (CTest emu_python_tracing_gpu): the server's backend is cuda.
    want = os.environ.get("SY_EXPECT_BACKEND")
    if want:
        check("switchyard: backend " + want in srv.tail(100000), "the server runs on " + want)


@case
def no_gpu_no_series(s):
    if ctypes.util.find_library("nvidia-ml"):
        print("skip: this machine has NVML, so a server without the stand-in reads real GPUs")
        return
    srv = Server(A["binary"], STORIES)
    try:
        m = srv.metrics()
        eq([k for k in m if k.startswith("switchyard_gpu_")], [], "no switchyard_gpu_* series")
        check("switchyard_process_cpu_seconds_total" in m, "the CPU counter is always there")
        eq([k for k in m if k.startswith("switchyard_trace_")], [], "no trace series untraced")
    finally:
        srv.stop()
    check("no GPU telemetry" in srv.tail(100000), "one log line says why")


@case
def collector_down_drops_spans(s):
    srv, rx = s["srv"], s["rx"]
    rx.stop()
    before = srv.metric("switchyard_trace_spans_dropped_total")
    for i in range(3):
        st, _, body = srv.post_json("/v1/completions",
                                    {"prompt": "Lily and Tom", "max_tokens": 4,
                                     "temperature": 0},
                                    headers={"traceparent": TRACEPARENT,
                                             "X-Request-Id": "down-%d" % i})
        eq(st, 200, "a job completes with the collector down")
        check(body["usage"]["completion_tokens"] >= 1, "it generated")
    deadline = time.time() + 60
    while srv.metric("switchyard_trace_spans_dropped_total") <= before:
        check(time.time() < deadline, "the dropped-span counter rises")
        time.sleep(0.1)


if __name__ == "__main__":
    run_cases(setup, teardown)
