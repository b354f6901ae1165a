#!/usr/bin/python3
"""The monitoring files (deploy/prometheus, deploy/grafana; docs/dashboards.md) against a real
Prometheus and real servers.

  test_prometheus.py rules
      promtool: both rule files and prometheus.yml check; the alert cases of
      tests/prometheus/alert_rules_test.yml pass; every dashboard query is valid PromQL.
  test_prometheus.py live --binary build/switchyard --models ../shared/models
      Two `switchyard serve` processes (one with a journal, the HTTP door and, where nats-server
      is installed, a NATS JetStream cluster link; one with a class queue of two jobs) and a
      `prometheus` scraping both every second and evaluating a copy of the rules every second
      whose windows and `for:` durations are cut to seconds. `promtool check metrics` passes on
      /metrics; after some load, every recording rule, every dashboard query and every template
      variable returns at least one series; a flood of submits makes SwitchyardOverloaded fire and
      it clears once the flood stops; a journal whose writes the file system refuses (the server's
      RLIMIT_FSIZE lowered to 0, as tests/support/full_disk.hpp does) makes
      SwitchyardJournalWriteErrors and SwitchyardJournalFailing fire, and both clear once the
      journal can write again.

Exits 77 (CTest: skipped) with a message when prometheus or promtool is not installed (Debian's
`prometheus` package; scripts/install-deps.sh installs it). Standard library, plus python3-zmq
and python3-msgpack for the Python client.
"""

import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROM_DIR = os.path.join(ROOT, "deploy", "prometheus")
RULE_FILES = [os.path.join(PROM_DIR, f) for f in ("recording_rules.yml", "alert_rules.yml")]
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "dashboards", "switchyard.json")
SKIP = 77

# What the dashboard's variables stand for in the queries sent here: every job, instance and
# class; Grafana's $__rate_interval as a window that holds several 1 s scrapes.
VARIABLES = {"$job": ".*", "$instance": ".*", "$class": ".*", "$__rate_interval": "5s"}

# The rules' windows and `for:` durations in the copy Prometheus evaluates here: minutes become
# seconds, so an alert fires and clears within the test (the conditions are the same).
TEST_WINDOW = "5s"
TEST_FOR = "1s"

# What `promtool check metrics` says of /metrics and is accepted: the KV block-count gauges are
# documented (docs/metrics.md) and read under these names, though Prometheus's naming keeps
# `_total` for counters. Any other lint problem fails the test.
KNOWN_LINT = {
    '%s non-counter metrics should not have "_total" suffix' % name
    for name in ("switchyard_kv_blocks_total", "switchyard_executor_kv_blocks_total",
                 "switchyard_kv_window_blocks_total")
}

# Bounds on waits that end as soon as their condition holds; only a broken setup reaches them.
START_S = 60
SERIES_S = 30
ALERT_S = 30


def fail(msg):
    raise AssertionError(msg)


def tool(name):
    path = shutil.which(name)
    if path is None:
        print("SKIPPED: `%s` is not installed (Debian's `prometheus` package has it; "
              "scripts/install-deps.sh installs it)" % name, flush=True)
        sys.exit(SKIP)
    return path


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    return r.returncode, r.stdout


def dashboard_targets():
    """[(panel title, refId, expr with the variables substituted)] of every panel."""
    with open(DASHBOARD) as f:
        d = json.load(f)
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            e = t["expr"]
            for k in sorted(VARIABLES, key=len, reverse=True):
                e = e.replace(k, VARIABLES[k])
            if "$" in e:
                fail("panel %r: an unknown variable in %r" % (p["title"], e))
            out.append((p["title"], t["refId"], e))
    return out


def dashboard_variable_queries():
    """[(name, metric selector, label)] of the label_values() query variables."""
    with open(DASHBOARD) as f:
        d = json.load(f)
    out = []
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q)
        if not m:
            fail("variable %s: not a label_values(selector, label) query: %r" % (v["name"], q))
        sel = m.group(1)
        for k, val in VARIABLES.items():
            sel = sel.replace(k, val)
        out.append((v["name"], sel, m.group(2)))
    return out


# ---- rules: promtool alone ----

