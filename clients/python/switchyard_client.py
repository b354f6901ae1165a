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

Programs (docs/programs.md): a whole flow (text, gen, select, fork/join, tool) in one submit,
built with Program and run by the server; tool calls are answered by local functions:

    from switchyard_client import Client, Program
    p = (Program().text("Q: {{question}}\nQuery:").gen("query", max_tokens=16, stop=["\n"])
         .tool("passage", tool="search", arguments="{{query}}")
         .text("\nAnswer:").gen("answer", max_tokens=64))
    with Client("tcp://127.0.0.1:5555", tenant="demo") as c:
        done = c.run_program("q-1", p, inputs={"question": "Who wrote Dune?"},
                             tools={"search": lambda args: "Dune is a novel by Frank Herbert."})
        print(done["vars"]["answer"])

A server with CURVE on (docs/security.md) answers only clients that know its public key: pass
server_key=read_key_file("server.pub") to Client, Pusher or Sink; a server that admits only listed
client keys also needs client_key=read_key_file("client.key").
"""

import collections
import copy
import json
import re
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
    "trace": str,  # a W3C traceparent (docs/tracing.md)
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


class JobError(Exception):
    """A job or program ended with an `error` message (run_program): `error` is the message,
    `code` and `message` its fields."""

    def __init__(self, error):
        self.error = error
        self.code = error.get("code")
        self.message = error.get("message")
        super().__init__("%s: %s" % (self.code, self.message))


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


# ---- programs (docs/programs.md) -------------------------------------------------------------

# The sampling fields a gen step may carry, and the submit of a program carries as every gen
# step's defaults (docs/programs.md, "Steps"), with their Python types.
_GEN_SAMPLING = {key: _SUBMIT_OPTIONS[key] for key in (
    "max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "repeat_last_n", "logit_bias")}

# A gen step's constraint: one at most (docs/constraints.md).
_CONSTRAINTS = ("grammar", "json_schema", "regex", "choices")

# What a submit with `program` may carry besides id, tenant, program and inputs.
_PROGRAM_SUBMIT_OPTIONS = dict(_GEN_SAMPLING, token=str, priority=str, deadline_ms=int,
                               stream=bool)

# Submit fields the server refuses beside `program`, and why (docs/programs.md, "On the wire").
_PROGRAM_REFUSED = {
    "n": "a fork with n= runs steps several times",
    "logprobs": "the server refuses it beside program",
    "prompt_logprobs": "the server refuses it beside program",
    "ignore_eos": "the server refuses it beside program",
    "parse_special": "the server refuses it beside program (inputs and text stay plain text)",
    "grammar": "a constraint belongs to a gen step",
    "json_schema": "a constraint belongs to a gen step",
    "regex": "a constraint belongs to a gen step",
    "choices": "a constraint belongs to a gen step",
}

_SELECT_METHODS = ("token_length_normalized", "greedy_first_token")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_name(where, name):
    """Raises ValueError unless `name` is a program name ([A-Za-z_][A-Za-z0-9_]*)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError("%s: name %r is not a valid name: names are [A-Za-z_][A-Za-z0-9_]* "
                         "(docs/programs.md)" % (where, name))
    return name


def _check_type(where, key, value, types):
    """Raises TypeError unless value has one of `types` (a bool is not an int)."""
    if not isinstance(value, types) or (isinstance(value, bool) and types is int):
        raise TypeError("%s: %r has the wrong type %s" % (where, key, type(value).__name__))


def _option_value(key, value):
    """A checked option as it travels: tuples as lists; a stop string as a one-string list; a
    logit_bias map keyed by decimal text, which is how a JSON producer writes token ids (a step
    map reaches the server's program parser as JSON)."""
    if key == "stop" and isinstance(value, str):
        return [value]
    if key == "logit_bias":
        return {str(int(k)): v for k, v in value.items()}
    return list(value) if isinstance(value, tuple) else value


