#!/usr/bin/python3
"""The OpenAI-compatible HTTP door (docs/http.md) against real `switchyard serve --http`
processes on stories260K (greedy text checked against llama.cpp's) and a zoo model (chat), with
Python's http.client and raw sockets: every endpoint and request field, streaming (the SSE bytes
pinned), errors in OpenAI's shape, tenants, idempotency keys, priority, client disconnects,
keep-alive and pipelining, overload with the SDK's retry rule, draining, and hostile input.

    /usr/bin/python3 tests/python/test_http_api.py --binary build/switchyard --models ../shared/models

SY_CASE=name runs the cases whose name contains it.
"""

import json
import os
import re
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_support import (Server, args, case, check, eq, parse_responses, raw,  # noqa: E402
                          run_cases)

A = args()
MODELS = A["models"]
STORIES = os.path.join(MODELS, "stories260K.gguf")
ZOO = os.path.join(MODELS, "zoo", "zoo-qwen2-f32.gguf")
with open(os.path.join(MODELS, "reference-llamacpp.json")) as f:
    REF = json.load(f)["cases"]


def ref(prompt, n):
    for c in REF:
        if c["prompt"] == prompt and c["n_predict"] == n:
            return c
    raise KeyError(prompt)


ONCE = ref("Once upon a time", 32)
LILY = ref("Lily and Tom", 32)


def jobs_total(srv, **labels):
    """switchyard_jobs_total summed over the series matching the labels."""
    total = 0.0
    for k, v in srv.metrics().items():
        if not k.startswith("switchyard_jobs_total{"):
            continue
        if all('%s="%s"' % (n, x) in k for n, x in labels.items()):
            total += v
    return total


def setup():
    s = {}
    s["a"] = Server(A["binary"], STORIES, extra=["--chat-template", "chatml"])
    s["z"] = Server(A["binary"], ZOO, extra=["--chat-template", "chatml"])
    return s


def teardown(s):
    for srv in s.values():
        srv.kill()


def completion(srv, body, headers=None):
    st, h, j = srv.post_json("/v1/completions", body, headers)
    eq(st, 200, "status (%s)" % j)
    return j


# ---- endpoints ----------------------------------------------------------------------------------


@case
def models_health_routes(s):
    a = s["a"]
    st, _, j = a.get_json("/v1/models")
    eq(st, 200)
    eq(j["object"], "list")
    eq(j["data"][0]["id"], "stories260K")
    eq(j["data"][0]["object"], "model")
    eq(j["data"][0]["max_model_len"], 2048)
    st, _, j = a.get_json("/v1/models/stories260K")
    eq((st, j["id"]), (200, "stories260K"))
    st, _, j = a.get_json("/v1/models/gpt-4")
    eq((st, j["error"]["code"]), (404, "model_not_found"))
    st, _, j = a.get_json("/health")
    eq((st, j), (200, {"status": "ok"}))
    st, _, j = a.get_json("/v2/nothing")
    eq(st, 404)
    eq(sorted(j["error"].keys()), ["code", "message", "param", "type"])
    st, _, j = a.get_json("/v1/completions")
    eq(st, 405)


@case
def completion_greedy_matches_llamacpp(s):
    j = completion(s["a"], {"model": "stories260K", "prompt": "Once upon a time",
                            "max_tokens": 32, "temperature": 0})
    eq(j["object"], "text_completion")
    check(j["id"].startswith("cmpl-"), "id %r" % j["id"])
    eq(j["model"], "stories260K")
    eq(j["choices"][0]["text"], ONCE["generated_text"])
    eq(j["choices"][0]["finish_reason"], "length")
    eq(j["choices"][0]["index"], 0)
    eq(j["usage"]["prompt_tokens"], 5)
    eq(j["usage"]["completion_tokens"], 32)
    eq(j["usage"]["total_tokens"], 37)