def check_rules():
    promtool = tool("promtool")
    rc, out = run([promtool, "check", "rules"] + RULE_FILES)
    print(out, end="")
    if rc != 0:
        fail("promtool check rules failed")
    rc, out = run([promtool, "check", "config", "prometheus.yml"], cwd=PROM_DIR)
    print(out, end="")
    if rc != 0:
        fail("promtool check config failed on deploy/prometheus/prometheus.yml")
    rc, out = run([promtool, "test", "rules", "alert_rules_test.yml"], cwd=HERE)
    print(out, end="")
    if rc != 0:
        fail("promtool test rules failed (tests/prometheus/alert_rules_test.yml)")
    # Every dashboard query, as the expression of a recording rule: promtool parses it.
    targets = dashboard_targets()
    tmp = tempfile.mkdtemp(prefix="sy-prom-rules-")
    try:
        path = os.path.join(tmp, "dashboard_queries.yml")
        with open(path, "w") as f:
            f.write("groups:\n  - name: dashboard\n    rules:\n")
            for i, (_, _, e) in enumerate(targets):
                f.write("      - record: dashboard:query_%d:expr\n        expr: %s\n"
                        % (i, json.dumps(e)))
        rc, out = run([promtool, "check", "rules", path])
        if rc != 0:
            print(out)
            fail("a dashboard query is not valid PromQL")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok   %d dashboard queries parse" % len(targets))
    print("rules: passed")


# ---- live: servers, Prometheus, load, queries, alerts ----

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ignore_sigxfsz():
    # A write past RLIMIT_FSIZE then fails with EFBIG instead of killing the server (the
    # disposition survives exec), as on a full file system.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


class Proc:
    """A child whose stdout and stderr are drained by threads into memory (so a file-size limit
    on the child never touches its log)."""

    def __init__(self, name, cmd, preexec=None):
        self.name, self.cmd = name, cmd
        self.lines = []
        self.cv = threading.Condition()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  preexec_fn=preexec, errors="replace")
        for stream in (self.p.stdout, self.p.stderr):
            threading.Thread(target=self._drain, args=(stream,), daemon=True).start()

    def _drain(self, stream):
        for line in stream:
            with self.cv:
                self.lines.append(line.rstrip("\n"))
                self.cv.notify_all()

    def wait_for(self, pattern, timeout):
        """The first match of `pattern` in the output, waiting up to `timeout` s for it."""
        rx = re.compile(pattern)
        deadline = time.time() + timeout
        with self.cv:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                if self.p.poll() is not None or time.time() > deadline:
                    fail("%s: no %r in its output (exit %s): %s\n%s" % (
                        self.name, pattern, self.p.poll(), " ".join(self.cmd), self.tail()))
                self.cv.wait(0.2)

    def tail(self, n=40):
        with self.cv:
            return "\n".join(self.lines[-n:])

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


class Server(Proc):
    def __init__(self, name, binary, model, extra):
        cmd = [binary, "serve", "--model", model, "--bind", "tcp://127.0.0.1:*",
               "--metrics", "127.0.0.1:0", "--threads", "1"] + extra
        super().__init__(name, cmd, preexec=ignore_sigxfsz)
        self.endpoint = self.wait_for(r"listening on (tcp://127\.0\.0\.1:\d+)", START_S).group(1)
        self.metrics_port = int(self.wait_for(r"metrics on http://127\.0\.0\.1:(\d+)",
                                              START_S).group(1))
        self.wait_for(r"switchyard: ready", START_S)
        self.target = "127.0.0.1:%d" % self.metrics_port

    def metrics_text(self):
        c = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=30)
        c.request("GET", "/metrics")
        r = c.getresponse()
        body = r.read().decode()
        c.close()
        if r.status != 200:
            fail("%s: /metrics answered %d" % (self.name, r.status))
        return body

    def metric(self, name):
        for line in self.metrics_text().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None


