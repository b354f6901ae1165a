#!/usr/bin/python3
"""Switchyard's Python client: protocol v1 (docs/protocol.md) over ZeroMQ and msgpack.

Uses Debian's python3-zmq and python3-msgpack (run it with /usr/bin/python3).

    from switchyard_client import Client
    with Client("tcp://127.0.0.1:5555") as c:
        r = c.run("job-1", "demo", "Once upon a time", max_tokens=32, temperature=0)
        print(r.text if r.ok else r.error)
        r = c.run("job-2", "demo", messages=[{"role": "user", "content": "Hi"}], max_tokens=32)

Client talks to the request endpoint (DEALER to the server's ROUTER); Pusher feeds the pipeline
input (PUSH to PULL) and Sink reads the pipeline results (PULL from PUSH).

A server with CURVE on (docs/security.md) answers only clients that know its public key: pass
server_key=read_key_file("server.pub") to Client, Pusher or Sink; a server that admits only listed
client keys also needs client_key=read_key_file("client.key").
"""

import collections
import json
import time

import msgpack
import zmq
from zmq.utils import z85

PROTOCOL_VERSION = 1

# submit options and the Python types they must have (docs/protocol.md, "submit").
_SUBMIT_OPTIONS = {
    "token": str,
    "max_tokens": int,
    "temperature": (int, float),
    "top_k": int,
    "top_p": (int, float),
    "seed": int,
    "stop": (list, tuple, str),
    "ignore_eos": bool,
    "priority": str,
    "deadline_ms": int,
    "stream": bool,
    "logprobs": int,
    "parse_special": bool,
    "n": int,
    "prompt_logprobs": int,
    "min_p": (int, float),
    "presence_penalty": (int, float),
    "frequency_penalty": (int, float),
    "repetition_penalty": (int, float),
    "repeat_last_n": int,
    "logit_bias": dict,  # token id -> bias
    # one constraint at most (docs/constraints.md)
    "grammar": str,
    "json_schema": (dict, str, bool),  # a schema, or its JSON text
    "regex": str,
    "choices": (list, tuple),
}

# score options (docs/protocol.md, "score"): the prompt and continuations are arguments.
_SCORE_OPTIONS = {
    "token": str,
    "priority": str,
    "deadline_ms": int,
    "parse_special": bool,
}

# Server messages are trusted more than client ones, but a non-streamed `done` carries a whole
# completion: allow large bodies, still bounded.
_MAX_SERVER_MESSAGE = 64 << 20


def read_key_file(path):
    """The Z85 key (40 characters) of a file written by `switchyard keygen` (PREFIX.pub).

    Raises ValueError naming the file when it holds no single well-formed key."""
    try:
        with open(path, "r", encoding="ascii", errors="replace") as f:
            # Key files are tiny: a big file is not one.
            text = f.read(4097)
    except OSError as e:
        raise ValueError("CURVE key file '%s': cannot open: %s" % (path, e.strerror)) from None
    if len(text) > 4096:
        raise ValueError("CURVE key file '%s': too large for a key file" % path)
    keys = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
    if len(keys) != 1:
        raise ValueError("CURVE key file '%s': expected one 40-character Z85 key, found %d lines"
                         % (path, len(keys)))
    key = keys[0]
    try:
        ok = len(key) == 40 and len(z85.decode(key.encode("ascii"))) == 32
    except Exception:
        ok = False
    if not ok:
        raise ValueError("CURVE key file '%s': malformed: expected one 40-character Z85 key" % path)
    return key


def _curve_client(sock, server_key, client_key=None):
    """Makes `sock` a CURVE client of the server with this public key (before connect). Its own
    keypair is client_key (a secret key, e.g. read_key_file("client.key"), for a server that
    admits only listed client keys) with its public key, else a fresh ephemeral one."""
    if not server_key:
        if client_key:
            raise ValueError("client_key needs server_key (CURVE)")
        return
    if not zmq.has("curve"):
        raise RuntimeError("server_key needs CURVE, but this libzmq was built without it")
    if isinstance(server_key, str):
        server_key = server_key.encode("ascii")
    if client_key:
        secret = client_key.encode("ascii") if isinstance(client_key, str) else client_key
        public = zmq.curve_public(secret)
    else:
        public, secret = zmq.curve_keypair()
    sock.curve_serverkey = server_key
    sock.curve_publickey = public
    sock.curve_secretkey = secret