@case
def completion_prompt_forms(s):
    a = s["a"]
    ids = ONCE["prompt_token_ids"]
    j = completion(a, {"prompt": ids, "max_tokens": 32, "temperature": 0})
    eq(j["choices"][0]["text"], ONCE["generated_text"], "token-id prompt")
    j = completion(a, {"prompt": ["Once upon a time", "Lily and Tom"], "max_tokens": 32,
                       "temperature": 0})
    eq([c["index"] for c in j["choices"]], [0, 1])
    eq(j["choices"][0]["text"], ONCE["generated_text"])
    eq(j["choices"][1]["text"], LILY["generated_text"])
    eq(j["usage"]["completion_tokens"], 64)
    j = completion(a, {"prompt": [ids, LILY["prompt_token_ids"]], "max_tokens": 32,
                       "temperature": 0})
    eq(j["choices"][1]["text"], LILY["generated_text"], "a list of token-id prompts")
    st, _, j = a.post_json("/v1/completions", {"prompt": [], "max_tokens": 4})
    eq((st, j["error"]["param"]), (400, "prompt"))


@case
def completion_sampling_fields(s):
    a = s["a"]
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "n": 2,
            "seed": 7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5,
            "frequency_penalty": 0.5, "repetition_penalty": 1.1, "user": "u1"}
    j1 = completion(a, body)
    j2 = completion(a, body)
    eq([c["index"] for c in j1["choices"]], [0, 1])
    eq([c["text"] for c in j1["choices"]], [c["text"] for c in j2["choices"]], "seeded")
    eq(j1["usage"]["completion_tokens"], 24)
    # max_completion_tokens wins over max_tokens.
    j = completion(a, {"prompt": "Once upon a time", "max_tokens": 10,
                       "max_completion_tokens": 3, "temperature": 0})
    eq(j["usage"]["completion_tokens"], 3)
    # stop: the text ends before it.
    j = completion(a, {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0,
                       "stop": [" girl"]})
    eq(j["choices"][0]["text"], ", there was a little")
    eq(j["choices"][0]["finish_reason"], "stop")
    j = completion(a, {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0,
                       "stop": " little"})
    eq(j["choices"][0]["text"], ", there was a")
    # logit_bias -100 on the greedy first token (432 ",") moves the choice elsewhere.
    first = ONCE["generated_token_ids"][0]
    j = completion(a, {"prompt": "Once upon a time", "max_tokens": 1, "temperature": 0,
                       "logit_bias": {str(first): -100}})
    check(not j["choices"][0]["text"].startswith(","), "logit_bias: %r" % j)
    # echo puts the prompt in front.
    j = completion(a, {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0,
                       "echo": True})
    check(j["choices"][0]["text"].startswith("Once upon a time, there"), "echo %r" % j)


@case
def completion_logprobs(s):
    j = completion(s["a"], {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0,
                            "logprobs": 2})
    lp = j["choices"][0]["logprobs"]
    eq(len(lp["tokens"]), 5)
    eq(len(lp["token_logprobs"]), 5)
    eq(len(lp["top_logprobs"]), 5)
    eq(len(lp["text_offset"]), 5)
    eq("".join(lp["tokens"]), j["choices"][0]["text"])
    for i, top in enumerate(lp["top_logprobs"]):
        eq(len(top), 2)
        # Greedy: the chosen token is the most likely one.
        check(abs(max(top.values()) - lp["token_logprobs"][i]) < 1e-4, "top %r" % top)
    eq(lp["text_offset"][0], 0)


@case
def completion_structured_outputs(s):
    a = s["a"]
    j = completion(a, {"prompt": "Is it sunny?", "max_tokens": 8,
                       "structured_outputs": {"choice": ["yes", "no"]}})
    check(j["choices"][0]["text"] in ("yes", "no"), "choice %r" % j)
    j = completion(a, {"prompt": "A number:", "max_tokens": 8,
                       "structured_outputs": {"regex": "[0-9]{3}"}})
    check(re.fullmatch("[0-9]{3}", j["choices"][0]["text"]), "regex %r" % j)
    j = completion(a, {"prompt": "Answer:", "max_tokens": 4, "guided_choice": ["red", "blue"]})
    check(j["choices"][0]["text"] in ("red", "blue"), "guided_choice %r" % j)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    j = completion(a, {"prompt": "JSON:", "max_tokens": 48,
                       "response_format": {"type": "json_schema",
                                           "json_schema": {"name": "r", "schema": schema}}})
    out = json.loads(j["choices"][0]["text"])
    check(isinstance(out.get("ok"), bool), "json_schema %r" % out)


