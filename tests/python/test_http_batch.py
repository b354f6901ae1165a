#!/usr/bin/python3
"""The Batch API of the HTTP door (docs/http.md, Batch API) against a real server with a journal
on stories260K: files, batches, output and error files, broken lines, duplicate custom_ids,
cancel, the bounds; then 2,000 lines through three kill -9s (the batch completes, every line
once in the output, every line's job accepted once in the journal) with interactive requests
served beside it.

    /usr/bin/python3 tests/python/test_http_batch.py --binary build/switchyard --models ../shared/models
"""

import json
import os
import re
import struct
import sys
import threading
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import msgpack  # noqa: E402
from http_support import Server, args, case, check, eq, run_cases, ttft, upload  # noqa: E402

A = args()
STORIES = os.path.join(A["models"], "stories260K.gguf")


def line(cid, prompt="Once upon a time", n=8, url="/v1/completions"):
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
    if url == "/v1/chat/completions":
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n,
                "temperature": 0}
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def create(srv, file_id, endpoint="/v1/completions", window="24h", metadata=None):
    body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": window}
    if metadata is not None:
        body["metadata"] = metadata
    return srv.post_json("/v1/batches", body)[::2]


def wait(srv, batch_id, final=("completed", "failed", "expired", "cancelled"), timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, _, b = srv.get_json("/v1/batches/" + batch_id)
        eq(st, 200)
        if b["status"] in final:
            return b
        time.sleep(0.05)
    raise AssertionError("batch %s not final: %s" % (batch_id, b))


def content(srv, file_id):
    st, h, d = srv.request("GET", "/v1/files/%s/content" % file_id)
    eq(st, 200)
    return [json.loads(x) for x in d.decode().splitlines() if x]


def journal_accepts(path, uids=None):
    """Adds {job id: {uid of each accept record}} of a journal file (docs/durability.md, File
    format) to `uids`. A restart compacts the journal (finished jobs keep their result, not their
    accept; a pending job's accept is written again under its uid), so a job that ran twice
    shows as two uids of one id only across the files each server left behind."""
    counts = {} if uids is None else uids
    with open(path, "rb") as f:
        data = f.read()
    eq(data[:8], b"SYJRNL\x00\x01", "journal header")
    at = 8
    while at + 8 <= len(data):
        n, crc = struct.unpack_from("<II", data, at)
        if n == 0:
            break  # the preallocated tail
        payload = data[at + 8:at + 8 + n]
        if len(payload) < n or zlib.crc32(payload) != crc:
            break  # a record kill -9 cut short: the server's reader stops there too
        rec = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        at += 8 + n
        if rec.get("t") == "A":
            counts.setdefault(rec["id"], set()).add(rec["uid"])
    return counts


def setup():
    d = os.path.join(os.environ.get("TMPDIR", "/tmp"), "sy-batch-%d" % os.getpid())
    os.makedirs(d, exist_ok=True)
    s = {"journal": os.path.join(d, "j") + "/"}
    s["srv"] = Server(A["binary"], STORIES, journal=s["journal"],
                      extra=["--chat-template", "chatml"])
    return s


def teardown(s):
    s["srv"].kill()


@case
def files_round_trip(s):
    srv = s["srv"]
    lines = [line("a"), line("b")]
    st, f = upload(srv, lines)
    eq(st, 200, str(f))
    eq((f["object"], f["purpose"], f["filename"], f["status"]),
       ("file", "batch", "in.jsonl", "processed"))
    check(f["id"].startswith("file-"), f)
    st, _, g = srv.get_json("/v1/files/" + f["id"])
    eq(g, f)
    eq(content(srv, f["id"]), lines)
    st, _, l = srv.get_json("/v1/files")
    check(f["id"] in [x["id"] for x in l["data"]], "listed")
    st, _, d = srv.request("DELETE", "/v1/files/" + f["id"])
    eq((st, json.loads(d)["deleted"]), (200, True))
    st, _, g = srv.get_json("/v1/files/" + f["id"])
    eq(st, 404)
    st, f = upload(srv, lines, purpose="fine-tune")
    eq((st, f["error"]["param"]), (400, "purpose"))


@case
def batch_runs_with_broken_lines(s):
    srv = s["srv"]
    text = "".join(json.dumps(x) + "\n" for x in [line("c0"), line("c1", "Lily and Tom")])
    text += "{this is not json\n"
    text += json.dumps(line("c3", url="/v1/chat/completions")) + "\n"  # wrong url
    text += json.dumps(line("c4", n=100000)) + "\n"  # runs, and fails: max_tokens too large
    text += json.dumps(line("c5")) + "\n"
    st, f = upload(srv, None, raw_text=text)
    eq(st, 200)
    st, b = create(srv, f["id"], metadata={"job": "nightly"})
    eq(st, 200, str(b))
    eq((b["object"], b["endpoint"], b["input_file_id"], b["metadata"]),
       ("batch", "/v1/completions", f["id"], {"job": "nightly"}))
    check(b["status"] in ("validating", "in_progress"), b)
    b = wait(srv, b["id"])
    eq(b["status"], "completed")
    eq(b["request_counts"], {"total": 6, "completed": 3, "failed": 3})
    out = content(srv, b["output_file_id"])
    eq(sorted(x["custom_id"] for x in out), ["c0", "c1", "c5"])
    for x in out:
        eq(x["response"]["status_code"], 200)
        eq(x["error"], None)
        eq(x["response"]["body"]["object"], "text_completion")
        check(x["id"].startswith("batch_req_"), x)
        eq(x["response"]["request_id"], x["response"]["body"]["id"])
    texts = {x["custom_id"]: x["response"]["body"]["choices"][0]["text"] for x in out}
    eq(texts["c0"], ", there was a little girl")
    err = content(srv, b["error_file_id"])
    eq(len(err), 3)
    by = {x["custom_id"]: x for x in err}
    check(None in by and by[None]["response"] is None, "the unreadable line: %s" % err)
    eq(by["c3"]["response"], None)
    eq(by["c4"]["response"]["status_code"], 400)
    check(by["c4"]["error"]["message"], by["c4"])
    for x in err:
        eq(sorted(x.keys()), ["custom_id", "error", "id", "response"])


def threads_of(srv):
    """(name, policy, CPU ns, tid) of each thread of the server (proc(5): stat field 41,
    schedstat)."""
    out = []
    task = "/proc/%d/task" % srv.proc.pid
    for t in os.listdir(task):
        try:
            with open("%s/%s/stat" % (task, t)) as f:
                st = f.read()
            with open("%s/%s/comm" % (task, t)) as f:
                name = f.read().strip()
            with open("%s/%s/schedstat" % (task, t)) as f:
                ns = int(f.read().split()[0])
        except OSError:
            continue  # a thread that ended meanwhile
        out.append((name, int(st[st.rindex(")") + 2:].split()[38]), ns, t))
    return out


SCHED_OTHER, SCHED_IDLE = 0, 5


def check_thread_classes(srv, want_idle, workers):
    """The executor threads (sy.exec.N, its engine's workers sy.exec.N.wK) and the Batch API's
    thread run under SCHED_IDLE exactly when want_idle; every other thread is normal. A thread
    names itself once it runs, so a server just started gets a few seconds to show them all."""
    deadline = time.time() + 10
    while True:
        ts = threads_of(srv)
        names = [t[0] for t in ts]
        execs = [n for n in names if re.fullmatch(r"sy\.exec\.\d+(\.w\d+)?", n)]
        if ("sy.http.batch" in names and len(execs) == 1 + workers) or time.time() > deadline:
            break
        time.sleep(0.05)
    eq(len([n for n in execs if ".w" not in n]), 1, "one executor thread: %s" % names)
    eq(len([n for n in execs if ".w" in n]), workers, "its engine's workers: %s" % names)
    check("sy.http.batch" in names, "the Batch API's thread: %s" % names)
    for name, policy, _, _ in ts:
        yields = name == "sy.http.batch" or name.startswith("sy.exec.")
        eq(policy, SCHED_IDLE if yields and want_idle else SCHED_OTHER, "policy of " + name)
    return ts


@case
def executor_threads_yield_their_cores(s):
    # The default (executors.cpu_priority normal): every thread at the kernel's default policy,
    # the executor's named.
    check_thread_classes(s["srv"], False, 0)
    # background, two engine threads: the executor, its engine's worker and the Batch API's
    # thread under SCHED_IDLE, every other thread normal. Over a batch of 300 lines (about 5,000
    # tokens) the executor's thread gains the most CPU time of all (the worker takes a share
    # only where a core is free for it; the main thread's start-up, which varies with the page
    # cache, is before): the class is on the thread that computes, not on another that only
    # carries its name.
    d = os.path.join(os.path.dirname(s["journal"].rstrip("/")), "threads")
    os.makedirs(d, exist_ok=True)
    srv = Server(A["binary"], STORIES, journal=d + "/", extra=["--threads", "2"],
                 config="executors:\n  cpu_priority: background\n")
    try:
        lines = [line("t%d" % i, "Story %d:" % i, 16) for i in range(300)]
        fid = upload(srv, lines)[1]["id"]
        before = dict((tid, ns) for _, _, ns, tid in threads_of(srv))
        b = wait(srv, create(srv, fid)[1]["id"])
        eq(b["status"], "completed")
        gained = sorted(((ns - before.get(tid, 0), n) for n, _, ns, tid in
                         check_thread_classes(srv, True, 1)), reverse=True)
        eq(gained[0][1], "sy.exec.1", "CPU ns gained over the batch: %s" % gained)
    finally:
        srv.kill()


@case
def chat_batch(s):
    srv = s["srv"]
    st, f = upload(srv, [line("q%d" % i, url="/v1/chat/completions") for i in range(3)])
    st, b = create(srv, f["id"], endpoint="/v1/chat/completions")
    eq(st, 200, str(b))
    b = wait(srv, b["id"])
    eq((b["status"], b["request_counts"]["completed"]), ("completed", 3))
    for x in content(srv, b["output_file_id"]):
        eq(x["response"]["body"]["object"], "chat.completion")


@case
def validation_refusals(s):
    srv = s["srv"]
    st, f = upload(srv, [line("same"), line("other"), line("same")])
    st, b = create(srv, f["id"])
    eq(st, 200, str(b))
    b = wait(srv, b["id"])
    eq(b["status"], "failed")
    eq(b["errors"]["data"][0]["code"], "duplicate_custom_id")
    eq(b["errors"]["data"][0]["line"], 3)
    st, b = create(srv, "file-nothere")
    eq(st, 404)
    st, b = create(srv, f["id"], endpoint="/v1/embeddings")
    eq((st, b["error"]["param"]), (400, "endpoint"))
    st, b = create(srv, f["id"], window="1w")
    eq((st, b["error"]["param"]), (400, "completion_window"))
    st, _, b = srv.get_json("/v1/batches/batch_nothere")
    eq(st, 404)


@case
def cancel_and_list(s):
    srv = s["srv"]
    st, f = upload(srv, [line("k%d" % i, n=200) for i in range(400)])
    st, b = create(srv, f["id"])
    eq(st, 200)
    st, _, c = srv.post_json("/v1/batches/%s/cancel" % b["id"], {})
    eq(st, 200, str(c))
    check(c["status"] in ("cancelling", "cancelled"), c)
    c = wait(srv, b["id"])
    eq(c["status"], "cancelled")
    check(c["request_counts"]["completed"] < 400, c)
    st, _, c2 = srv.post_json("/v1/batches/%s/cancel" % b["id"], {})
    eq((st, c2["status"]), (200, "cancelled"))
    st, _, l = srv.get_json("/v1/batches?limit=2")
    eq((st, l["object"], len(l["data"])), (200, "list", 2))
    eq(l["data"][0]["id"], b["id"], "newest first")
    check(l["has_more"], l)
    st, _, l2 = srv.get_json("/v1/batches?limit=2&after=" + l["last_id"])
    check(l2["data"] and l2["data"][0]["id"] != l["data"][1]["id"], "paged")


@case
def graceful_stop_resumes_running_lines(s):
    journal = os.path.join(os.path.dirname(s["journal"].rstrip("/")), "g") + "/"
    slow = ["--chat-template", "chatml", "--step-delay-ms", "10", "--grace-ms", "300"]
    srv = Server(A["binary"], STORIES, journal=journal, extra=slow)
    n = 60
    # 400 steps of 10 ms: a line outlasts the grace (0.3 s) and the second the stop then waits.
    st, f = upload(srv, [dict(line("g%d" % i, "Tale %d" % i),
                              body={"prompt": "Tale %d" % i, "max_tokens": 400,
                                    "ignore_eos": True}) for i in range(n)])
    st, b = create(srv, f["id"])
    eq(st, 200, str(b))
    time.sleep(1.0)
    srv.stop()  # SIGTERM: the lines still running when the grace ends are left, not cancelled
    uids = journal_accepts(os.path.join(journal, "switchyard.journal"))
    srv = Server(A["binary"], STORIES, journal=journal, extra=["--chat-template", "chatml"])
    try:
        m = re.search(r"(\d+) jobs to run again", srv.tail())
        check(m and int(m.group(1)) > 0, "lines were left running: %s" % srv.tail())
        done = wait(srv, b["id"])
        eq(done["status"], "completed")
        eq(done["request_counts"], {"total": n, "completed": n, "failed": 0})
        out = content(srv, done["output_file_id"])
        eq(sorted(x["custom_id"] for x in out), sorted("g%d" % i for i in range(n)))
        for x in out:
            body = x["response"]["body"]
            eq((body["choices"][0]["finish_reason"], body["usage"]["completion_tokens"]),
               ("length", 400), x["custom_id"])
        journal_accepts(os.path.join(journal, "switchyard.journal"), uids)
        mine = {k: v for k, v in uids.items() if k.startswith(b["id"] + "/")}
        eq(sorted(k for k, v in mine.items() if len(v) > 1), [], "accepted twice")
    finally:
        srv.kill()


@case
def two_thousand_lines_through_three_kill9s(s):
    srv = s["srv"]
    idle = ttft(srv, 40)
    n = 2000
    lines = [line("L%04d" % i, "Story %d:" % i, n=16) for i in range(n)]
    st, f = upload(srv, lines)
    eq(st, 200)
    st, b = create(srv, f["id"])
    eq(st, 200, str(b))
    bid = b["id"]
    t_create = time.time()
    step_ms = None
    busy = []
    journal = os.path.join(s["journal"], "switchyard.journal")
    uids = {}
    for kill_at in (400, 1000, 1600):
        while True:
            st, _, cur = srv.get_json("/v1/batches/" + bid)
            if cur["request_counts"]["completed"] >= kill_at or cur["status"] == "completed":
                break
            if kill_at == 400 and not busy:
                busy = ttft(srv, 40)  # interactive requests while the batch runs
                st, _, cur = srv.get_json("/v1/batches/" + bid)
                eq(cur["status"], "in_progress", "the batch still runs beside them")
            time.sleep(0.02)
        check(cur["status"] == "in_progress", "killed mid-run (%s)" % cur["request_counts"])
        if step_ms is None:
            # A step's length while the batch runs: its lines in flight over its token rate.
            rate = cur["request_counts"]["completed"] * 16 / (time.time() - t_create)
            in_flight = 48  # http.batch_max_in_flight's default here: 3/4 of 64 sequences
            step_ms = 1000.0 * in_flight / rate
        srv.kill()
        journal_accepts(journal, uids)  # what the killed server accepted
        srv = Server(A["binary"], STORIES, journal=s["journal"],
                     extra=["--chat-template", "chatml"])
        s["srv"] = srv
    b = wait(srv, bid, timeout=300)
    eq(b["status"], "completed")
    eq(b["request_counts"], {"total": n, "completed": n, "failed": 0})
    out = content(srv, b["output_file_id"])
    eq(len(out), n, "one output line per input line")
    eq(len({x["custom_id"] for x in out}), n, "distinct custom_ids")
    eq(b["error_file_id"], None)
    for x in out:
        eq(x["response"]["body"]["usage"]["completion_tokens"], 16)
    journal_accepts(journal, uids)
    mine = {k: v for k, v in uids.items() if k.startswith(bid + "/")}
    eq(len(mine), n, "every line's job was accepted")
    twice = sorted(k for k, v in mine.items() if len(v) > 1)
    eq(twice, [], "lines whose job was accepted twice")

    def pct(v, p):
        return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]
    print("  TTFT idle: p50 %.1f ms, p99 %.1f ms; beside the batch: p50 %.1f ms, p99 %.1f ms "
          "(%d requests); a batch step about %.1f ms"
          % (pct(idle, .5), pct(idle, .99), pct(busy, .5), pct(busy, .99), len(busy), step_ms))


if __name__ == "__main__":
    run_cases(setup, teardown)