class ProtocolError(Exception):
    """The server sent something that is not a protocol v1 message."""


def submit_message(job_id, tenant, prompt=None, messages=None, **options):
    """Builds a `submit` message (a dict). Exactly one of: prompt, a str or a list of token ids;
    messages, a list of {"role": str, "content": str} that the server renders with the model's
    chat template (control-token text in a content stays plain text)."""
    msg = {"v": PROTOCOL_VERSION, "type": "submit", "id": job_id, "tenant": tenant}
    if (prompt is None) == (messages is None):
        raise TypeError("give exactly one of prompt and messages")
    if messages is not None:
        if not isinstance(messages, (list, tuple)) or not messages:
            raise TypeError("messages must be a non-empty list of {'role', 'content'} dicts")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(
                    m.get("content"), str):
                raise TypeError("messages[%d] must be a dict with str 'role' and 'content'" % i)
            out.append({"role": m["role"], "content": m["content"]})
        msg["messages"] = out
    elif isinstance(prompt, (str, list, tuple)):
        msg["prompt"] = prompt if isinstance(prompt, str) else [int(t) for t in prompt]
    else:
        raise TypeError("prompt must be a str or a list of token ids")
    for key, value in options.items():
        if key not in _SUBMIT_OPTIONS:
            raise TypeError("unknown submit option %r" % key)
        if value is None:
            continue  # nil means absent
        if not isinstance(value, _SUBMIT_OPTIONS[key]) or (
                isinstance(value, bool) and _SUBMIT_OPTIONS[key] is int):
            raise TypeError("submit option %r has the wrong type %s" % (key, type(value).__name__))
        msg[key] = list(value) if isinstance(value, tuple) else value
    return msg


def score_message(job_id, tenant, continuations, prompt=None, messages=None, **options):
    """Builds a `score` message: each continuation (a str, tokenized without BOS as text after the
    prompt, or a list of token ids) gets its summed log-probability after the prompt (or
    messages), in the done's `scores`."""
    msg = submit_message(job_id, tenant, prompt, messages)
    msg["type"] = "score"
    if not isinstance(continuations, (list, tuple)):
        raise TypeError("continuations must be a list of str or of token id lists")
    out = []
    for i, c in enumerate(continuations):
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, (list, tuple)):
            out.append([int(t) for t in c])
        else:
            raise TypeError("continuations[%d] must be a str or a list of token ids" % i)
    msg["continuations"] = out
    for key, value in options.items():
        if key not in _SCORE_OPTIONS:
            raise TypeError("unknown score option %r" % key)
        if value is None:
            continue
        if not isinstance(value, _SCORE_OPTIONS[key]) or (
                isinstance(value, bool) and _SCORE_OPTIONS[key] is int):
            raise TypeError("score option %r has the wrong type %s" % (key, type(value).__name__))
        msg[key] = value
    return msg


def encode(msg):
    """msgpack bytes of a message dict (str keys and values as msgpack str)."""
    return msgpack.packb(msg, use_bin_type=True)


def decode(data):
    """A server message as a dict; raises ProtocolError when it is not one."""
    if len(data) > _MAX_SERVER_MESSAGE:
        raise ProtocolError("server message of %d bytes exceeds limit %d"
                            % (len(data), _MAX_SERVER_MESSAGE))
    try:
        msg = msgpack.unpackb(data, raw=False)
    except Exception as e:  # msgpack raises several unrelated types
        raise ProtocolError("undecodable server message: %s" % e) from None
    if not isinstance(msg, dict) or msg.get("v") != PROTOCOL_VERSION or "type" not in msg:
        raise ProtocolError("not a protocol v1 message: %r" % (msg,))
    return msg


class Result:
    """Everything one job produced: accepted, streamed chunks, and done or error."""

    def __init__(self):
        self.accepted = None
        self.chunks = []
        self.ids = []
        self.text = ""
        self.logprobs = []  # per completion id when asked for: done's, or the chunks'
        self.choices = {}  # n > 1: sample index -> {"ids", "text", "logprobs", "finish_reason"}
        self.scores = []  # a score request: the done's scores
        self.done = None
        self.error = None
        self.timed_out = False

    @property
    def ok(self):
        """True when the job ended with `done`."""
        return self.done is not None

    def __repr__(self):
        if self.ok:
            return "Result(done %s, %d tokens)" % (self.done.get("finish_reason"), len(self.ids))
        if self.error:
            return "Result(error %s: %s)" % (self.error.get("code"), self.error.get("message"))
        return "Result(timed out)"