@case
def chat_on_zoo_model(s):
    z = s["z"]
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Say hi"}]}]
    st, _, j = z.post_json("/v1/chat/completions", {"model": "zoo-qwen2-f32", "messages": msgs,
                                                     "max_tokens": 6, "temperature": 0})
    eq(st, 200, str(j))
    eq(j["object"], "chat.completion")
    check(j["id"].startswith("chatcmpl-"), j["id"])
    eq(j["choices"][0]["message"]["role"], "assistant")
    check(isinstance(j["choices"][0]["message"]["content"], str), "content")
    check(j["usage"]["prompt_tokens"] > 5, "the template's tokens are counted")
    # The same conversation again: greedy, the same answer.
    st, _, j2 = z.post_json("/v1/chat/completions", {"messages": msgs, "max_tokens": 6,
                                                      "temperature": 0})
    eq(j2["choices"][0]["message"]["content"], j["choices"][0]["message"]["content"])
    # logprobs / top_logprobs.
    st, _, j = z.post_json("/v1/chat/completions", {"messages": msgs, "max_tokens": 4,
                                                     "temperature": 0, "logprobs": True,
                                                     "top_logprobs": 2})
    content = j["choices"][0]["logprobs"]["content"]
    eq(len(content), j["usage"]["completion_tokens"])
    for t in content:
        eq(sorted(t.keys()), ["bytes", "logprob", "token", "top_logprobs"])
        eq(len(t["top_logprobs"]), 2)
        eq(bytes(t["bytes"]).decode("utf-8", "replace"), t["token"])
    # response_format json_object: the answer parses as a JSON object.
    st, _, j = z.post_json("/v1/chat/completions", {"messages": msgs, "max_tokens": 64,
                                                     "response_format": {"type": "json_object"},
                                                     "seed": 1})
    eq(st, 200)
    if j["choices"][0]["finish_reason"] == "stop":
        check(isinstance(json.loads(j["choices"][0]["message"]["content"]), dict), "object")
    # top_logprobs without logprobs, and a part type the door does not take.
    st, _, j = z.post_json("/v1/chat/completions", {"messages": msgs, "top_logprobs": 2})
    eq(st, 400)
    st, _, j = z.post_json("/v1/chat/completions", {"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    eq((st, j["error"]["param"]), (400, "messages[0].content[0].type"))


# ---- streaming ----------------------------------------------------------------------------------


@case
def stream_completion(s):
    st, h, ev = s["a"].stream("/v1/completions", {
        "prompt": "Once upon a time", "max_tokens": 32, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    eq(st, 200)
    check(h["content-type"].startswith("text/event-stream"), h)
    eq(ev[-1], "[DONE]")
    chunks = [json.loads(e) for e in ev[:-1]]
    usage = chunks[-1]
    eq(usage["choices"], [])
    eq(usage["usage"]["completion_tokens"], 32)
    body = chunks[:-1]
    for c in body:
        eq(c["object"], "text_completion")
        eq(c["id"], body[0]["id"])
        check("usage" in c and c["usage"] is None, "usage null on content chunks")
    eq("".join(c["choices"][0]["text"] for c in body), ONCE["generated_text"])
    eq([c["choices"][0]["finish_reason"] for c in body][-1], "length")
    check(all(c["choices"][0]["finish_reason"] is None for c in body[:-1]), "one finish")


@case
def stream_chat(s):
    st, _, ev = s["z"].stream("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5, "temperature": 0,
        "stream": True, "n": 2, "seed": 3})
    eq(st, 200)
    eq(ev[-1], "[DONE]")
    chunks = [json.loads(e) for e in ev[:-1]]
    for c in chunks:
        eq(c["object"], "chat.completion.chunk")
        check("usage" not in c, "no usage without include_usage")
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        eq(mine[0]["delta"].get("role"), "assistant", "the first chunk of a choice has the role")
        check(all("role" not in m["delta"] for m in mine[1:]), "the role once")
        check(mine[-1]["finish_reason"] in ("stop", "length"), mine[-1])
        check(all(m["finish_reason"] is None for m in mine[:-1]), "finish once")


@case
def sse_bytes_pinned(s):
    a = s["a"]
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 2, "temperature": 0,
                       "stream": True})
    req = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)).encode()
    data = raw(a.port, req)
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    eq(lines[0], b"HTTP/1.1 200 OK")
    check(b"Content-Type: text/event-stream" in lines, head)
    check(b"Transfer-Encoding: chunked" in lines, head)
    check(b"Cache-Control: no-cache" in lines, head)
    # Every HTTP chunk is exactly one event; then the zero chunk.
    events = []
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            eq(rest, b"\r\n")
            break
        events.append(rest[:n])
        eq(rest[n:n + 2], b"\r\n")
        rest = rest[n + 2:]
    eq(len(events), 4)
    for e in events:
        check(e.startswith(b"data: ") and e.endswith(b"\n\n") and e.count(b"\n") == 2, e)
    eq(events[-1], b"data: [DONE]\n\n")
    first = json.loads(events[0][6:])
    pinned = ('data: {"id":"%s","object":"text_completion","created":%d,"model":"stories260K",'
              '"choices":[{"index":0,"text":",","logprobs":null,"finish_reason":null}]}\n\n'
              % (first["id"], first["created"]))
    eq(events[0].decode(), pinned)
    last = ('data: {"id":"%s","object":"text_completion","created":%d,"model":"stories260K",'
            '"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}\n\n'
            % (first["id"], first["created"]))
    eq(events[2].decode(), last)