class Prometheus(Proc):
    def __init__(self, binary, tmp, targets):
        rules = []
        for src in RULE_FILES:
            with open(src) as f:
                text = f.read()
            text = re.sub(r"\[\d+[mh]\]", "[%s]" % TEST_WINDOW, text)
            text = re.sub(r"(\n\s+for:\s*)\d+[smh]", r"\g<1>" + TEST_FOR, text)
            dst = os.path.join(tmp, os.path.basename(src))
            with open(dst, "w") as f:
                f.write(text)
            rules.append(dst)
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n")
            f.write("rule_files:\n" + "".join("  - %s\n" % json.dumps(r) for r in rules))
            f.write("scrape_configs:\n  - job_name: switchyard\n    static_configs:\n")
            f.write("      - targets: %s\n" % json.dumps(targets))
        self.port = free_port()
        super().__init__("prometheus", [
            binary, "--config.file=" + config, "--storage.tsdb.path=" + os.path.join(tmp, "data"),
            "--web.listen-address=127.0.0.1:%d" % self.port, "--log.level=warn"])
        deadline = time.time() + START_S
        while True:
            try:
                if self.get("/-/ready", raw=True) == 200:
                    break
            except OSError:
                pass
            if self.p.poll() is not None or time.time() > deadline:
                fail("prometheus did not get ready:\n" + self.tail())
            time.sleep(0.2)

    def get(self, path, raw=False):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        if raw:
            return r.status
        d = json.loads(body)
        if d.get("status") != "success":
            fail("prometheus %s: %s" % (path, body[:500]))
        return d["data"]

    def query(self, expr):
        return self.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["result"]

    def alerts(self, name):
        """{instance: state} of the active (pending or firing) alerts named `name`."""
        return {a["labels"].get("instance", ""): a["state"]
                for a in self.get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name}


def wait_alert(prom, name, instance, want, action=None, timeout=ALERT_S):
    """Polls until alert `name` of `instance` is in state `want` ("firing", or None: not active),
    calling `action` between polls (what keeps the condition going)."""
    deadline = time.time() + timeout
    while True:
        got = prom.alerts(name).get(instance)
        if got == want:
            return
        if time.time() > deadline:
            fail("%s on %s: still %s after %d s, expected %s" % (
                name, instance, got or "inactive", timeout, want or "inactive"))
        if action:
            action()
        time.sleep(0.3)


def drain(client):
    """Every message waiting on a client: {code or type: count}."""
    seen = {}
    while True:
        m = client.next(timeout_ms=0)
        if m is None:
            return seen
        k = m.get("code", m["type"]) if m["type"] == "error" else m["type"]
        seen[k] = seen.get(k, 0) + 1