def _program_steps(program, where="program"):
    """The step maps of a Program or of a list of step maps (a deep copy: later changes to the
    builder do not change what was taken)."""
    if isinstance(program, Program):
        return program.steps()
    if not isinstance(program, (list, tuple)):
        raise TypeError("%s must be a Program or a list of step maps, got %s"
                        % (where, type(program).__name__))
    for i, step in enumerate(program):
        if not isinstance(step, dict) or not isinstance(step.get("type"), str):
            raise TypeError("%s[%d] must be a step map with a str 'type'" % (where, i))
    return copy.deepcopy(list(program))


class Program:
    """A program (docs/programs.md) built step by step; every method appends one step and returns
    the Program, so calls chain. steps() gives the step maps a submit's `program` carries, with
    only the fields that were set (the server fills in the defaults). Names are checked here
    (ValueError); scopes, templates and limits are checked by the server when it is submitted.

        p = (Program().text("Document:\\n{{doc}}\\n")
             .fork(n=4, name="d", steps=Program().text("Summary:").gen("draft", max_tokens=48))
             .join_list("drafts", var="draft")
             .text("Best summary (1-4):").gen("best", choices=["1", "2", "3", "4"]))
    """

    def __init__(self, steps=None):
        """An empty program, or one starting with these step maps (a list, or a Program)."""
        self._steps = [] if steps is None else _program_steps(steps, "steps")

    def _where(self, kind, name=None):
        # Named as the server names steps ("step 2 (gen 'answer')"), by this builder's index.
        if name is None:
            return "step %d (%s)" % (len(self._steps), kind)
        return "step %d (%s %r)" % (len(self._steps), kind, name)

    def _append_flag(self, step, where, append):
        # append defaults to true: written only when false (encoders leave out defaults).
        _check_type(where, "append", append, bool)
        if not append:
            step["append"] = False

    def text(self, text, role=None):
        """Appends `text` to the context ({{name}} inserts an input or an earlier variable;
        {{{{ is a literal {{). With `role`, starts a chat message of that role."""
        where = self._where("text")
        _check_type(where, "text", text, str)
        step = {"type": "text", "text": text}
        if role is not None:
            _check_type(where, "role", role, str)
            if not role:
                raise ValueError("%s: role must not be empty" % where)
            step["role"] = role
        self._steps.append(step)
        return self

    def gen(self, name, max_tokens=None, temperature=None, stop=None, grammar=None,
            json_schema=None, regex=None, choices=None, append=True, **sampling):
        """Generates into variable `name`. Sampling fields (max_tokens, temperature, stop, and
        top_k, top_p, seed, min_p, presence_penalty, frequency_penalty, repetition_penalty,
        repeat_last_n, logit_bias as keywords) default to the submit's; one constraint at most
        (grammar, json_schema as a dict or JSON text, regex, choices). append=False keeps the
        output out of the context (it is still a variable)."""
        where = self._where("gen", name)
        step = {"type": "gen", "name": _check_name(where, name)}
        fields = dict(max_tokens=max_tokens, temperature=temperature, stop=stop)
        for key, value in sampling.items():
            if key not in _GEN_SAMPLING:
                raise TypeError("%s: unknown gen field %r (docs/programs.md lists them)"
                                % (where, key))
            fields[key] = value
        for key in _GEN_SAMPLING:  # one fixed order, whatever the call's order
            value = fields.get(key)
            if value is not None:
                _check_type(where, key, value, _GEN_SAMPLING[key])
                step[key] = _option_value(key, value)
        constraint = dict(grammar=grammar, json_schema=json_schema, regex=regex, choices=choices)
        given = [key for key in _CONSTRAINTS if constraint[key] is not None]
        if len(given) > 1:
            raise ValueError("%s: %s exclude each other: a gen step takes one constraint"
                             % (where, ", ".join(given)))
        for key in given:
            value = constraint[key]
            _check_type(where, key, value, _SUBMIT_OPTIONS[key])
            if key == "choices":
                value = _check_choices(where, value)
            step[key] = value
        self._append_flag(step, where, append)
        self._steps.append(step)
        return self

    def select(self, name, choices, method=None, append=True):
        """Picks one of `choices` by log-probability (one batched scoring step) into variable
        `name`; method "token_length_normalized" (the server's default) or
        "greedy_first_token"."""
        where = self._where("select", name)
        step = {"type": "select", "name": _check_name(where, name),
                "choices": _check_choices(where, choices)}
        if method is not None:
            if method not in _SELECT_METHODS:
                raise ValueError("%s: method %r is not one of %s"
                                 % (where, method, ", ".join(_SELECT_METHODS)))
            step["method"] = method
        self._append_flag(step, where, append)
        self._steps.append(step)
        return self

    def fork(self, branches=None, n=None, steps=None, name=None):
        """Runs branches side by side, each from a copy of the context: `branches` (a list of
        Programs or step lists), or the same `steps` `n` times (each draws differently). A join
        must follow. Branch variables appear in the result as NAME.I.VAR."""
        where = self._where("fork", name)
        step = {"type": "fork"}
        if name is not None:
            step["name"] = _check_name(where, name)
        if (branches is None) == (steps is None):
            raise ValueError("%s: give branches=[...], or n= with steps=" % where)
        if branches is not None:
            if n is not None:
                raise ValueError("%s: n goes with steps=, not with branches=" % where)
            if not isinstance(branches, (list, tuple)) or not branches:
                raise ValueError("%s: branches must be a non-empty list of Programs or step "
                                 "lists" % where)
            step["branches"] = [_program_steps(b, "%s: branches[%d]" % (where, i))
                                for i, b in enumerate(branches)]
        else:
            if n is None:
                raise ValueError("%s: steps= needs n= (how many times to run them)" % where)
            _check_type(where, "n", n, int)
            if n < 1:
                raise ValueError("%s: n must be at least 1, got %d" % (where, n))
            step["n"] = n
            step["steps"] = _program_steps(steps, "%s: steps" % where)
        self._steps.append(step)
        return self

    def join(self, mode="text", separator=None, name=None, var=None):
        """Ends the fork just before it. mode "text": appends what each branch appended, in
        branch order, `separator` between them. mode "list" (see join_list): variable `name`
        becomes the list of every branch's variable `var`."""
        where = self._where("join")
        step = {"type": "join"}
        if mode == "text":
            if name is not None or var is not None:
                raise ValueError("%s: name and var belong to mode 'list' (join_list)" % where)
            if separator is not None:
                _check_type(where, "separator", separator, str)
                step["separator"] = separator
        elif mode == "list":
            if separator is not None:
                raise ValueError("%s: separator belongs to mode 'text'" % where)
            step["mode"] = "list"
            step["name"] = _check_name(where, name)
            step["var"] = _check_name(where + " var", var)
        else:
            raise ValueError("%s: mode %r is not 'text' or 'list'" % (where, mode))
        self._steps.append(step)
        return self

    def join_list(self, name, var):
        """Ends the fork just before it: variable `name` becomes the list of every branch's
        variable `var` (joined by newlines where a template inserts it)."""
        return self.join(mode="list", name=name, var=var)

    def tool(self, name, tool, arguments=None, timeout_ms=None, role=None, append=True):
        """Asks the client to run tool `tool` (a tool_call event carrying `arguments`, with
        {{name}} inserts resolved) and waits for its tool_result, which becomes variable `name`
        and is appended (as a message of `role`, default "tool", in chat mode). timeout_ms
        bounds the wait (the wire's tool_timeout_ms; the server's default is 60 s)."""
        where = self._where("tool", name)
        step = {"type": "tool", "name": _check_name(where, name)}
        _check_type(where, "tool", tool, str)
        if not tool:
            raise ValueError("%s: tool (the tool's name) must not be empty" % where)
        step["tool"] = tool
        if arguments is not None:
            _check_type(where, "arguments", arguments, str)
            step["arguments"] = arguments
        if timeout_ms is not None:
            _check_type(where, "timeout_ms", timeout_ms, int)
            step["tool_timeout_ms"] = timeout_ms
        if role is not None:
            _check_type(where, "role", role, str)
            if not role:
                raise ValueError("%s: role must not be empty" % where)
            step["role"] = role
        self._append_flag(step, where, append)
        self._steps.append(step)
        return self

    def steps(self):
        """The step maps, as a submit's `program` carries them (a copy)."""
        return copy.deepcopy(self._steps)

    def __len__(self):
        return len(self._steps)

    def __repr__(self):
        return "Program(%s)" % ", ".join(s["type"] + (" " + s["name"] if "name" in s else "")
                                         for s in self._steps)