# ---- errors -------------------------------------------------------------------------------------


@case
def errors_in_openai_shape(s):
    a = s["a"]
    st, _, d = a.request("POST", "/v1/completions", "{\"prompt\": ",
                         {"Content-Type": "application/json"})
    eq(st, 400)
    e = json.loads(d)["error"]
    eq(sorted(e.keys()), ["code", "message", "param", "type"])
    eq(e["type"], "invalid_request_error")
    for body, param in [({"prompt": "x", "temperature": "hot"}, "temperature"),
                        ({"prompt": "x", "n": 17}, "n"),
                        ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
                        ({"prompt": "x", "stream": "yes"}, "stream"),
                        ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
                        ({"prompt": 5}, "prompt")]:
        st, _, j = a.post_json("/v1/completions", body)
        eq(st, 400, "%s" % body)
        eq(j["error"]["param"], param, "%s -> %s" % (body, j))
    st, _, j = a.post_json("/v1/completions", {"model": "gpt-4", "prompt": "x"})
    eq((st, j["error"]["code"], j["error"]["param"]), (404, "model_not_found", "model"))
    # An unknown field is ignored (and logged once).
    for _ in range(2):
        j = completion(a, {"prompt": "x", "max_tokens": 1, "frobnicate": True})
    time.sleep(0.2)
    eq(a.tail(10 ** 6).count("'frobnicate'"), 1, "logged once")
    # An admission refusal: an unknown priority class.
    st, _, j = a.post_json("/v1/completions", {"prompt": "x", "priority": "vip"})
    eq(st, 400, str(j))


@case
def idempotency_key_runs_once(s):
    a = s["a"]
    before = jobs_total(a)
    out = [None, None]

    def go(i):
        out[i] = completion(a, {"prompt": "Once upon a time", "max_tokens": 24,
                                "temperature": 1.0},
                            {"Idempotency-Key": "retry-me-1"})

    ts = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    eq(out[0]["choices"][0]["text"], out[1]["choices"][0]["text"], "one job, one answer")
    # A retry after it finished gets the stored answer.
    again = completion(a, {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 1.0},
                       {"X-Request-Id": "retry-me-1"})
    eq(again["choices"][0]["text"], out[0]["choices"][0]["text"])
    time.sleep(0.3)
    eq(jobs_total(a) - before, 1.0, "one job ran")


@case
def priority_header_and_field(s):
    a = s["a"]
    before = jobs_total(a, **{"class": "batch"})
    completion(a, {"prompt": "x", "max_tokens": 1}, {"X-Switchyard-Priority": "batch"})
    completion(a, {"prompt": "x", "max_tokens": 1, "priority": 1})  # rank order: batch
    completion(a, {"prompt": "x", "max_tokens": 1, "priority": "interactive"},
               {"X-Switchyard-Priority": "batch"})  # the field wins
    time.sleep(0.3)
    eq(jobs_total(a, **{"class": "batch"}) - before, 2.0)


