"""What the HTTP door's tests share: a real `switchyard serve --http` process, requests over
Python's http.client (a real HTTP/1.1 client), Server-Sent Events read off a real stream, raw
sockets for the byte-level cases, and a small case runner (one line per case, "N passed").
Standard library only.
"""

import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def run_cases(setup=None, teardown=None):
    """Runs every registered case in order; exits 1 on the first failure."""
    only = os.environ.get("SY_CASE", "")
    state = setup() if setup else None
    passed = 0
    try:
        for fn in CASES:
            if only and only not in fn.__name__:
                continue
            t0 = time.time()
            try:
                fn(state) if setup else fn()
            except Exception:
                print("FAIL %s" % fn.__name__, flush=True)
                raise
            print("ok   %s (%.1f s)" % (fn.__name__, time.time() - t0), flush=True)
            passed += 1
    finally:
        if teardown:
            teardown(state)
    print("%d passed" % passed)


def eq(got, want, what=""):
    if got != want:
        raise AssertionError("%sgot  %r\nwant %r" % (what + ": " if what else "", got, want))


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def args():
    """--binary PATH --models DIR from the command line (CTest passes them)."""
    a = sys.argv[1:]
    out = {}
    for i in range(0, len(a) - 1, 2):
        out[a[i].lstrip("-")] = a[i + 1]
    if "binary" not in out or "models" not in out:
        sys.exit("usage: %s --binary build/switchyard --models ../shared/models" % sys.argv[0])
    return out


class Server:
    """A `switchyard serve` child with the HTTP door on a free loopback port. `extra` are more
    flags; `config` a YAML text written to a file and passed with --config."""

    def __init__(self, binary, model, extra=(), config=None, journal=None, env=None):
        self.dir = tempfile.mkdtemp(prefix="sy-http-")
        self.log_path = os.path.join(self.dir, "server.log")
        cmd = [binary, "serve", "--model", model, "--bind", "tcp://127.0.0.1:*",
               "--http", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--threads", "1"]
        if journal:
            cmd += ["--journal", journal]
        else:
            cmd += ["--no-journal"]
        if config:
            path = os.path.join(self.dir, "config.yaml")
            with open(path, "w") as f:
                f.write(config)
            cmd += ["--config", path]
        cmd += list(extra)
        self.cmd = cmd
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env)
        self.port = None
        self.metrics_port = None
        self.zmq = None  # the request endpoint (ZeroMQ ROUTER)
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"http on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.metrics_port = int(m.group(1))
            m = re.search(r"listening on (tcp://\S+)", line)
            if m:
                self.zmq = m.group(1)
            if "switchyard: ready" in line:
                break
        if self.port is None:
            self.kill()
            raise RuntimeError("the server did not start: %s\n%s" % (" ".join(cmd), self.tail()))

    def tail(self, n=3000):
        try:
            with open(self.log_path) as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers dict lower-cased, body bytes) over a fresh connection."""
        c = self.conn(timeout)
        h = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        return r.status, hdrs, data

    def post_json(self, path, body, headers=None, timeout=60):
        """(status, headers, parsed JSON)."""
        s, h, d = self.request("POST", path, body, headers, timeout)
        return s, h, json.loads(d)

    def get_json(self, path, headers=None):
        s, h, d = self.request("GET", path, None, headers)
        return s, h, json.loads(d)

    def stream(self, path, body, headers=None, timeout=60):
        """(status, headers, [event data strings]) of a streamed POST, read event by event."""
        c = self.conn(timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request("POST", path, body=json.dumps(body), headers=h)
        r = c.getresponse()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        if r.status != 200:
            data = r.read()
            c.close()
            return r.status, hdrs, [data.decode()]
        events, buf = [], b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                check(ev.startswith(b"data: "), "an SSE event starts with 'data: ': %r" % ev)
                events.append(ev[6:].decode())
        c.close()
        check(buf == b"", "no bytes after the last event: %r" % buf)
        return r.status, hdrs, events

    def metrics(self):
        """Every series of /metrics as {'name{labels}': value}."""
        c = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=30)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                out[k] = float(v)
        return out

    def metric(self, name):
        """A series' value (0 when absent)."""
        return self.metrics().get(name, 0.0)

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def raw(port, data, read_timeout=10.0, shut_wr=False):
    """Sends bytes on a new socket and returns every byte read until the server closes or
    read_timeout passes without data."""
    s = socket.create_connection(("127.0.0.1", port), timeout=read_timeout)
    s.sendall(data)
    if shut_wr:
        s.shutdown(socket.SHUT_WR)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except socket.timeout:
        pass
    s.close()
    return out


def parse_responses(data):
    """Splits raw HTTP/1.1 response bytes into [(status, headers, body bytes)], decoding
    Content-Length and chunked bodies."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdrs = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if status == 100:
            data = rest
            continue
        if "content-length" in hdrs:
            n = int(hdrs["content-length"])
            body, data = rest[:n], rest[n:]
        elif hdrs.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                n = int(size_line, 16)
                body += rest[:n]
                rest = rest[n + 2:]
                if n == 0:
                    break
            data = rest
        else:
            body, data = rest, b""
        out.append((status, hdrs, body))
    return out


def upload(srv, lines, purpose="batch", raw_text=None):
    """POST /v1/files as multipart/form-data; returns (status, json)."""
    text = raw_text if raw_text is not None else "".join(json.dumps(x) + "\n" for x in lines)
    boundary = uuid.uuid4().hex
    body = ("--%s\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n%s\r\n"
            "--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            "Content-Type: application/jsonl\r\n\r\n%s\r\n--%s--\r\n"
            % (boundary, purpose, boundary, text, boundary)).encode()
    st, _, d = srv.request("POST", "/v1/files", body,
                           {"Content-Type": "multipart/form-data; boundary=" + boundary})
    return st, json.loads(d)


def ttft(srv, n, gap_ms=0.0, seed=1, keep_alive=False, traced=None):
    """Time to the first streamed token of n interactive requests, in ms. With gap_ms, each
    request waits a random pause in [0, gap_ms) first, so that arrivals are not in step with the
    server's engine steps (a request sent the moment the previous one ended always arrives just
    after a step began). Each request on a new connection, or with keep_alive all on one (as
    the OpenAI SDKs' connection pools send them). With a list as traced, each request carries a
    traceparent of a new trace, and (trace id, ms, the time it was sent as time.time()) is appended
    to it in the order sent."""
    rng = random.Random(seed)
    out = []
    c = srv.conn() if keep_alive else None
    for _ in range(n):
        if gap_ms > 0:
            time.sleep(rng.uniform(0.0, gap_ms) / 1000.0)
        if not keep_alive:
            c = srv.conn()
        headers = {"Content-Type": "application/json"}
        if traced is not None:
            trace_id = os.urandom(16).hex()  # not from rng: the pauses stay those of the seed
            headers["traceparent"] = "00-%s-%s-01" % (trace_id, os.urandom(8).hex())
        t0 = time.time()
        c.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": "Lily and Tom", "max_tokens": 4, "stream": True, "temperature": 0}),
            headers=headers)
        r = c.getresponse()
        eq(r.status, 200)
        first = None
        while True:
            b = r.read1(65536)
            if not b:
                break
            if first is None and b'"text":"' in b and b'"text":""' not in b:
                first = time.time()
        if not keep_alive:
            c.close()
        out.append((first - t0) * 1000)
        if traced is not None:
            traced.append((trace_id, out[-1], t0))
    if keep_alive:
        c.close()
    return sorted(out)