def live(binary, models):
    promtool, prometheus = tool("promtool"), tool("prometheus")
    sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
    from switchyard_client import Client, Program

    model = os.path.join(models, "stories260K.gguf")
    tmp = tempfile.mkdtemp(prefix="sy-prom-")
    procs = []
    try:
        # The cluster link, where nats-server is there (CI installs it): the lag series.
        nats_url = None
        if shutil.which("nats-server"):
            log = os.path.join(tmp, "nats.log")
            nats = Proc("nats-server", ["nats-server", "-js", "-a", "127.0.0.1", "-p", "-1",
                                        "-sd", os.path.join(tmp, "js"), "-l", log])
            procs.append(nats)
            deadline = time.time() + START_S
            while True:
                text = open(log).read() if os.path.exists(log) else ""
                m = re.search(r"Listening for client connections on 127\.0\.0\.1:(\d+)", text)
                if m and "Server is ready" in text:
                    nats_url = "nats://127.0.0.1:" + m.group(1)
                    break
                if nats.p.poll() is not None or time.time() > deadline:
                    fail("nats-server did not start:\n" + text[-2000:])
                time.sleep(0.05)
        else:
            print("note: no nats-server: the cluster queries are not checked", flush=True)

        journal = os.path.join(tmp, "journal", "switchyard.journal")
        os.makedirs(os.path.dirname(journal))
        # The test-only NVML stand-in: the GPU panels and rules have series on this GPU-less
        # machine too.
        extra = ["--journal", journal, "--http", "127.0.0.1:0", "--speculative", "always",
                 "--test-fake-nvml"]
        if nats_url:
            extra += ["--nats", nats_url]
        main = Server("main", binary, model, extra)
        procs.append(main)
        http_port = int(main.wait_for(r"http on http://127\.0\.0\.1:(\d+)", START_S).group(1))

        # Room for two queued interactive jobs, one sequence at a time, slow steps: a flood
        # of submits is mostly refused as overloaded.
        cfg = os.path.join(tmp, "small.yaml")
        with open(cfg, "w") as f:
            f.write("router:\n  classes:\n"
                    "    - {name: interactive, rank: 0, weight: 1, queue_limit: 2}\n"
                    "batching:\n  max_sequences: 1\n")
        small = Server("small", binary, model,
                       ["--no-journal", "--config", cfg, "--step-delay-ms", "20"])
        procs.append(small)

        prom = Prometheus(prometheus, tmp, [main.target, small.target])
        procs.append(prom)
        deadline = time.time() + SERIES_S
        while len([r for r in prom.query('up{job="switchyard"} == 1')]) < 2:
            if time.time() > deadline:
                fail("prometheus does not scrape both servers:\n" + prom.tail())
            time.sleep(0.3)
        print("ok   prometheus scrapes %s and %s" % (main.target, small.target), flush=True)

        # ---- load: jobs of two classes and two tenants, a program, HTTP completions ----
        with Client(main.endpoint) as c:
            n = 0
            for tenant in ("alpha", "beta"):
                for cls in ("interactive", "batch"):
                    for i in range(8):
                        c.submit("%s-%s-%d" % (tenant, cls, i), tenant,
                                 "Once upon a time there was a little %s" % ("cat", "dog")[i % 2],
                                 max_tokens=24, temperature=0, priority=cls)
                        n += 1
            done = 0
            deadline = time.time() + START_S
            while done < n:
                m = c.next(timeout_ms=1000)
                if m is None:
                    if time.time() > deadline:
                        fail("load: %d of %d jobs done" % (done, n))
                    continue
                if m["type"] == "error":
                    fail("load: a job failed: %r" % m)
                done += m["type"] == "done"
            p = Program().text("Once upon a time").gen("a", max_tokens=8).text(" and").gen(
                "b", max_tokens=8)
            c.run_program("program-1", p, tenant="alpha", timeout_ms=30000)
        for i in range(3):
            h = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
            h.request("POST", "/v1/completions", body=json.dumps(
                {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 8}),
                headers={"Content-Type": "application/json"})
            r = h.getresponse()
            r.read()
            h.close()
            if r.status != 200:
                fail("HTTP completion answered %d" % r.status)
        print("ok   load: %d jobs, 1 program, 3 HTTP completions" % n, flush=True)

        # ---- the exposition passes promtool's checks ----
        deadline = time.time() + SERIES_S
        while main.metric("switchyard_jobs_active") != 0:
            if time.time() > deadline:
                fail("switchyard_jobs_active does not come back to 0")
            time.sleep(0.2)
        text = main.metrics_text()
        rc, out = run([promtool, "check", "metrics"], input=text)
        # Exit 1: the page does not parse. Exit 3: lint problems, each of which must be one of
        # the known ones below.
        problems = [line for line in out.splitlines() if line.strip()]
        unknown = [p for p in problems if p not in KNOWN_LINT]
        if rc not in (0, 3) or unknown or (rc == 3) != bool(problems):
            fail("promtool check metrics (exit %d):\n%s" % (rc, out))
        print("ok   promtool check metrics (%d lines; known lint: %d)" % (
            len(text.splitlines()), len(problems)), flush=True)

        # ---- every recording rule, dashboard query and variable returns a series ----
        rules = [r for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]]
        records = sorted({r["name"] for r in rules if r["type"] == "recording"})
        alerts = sorted({r["name"] for r in rules if r["type"] == "alerting"})
        if not records or not alerts:
            fail("prometheus loaded %d recording and %d alerting rules" % (len(records),
                                                                           len(alerts)))
        cluster = re.compile(r"switchyard(_|:)cluster")
        pending = {}
        for name in records:
            pending["rule " + name] = name
        for title, ref, e in dashboard_targets():
            pending["panel %r %s" % (title, ref)] = e
        skipped = []
        if not nats_url:
            skipped = [k for k, e in pending.items() if cluster.search(e)]
            for k in skipped:
                del pending[k]
        counts = {}
        deadline = time.time() + SERIES_S
        while pending:
            for k, e in list(pending.items()):
                res = prom.query(e)
                if res:
                    counts[k] = len(res)
                    del pending[k]
            if not pending:
                break
            if time.time() > deadline:
                fail("no series after %d s:\n  %s" % (SERIES_S, "\n  ".join(
                    "%s: %s" % (k, e) for k, e in sorted(pending.items()))))
            time.sleep(0.5)
        for k in sorted(counts):
            print("ok   %s: %d series" % (k, counts[k]))
        for k in skipped:
            print("skip %s (no nats-server)" % k)
        for name, sel, label in dashboard_variable_queries():
            values = prom.get("/api/v1/label/%s/values?%s" % (
                label, urllib.parse.urlencode({"match[]": sel})))
            if not values:
                fail("variable %s: label_values(%s, %s) is empty" % (name, sel, label))
            print("ok   variable %s: %s" % (name, ", ".join(values)))
        print("ok   %d recording rules and %d dashboard queries return series" % (
            len(records), len([k for k in counts if k.startswith("panel")])), flush=True)

        # ---- overload: a flood of submits to `small` fires SwitchyardOverloaded; it clears ----
        if prom.alerts("SwitchyardOverloaded"):
            fail("SwitchyardOverloaded is active before any flood: %r"
                 % prom.alerts("SwitchyardOverloaded"))
        refused = {}
        with Client(small.endpoint) as c:
            flood = {"n": 0}

            def more():
                for _ in range(10):
                    flood["n"] += 1
                    c.submit("flood-%d" % flood["n"], "flood", "Once upon a time",
                             max_tokens=32, temperature=0, priority="interactive")
                for k, v in drain(c).items():
                    refused[k] = refused.get(k, 0) + v

            wait_alert(prom, "SwitchyardOverloaded", small.target, "firing", more)
            print("ok   SwitchyardOverloaded firing on %s after %d submits (%s)" % (
                small.target, flood["n"], refused), flush=True)
            if not refused.get("overloaded"):
                fail("the flood got no `overloaded` answer: %r" % refused)
            wait_alert(prom, "SwitchyardOverloaded", small.target, None, lambda: drain(c))
        print("ok   SwitchyardOverloaded cleared once the flood stopped", flush=True)
        if prom.alerts("SwitchyardOverloaded").get(main.target):
            fail("SwitchyardOverloaded fired on %s, which was not flooded" % main.target)

        # ---- the journal: writes refused, then possible again ----
        for a in ("SwitchyardJournalWriteErrors", "SwitchyardJournalFailing"):
            if prom.alerts(a):
                fail("%s is active before the journal fails: %r" % (a, prom.alerts(a)))
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        codes = {}
        with Client(main.endpoint) as c:
            seq = {"n": 0}

            def submit_one():
                seq["n"] += 1
                c.submit("journal-%d" % seq["n"], "alpha", "Once upon a time", max_tokens=4,
                         temperature=0)
                for k, v in drain(c).items():
                    codes[k] = codes.get(k, 0) + v

            resource.prlimit(main.p.pid, resource.RLIMIT_FSIZE, (0, hard))
            try:
                wait_alert(prom, "SwitchyardJournalWriteErrors", main.target, "firing",
                           submit_one)
                wait_alert(prom, "SwitchyardJournalFailing", main.target, "firing", submit_one)
            finally:
                resource.prlimit(main.p.pid, resource.RLIMIT_FSIZE, (hard, hard))
            print("ok   SwitchyardJournalWriteErrors and SwitchyardJournalFailing firing on %s "
                  "(%s)" % (main.target, codes), flush=True)
            if not codes.get("unavailable"):
                fail("no job was refused `unavailable` while the journal failed: %r" % codes)
            # Room again: the next job is journaled, and the journal no longer fails.
            r = None
            deadline = time.time() + ALERT_S
            while r is None or not r.ok:
                if time.time() > deadline:
                    fail("no job accepted after the journal had room again: %r" % r.error)
                seq["n"] += 1
                r = c.run("journal-%d" % seq["n"], "alpha", "Once upon a time", max_tokens=4,
                          temperature=0, timeout_ms=10000)
            wait_alert(prom, "SwitchyardJournalFailing", main.target, None)
            wait_alert(prom, "SwitchyardJournalWriteErrors", main.target, None)
        if main.metric("switchyard_journal_failing") != 0:
            fail("switchyard_journal_failing is not 0 after a good write")
        print("ok   both journal alerts cleared once the journal could write", flush=True)
        print("live: passed")
    except BaseException:
        for p in procs:
            print("---- %s: %s\n%s" % (p.name, " ".join(p.cmd), p.tail()), file=sys.stderr)
        raise
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    a = sys.argv[1:]
    if not a or a[0] not in ("rules", "live"):
        sys.exit("usage: %s rules | live --binary build/switchyard --models ../shared/models"
                 % sys.argv[0])
    if a[0] == "rules":
        check_rules()
        return
    opts = dict(zip(a[1::2], a[2::2]))
    if "--binary" not in opts or "--models" not in opts:
        sys.exit("live needs --binary PATH --models DIR")
    live(opts["--binary"], opts["--models"])


if __name__ == "__main__":
    main()