@case
def keep_alive_and_pipelining(s):
    a = s["a"]
    bodies = [json.dumps({"prompt": "Once upon a time", "max_tokens": n, "temperature": 0})
              for n in (3, 5)]
    req = b"".join(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(b), b)).encode() for b in bodies)
    req += b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    got = parse_responses(raw(a.port, req))
    eq([g[0] for g in got], [200, 200, 200])
    eq(json.loads(got[0][2])["usage"]["completion_tokens"], 3, "in order")
    eq(json.loads(got[1][2])["usage"]["completion_tokens"], 5, "in order")
    eq(got[0][1]["connection"], "keep-alive")
    # http.client on one connection: three requests, one socket.
    c = a.conn()
    for _ in range(3):
        c.request("POST", "/v1/completions", body=bodies[0])
        r = c.getresponse()
        eq(r.status, 200)
        r.read()
    c.close()


@case
def client_disconnect_cancels(s):
    a = s["a"]
    gone = a.metric("switchyard_http_client_gone_total")
    cancelled = jobs_total(a, outcome="cancelled")
    for stream in (False, True):
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1900, "stream": stream,
                           "ignore_eos": True})
        sock = socket.create_connection(("127.0.0.1", a.port))
        sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                      % (len(body), body)).encode())
        if stream:
            sock.recv(100)  # the stream began
        else:
            time.sleep(0.3)
        sock.close()
    deadline = time.time() + 30
    while time.time() < deadline and jobs_total(a, outcome="cancelled") - cancelled < 2:
        time.sleep(0.1)
    eq(jobs_total(a, outcome="cancelled") - cancelled, 2.0, "both jobs cancelled")
    eq(a.metric("switchyard_http_client_gone_total") - gone, 2.0)


# ---- tenants, overload, draining (servers of their own) ------------------------------------------


@case
def tenants_by_bearer_token(s):
    cfg = ("admission:\n  tenants:\n    - {name: alice, token: ta}\n"
           "    - {name: bob, token: tb}\n    - {name: guest}\n")
    t = Server(A["binary"], STORIES, config=cfg)
    try:
        body = {"prompt": "x", "max_tokens": 1}
        st, _, j = t.post_json("/v1/completions", body)
        eq((st, j["error"]["type"]), (401, "authentication_error"))
        st, _, j = t.post_json("/v1/completions", body, {"Authorization": "Bearer nope"})
        eq(st, 401)
        st, _, j = t.post_json("/v1/completions", body, {"Authorization": "Basic eDp5"})
        eq(st, 401)
        st, _, j = t.post_json("/v1/completions", body, {"Authorization": "Bearer tb"})
        eq(st, 200)
        st, _, j = t.post_json("/v1/completions", dict(body, user="guest"))
        eq(st, 200, "a tenant without a token, named by user")
        time.sleep(0.3)
        eq(jobs_total(t, tenant="bob"), 1.0)
        eq(jobs_total(t, tenant="guest"), 1.0)
    finally:
        t.kill()