def _check_choices(where, choices):
    if not isinstance(choices, (list, tuple)) or not choices or not all(
            isinstance(c, str) for c in choices):
        raise ValueError("%s: choices must be a non-empty list of str" % where)
    return list(choices)


def program_message(job_id, tenant, program, inputs=None, **options):
    """Builds a `submit` of a program (a dict): `program` a Program or a list of step maps,
    `inputs` a dict name -> str for the {{name}} inserts. Options: token, priority, deadline_ms,
    stream, and the sampling fields, which are the defaults of every gen step."""
    msg = {"v": PROTOCOL_VERSION, "type": "submit", "id": job_id, "tenant": tenant}
    steps = _program_steps(program)
    if not steps:
        raise ValueError("a program needs at least one step")
    msg["program"] = steps
    if inputs:
        if not isinstance(inputs, dict):
            raise TypeError("inputs must be a dict name -> str")
        for key, value in inputs.items():
            _check_name("inputs", key)
            if not isinstance(value, str):
                raise TypeError("input %r must be a str, got %s" % (key, type(value).__name__))
        msg["inputs"] = dict(inputs)
    for key, value in options.items():
        if key in _PROGRAM_REFUSED:
            raise TypeError("submit option %r cannot go with a program: %s (docs/programs.md)"
                            % (key, _PROGRAM_REFUSED[key]))
        if key not in _PROGRAM_SUBMIT_OPTIONS:
            raise TypeError("unknown submit option %r for a program" % key)
        if value is None:
            continue  # nil means absent
        _check_type("submit", key, value, _PROGRAM_SUBMIT_OPTIONS[key])
        msg[key] = _option_value(key, value)
    return msg