class _Connection:
    """One connected socket (a CURVE client when server_key is given), usable with `with`."""

    def __init__(self, endpoint, context, server_key, kind, linger_ms, client_key=None):
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(kind)
        self._sock.setsockopt(zmq.LINGER, linger_ms)
        _curve_client(self._sock, server_key, client_key)
        self._sock.connect(endpoint)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Closes the socket (after up to LINGER ms for what it still holds to leave)."""
        self._sock.close()


class Client(_Connection):
    """A DEALER connection to the request endpoint. One thread per Client."""

    def __init__(self, endpoint="tcp://127.0.0.1:5555", context=None, server_key=None,
                 client_key=None):
        # Linger 0: a client that gave up must not block exit.
        super().__init__(endpoint, context, server_key, zmq.DEALER, 0, client_key)
        self._pending = collections.deque()
        self._seq = 0

    def send(self, msg):
        """Sends one message dict (adds "v")."""
        msg = dict(msg)
        msg.setdefault("v", PROTOCOL_VERSION)
        self._sock.send(encode(msg))

    def send_raw(self, data):
        """Sends raw bytes as one frame (for testing the server's error replies)."""
        self._sock.send(data)

    def submit(self, job_id, tenant, prompt=None, **options):
        """Sends a submit; options as in docs/protocol.md (messages instead of prompt,
        max_tokens, temperature, stream, ...)."""
        self._sock.send(encode(submit_message(job_id, tenant, prompt, **options)))

    def score(self, job_id, tenant, continuations, prompt=None, **options):
        """Sends a score request (messages= instead of prompt; token, priority, deadline_ms)."""
        self._sock.send(encode(score_message(job_id, tenant, continuations, prompt, **options)))

    def run_score(self, job_id, tenant, continuations, prompt=None, timeout_ms=60000, **options):
        """Sends a score request and waits for its done (Result.scores) or error."""
        self.score(job_id, tenant, continuations, prompt, **options)
        return self.wait(job_id, timeout_ms, tenant)

    def cancel(self, job_id, tenant, token=""):
        """Cancels a queued or running job."""
        self.send({"type": "cancel", "id": job_id, "tenant": tenant, "token": token})

    def status(self, job_id, tenant, token=""):
        """Asks for a job's state (answered by a status_reply)."""
        self.send({"type": "status", "id": job_id, "tenant": tenant, "token": token})

    def ping(self, seq=0):
        """Sends a ping (answered by a pong with the same seq)."""
        self.send({"type": "ping", "seq": seq})

    def _recv(self, timeout_ms):
        if not self._sock.poll(timeout_ms, zmq.POLLIN):
            return None
        return decode(self._sock.recv())

    def next(self, timeout_ms=10000):
        """The next server message (a dict), or None after timeout_ms."""
        if self._pending:
            return self._pending.popleft()
        return self._recv(timeout_ms)

    def wait(self, job_id, timeout_ms=60000, tenant=None):
        """Collects a job's messages until its done or error (at most timeout_ms between two).
        With tenant, only replies naming that tenant (or none) count: one connection may run
        the same id for two tenants."""
        def is_mine(m):
            return m.get("id") == job_id and (tenant is None or m.get("tenant") in (None, tenant))
        r = Result()
        mine = collections.deque(m for m in self._pending if is_mine(m))
        self._pending = collections.deque(m for m in self._pending if not is_mine(m))
        while True:
            if mine:
                m = mine.popleft()
            else:
                m = self._recv(timeout_ms)
                if m is None:
                    r.timed_out = True
                    return r
                if not is_mine(m):
                    self._pending.append(m)
                    continue
            kind = m["type"]
            if kind == "accepted":
                r.accepted = m
            elif kind == "tokens":
                r.chunks.append(m)
                c = r.choices.setdefault(m.get("choice", 0),
                                         {"ids": [], "text": "", "logprobs": []})
                c["ids"].extend(m.get("ids", []))
                c["text"] += m.get("text", "")
                c["logprobs"].extend(m.get("logprobs", []))
                if m.get("choice", 0) == 0:
                    r.ids.extend(m.get("ids", []))
                    r.text += m.get("text", "")
                    r.logprobs.extend(m.get("logprobs", []))
            elif kind == "done":
                if m.get("ids") or m.get("text"):
                    r.ids = list(m.get("ids", []))
                    r.text = m.get("text", "")
                if m.get("logprobs"):
                    r.logprobs = list(m["logprobs"])
                if m.get("choices"):
                    r.ids, r.text, r.logprobs = [], "", []
                    for ch in m["choices"]:
                        c = r.choices.setdefault(ch["index"],
                                                 {"ids": [], "text": "", "logprobs": []})
                        c["finish_reason"] = ch.get("finish_reason")
                        if ch.get("ids") or ch.get("text"):
                            c["ids"] = list(ch.get("ids", []))
                            c["text"] = ch.get("text", "")
                        if ch.get("logprobs"):
                            c["logprobs"] = list(ch["logprobs"])
                else:
                    r.choices = {}
                r.scores = list(m.get("scores", []))
                r.done = m
                return r
            elif kind == "error":
                r.error = m
                return r

    def run(self, job_id, tenant, prompt=None, timeout_ms=60000, **options):
        """Submits and waits for the job's done or error; returns a Result."""
        self.submit(job_id, tenant, prompt, **options)
        return self.wait(job_id, timeout_ms, tenant)

    def control(self, command, policy=None, token="", timeout_ms=5000):
        """Sends an operator command ("kv_policy" with a policy text such as "sliding_window:512",
        or "stats") with the admin token; returns (result, error): result is the reply's JSON
        decoded to a dict, error the `error` message dict; (None, None) after timeout_ms in all.
        Replies carry no id: keep one command in flight per Client."""
        msg = {"type": "control", "command": command}
        if token:
            msg["token"] = token
        if policy:
            msg["policy"] = policy
        self.send(msg)
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            m = self._recv(left) if left > 0 else None
            if m is None:
                return None, None
            if m["type"] == "control_reply":
                return json.loads(m.get("result", "{}")), None
            if m["type"] == "error" and not m.get("id"):
                return None, m
            self._pending.append(m)

    def ping_wait(self, timeout_ms=5000):
        """Pings and waits for the matching pong; False on timeout."""
        self._seq += 1
        self.ping(self._seq)
        while True:
            m = self._recv(timeout_ms)
            if m is None:
                return False
            if m["type"] == "pong" and m.get("seq", 0) == self._seq:
                return True
            self._pending.append(m)


class Pusher(_Connection):
    """A PUSH connection to the pipeline input. Sends block while the server's queues are full."""

    def __init__(self, endpoint="tcp://127.0.0.1:5556", context=None, server_key=None,
                 client_key=None):
        # Pushed jobs were handed over: closing waits up to 60 s so that it does not drop what
        # ZeroMQ still holds, but a server that is gone must not block the producer forever.
        super().__init__(endpoint, context, server_key, zmq.PUSH, 60000, client_key)

    def submit(self, job_id, tenant, prompt=None, timeout_ms=None, **options):
        """Pushes a submit; False when the server did not take it within timeout_ms."""
        data = encode(submit_message(job_id, tenant, prompt, **options))
        return self.send_bytes(data, timeout_ms)

    def send_bytes(self, data, timeout_ms=None):
        """Pushes raw bytes; None timeout waits for as long as the server applies backpressure."""
        if timeout_ms is not None and not self._sock.poll(timeout_ms, zmq.POLLOUT):
            return False
        self._sock.send(data)
        return True


class Sink(_Connection):
    """A PULL connection to the pipeline results: `done` and `error` messages."""

    def __init__(self, endpoint="tcp://127.0.0.1:5557", context=None, server_key=None,
                 client_key=None):
        # The server's PUSH results socket is a CURVE server too: the sink is its CURVE client.
        super().__init__(endpoint, context, server_key, zmq.PULL, 0, client_key)

    def next(self, timeout_ms=10000):
        """The next result (a dict), or None after timeout_ms."""
        if not self._sock.poll(timeout_ms, zmq.POLLIN):
            return None
        return decode(self._sock.recv())