def sdk_post(srv, body, max_retries=8):
    """POST as the OpenAI SDKs do: on 429 (and 503) wait retry-after-ms, else Retry-After
    seconds, then try again, up to max_retries times. Returns (status, json, 429s seen)."""
    seen = 0
    for attempt in range(max_retries + 1):
        st, h, j = srv.post_json("/v1/completions", body, timeout=120)
        if st not in (429, 503) or attempt == max_retries:
            return st, j, seen
        seen += 1
        check("retry-after" in h and "retry-after-ms" in h, "429 names its delay: %s" % h)
        eq(int(h["retry-after"]), (int(h["retry-after-ms"]) + 999) // 1000)
        time.sleep(int(h["retry-after-ms"]) / 1000.0)
    raise AssertionError("unreachable")


@case
def overload_429_and_sdk_retry(s):
    cfg = ("router:\n  classes:\n    - {name: interactive, rank: 0, queue_limit: 2}\n"
           "    - {name: batch, rank: 1, queue_limit: 2}\n"
           "batching:\n  max_sequences: 2\n")
    o = Server(A["binary"], STORIES, config=cfg, extra=["--step-delay-ms", "5"])
    try:
        results = [None] * 16

        def go(i):
            results[i] = sdk_post(o, {"prompt": "Once upon a time", "max_tokens": 24,
                                      "temperature": 0, "ignore_eos": True})

        ts = [threading.Thread(target=go, args=(i,)) for i in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        eq([r[0] for r in results], [200] * 16, "every request got through in the end")
        check(sum(r[2] for r in results) > 0, "some were told to retry")
        for r in results:
            eq(r[1]["usage"]["completion_tokens"], 24, "nothing accepted was cut short")
        check(o.metric("switchyard_http_overload_responses_total") > 0, "counted")
    finally:
        o.kill()


@case
def draining_answers_503(s):
    d = Server(A["binary"], STORIES, extra=["--grace-ms", "4000", "--step-delay-ms", "5"])
    try:
        out = {}

        def long_job():
            out["long"] = d.post_json("/v1/completions", {"prompt": "x", "max_tokens": 300,
                                                          "ignore_eos": True})

        t = threading.Thread(target=long_job)
        t.start()
        time.sleep(0.5)
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        st, h, j = d.post_json("/v1/completions", {"prompt": "x", "max_tokens": 1})
        eq(st, 503, str(j))
        st, _, j = d.get_json("/health")
        eq(st, 503)
        t.join()
        eq(out["long"][0], 200, "the running request finished within the grace")
    finally:
        d.kill()


@case
def hostile_input(s):
    cfg = ("http:\n  max_body_bytes: 65536\n  max_header_bytes: 4096\n"
           "  header_timeout_ms: 1000\n  idle_timeout_ms: 1000\n")
    b = Server(A["binary"], STORIES, config=cfg)
    try:
        rss0 = b.rss_kb()
        # A body over the limit: 413 before it is read, then the connection closes.
        got = parse_responses(raw(b.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                          b"Content-Length: 10000000\r\n\r\n"))
        eq(got[0][0], 413)
        check("max_body_bytes" in json.loads(got[0][2])["error"]["message"], got)
        # A header flood: 431.
        flood = b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 60)
                                                     for i in range(200)) + b"\r\n"
        got = parse_responses(raw(b.port, flood))
        eq(got[0][0], 431)
        # Malformed HTTP: the connection is closed.
        eq(raw(b.port, b"BLAH\r\n\r\n"), b"")
        # Slowloris: headers trickled a byte at a time are cut at header_timeout_ms.
        sock = socket.create_connection(("127.0.0.1", b.port))
        t0 = time.time()
        closed = False
        for ch in b"POST /v1/completions HTTP/1.1\r\nHost: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx":
            try:
                sock.sendall(bytes([ch]))
                time.sleep(0.1)
            except OSError:
                closed = True
                break
            if time.time() - t0 > 8:
                break
        sock.settimeout(5)
        try:
            closed = closed or sock.recv(100) == b""
        except OSError:
            closed = True
        sock.close()
        check(closed and time.time() - t0 < 8, "slowloris cut")
        # A half-closed stream: the request arrives whole, then the client shuts its side;
        # the door takes that as the client leaving: the job is cancelled, nothing answered.
        body = json.dumps({"prompt": "x", "max_tokens": 1900, "ignore_eos": True})
        before = jobs_total(b, outcome="cancelled")
        raw(b.port, ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body)).encode(), read_timeout=20, shut_wr=True)
        time.sleep(0.5)
        eq(jobs_total(b, outcome="cancelled") - before, 1.0, "half-closed: cancelled")
        # Many of each: memory stays flat and the server answers.
        for _ in range(200):
            raw(b.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                        b"Content-Length: 19\r\n\r\n{not json at all!!}", read_timeout=2)
            raw(b.port, flood, read_timeout=2)
        rss1 = b.rss_kb()
        # No request keeps anything once answered: growth beyond allocator noise (32 MiB) would
        # mean buffers of dead connections are kept.
        check(rss1 - rss0 < 32 * 1024, "RSS grew from %d to %d KiB" % (rss0, rss1))
        j = completion(b, {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0})
        eq(j["usage"]["completion_tokens"], 3)
        check(b.alive(), "the server is up")
    finally:
        b.kill()


if __name__ == "__main__":
    run_cases(setup, teardown)