def tool_result_message(job_id, tenant, call, content, token=""):
    """Builds a `tool_result`: `content` (str) answers the tool_call `call` of program
    (tenant, job_id)."""
    for key, value in (("id", job_id), ("tenant", tenant), ("call", call), ("content", content),
                       ("token", token)):
        if not isinstance(value, str):
            raise TypeError("tool_result field %r must be a str, got %s"
                            % (key, type(value).__name__))
    return {"v": PROTOCOL_VERSION, "type": "tool_result", "id": job_id, "tenant": tenant,
            "token": token, "call": call, "content": content}


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
        # a program: its `step` events, its `tool_call` events, the streamed text of each gen
        # step by path (chunks carrying `step`), and the done's variables (name -> str, or a
        # list of str for a join's list)
        self.steps = []
        self.tool_calls = []
        self.step_text = {}
        self.vars = {}
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
                 client_key=None, tenant=None, token=None):
        """tenant and token: the defaults of the program methods (submit_program, tool_result,
        run_program), which take them as keywords."""
        # Linger 0: a client that gave up must not block exit.
        super().__init__(endpoint, context, server_key, zmq.DEALER, 0, client_key)
        self._pending = collections.deque()
        self._seq = 0
        self.tenant = tenant
        self.token = token

    def _tenant(self, tenant):
        tenant = self.tenant if tenant is None else tenant
        if tenant is None:
            raise TypeError("no tenant: pass tenant=, or give the Client one (Client(tenant=...))")
        return tenant

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

    def submit_program(self, job_id, program, inputs=None, tenant=None, **options):
        """Sends a submit of a program (a Program or a list of step maps) with its inputs (a dict
        name -> str); options as for program_message (token, priority, deadline_ms, stream, the
        sampling defaults). tenant and token default to the Client's."""
        if options.get("token") is None and self.token:
            options["token"] = self.token
        self._sock.send(encode(program_message(job_id, self._tenant(tenant), program, inputs,
                                               **options)))

    def tool_result(self, job_id, call, content, tenant=None, token=None):
        """Answers the tool_call `call` (its `call` field) of program job_id with `content`.
        tenant and token default to the Client's."""
        token = self.token if token is None else token
        self.send(tool_result_message(job_id, self._tenant(tenant), call, content, token or ""))

    def run_program(self, job_id, program, inputs=None, tools=None, tenant=None,
                    timeout_ms=60000, on_message=None, **options):
        """Submits a program, answers each of its tool_calls with tools[name](arguments) (a str),
        and returns its `done` (a dict: text, vars, steps, usage, timings). on_message, if
        given, sees every message of the program as it comes (accepted, tokens, step,
        tool_call, done). Raises JobError when the program ends with an error, TimeoutError
        when nothing comes for timeout_ms (a tool's own run time does not count), and, after
        cancelling the program, KeyError for a tool not in `tools` or whatever a tool raised."""
        tenant = self._tenant(tenant)
        token = options.get("token")
        if token is None:
            token = self.token or ""
        tools = tools or {}

        def handle(m):
            if on_message is not None:
                on_message(m)
            if m["type"] != "tool_call":
                return
            try:
                fn = tools.get(m.get("name"))
                if fn is None:
                    raise KeyError("program %r calls tool %r, which run_program was not given "
                                   "(tools: %s)" % (job_id, m.get("name"),
                                                    ", ".join(sorted(tools)) or "none"))
                content = fn(m.get("arguments", ""))
                if not isinstance(content, str):
                    raise TypeError("tool %r returned %s, not a str"
                                    % (m.get("name"), type(content).__name__))
            except BaseException:
                # The program would wait for this result until its tool timeout: end it now.
                self.cancel(job_id, tenant, token)
                raise
            self.tool_result(job_id, m["call"], content, tenant=tenant, token=token)

        self.submit_program(job_id, program, inputs, tenant=tenant, **options)
        r = self.wait(job_id, timeout_ms, tenant, on_message=handle)
        if r.error is not None:
            raise JobError(r.error)
        if r.done is None:
            raise TimeoutError("program %r: no message within %d ms" % (job_id, timeout_ms))
        return r.done

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

    def wait(self, job_id, timeout_ms=60000, tenant=None, on_message=None):
        """Collects a job's messages until its done or error (at most timeout_ms between two).
        With tenant, only replies naming that tenant (or none) count: one connection may run
        the same id for two tenants. on_message, if given, is called with each of the job's
        messages as it is taken (a program's tool_call events can be answered from there:
        run_program does)."""
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
            if on_message is not None:
                on_message(m)
            kind = m["type"]
            if kind == "accepted":
                r.accepted = m
            elif kind == "tokens" and "step" in m:  # a program's gen step, named by its path
                r.chunks.append(m)
                r.step_text[m["step"]] = r.step_text.get(m["step"], "") + m.get("text", "")
            elif kind == "step":
                r.steps.append(m)
            elif kind == "tool_call":
                r.tool_calls.append(m)
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
                r.vars = dict(m.get("vars", {}))
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

    def submit_program(self, job_id, tenant, program, inputs=None, timeout_ms=None, **options):
        """Pushes a submit of a program (see program_message); its tool_calls and done come to
        the Sink, and a Client answers the tool_calls (Client.tool_result). False when the
        server did not take it within timeout_ms."""
        data = encode(program_message(job_id, tenant, program, inputs, **options))
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
