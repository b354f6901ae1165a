#!/usr/bin/python3
"""The Python client's program builder (clients/python/switchyard_client.py, docs/programs.md):
the exact step maps Program builds, the ValueErrors and TypeErrors it raises before anything is
sent, one program submit through the client's encoder, and the client's event loop (run_program
answering tool calls) against a scripted in-process socket. No server: the end-to-end run is an
integration test.

    /usr/bin/python3 tests/python/test_program_builder.py     (Debian's python3-zmq, -msgpack)

Prints one line per case and "N passed"; exits 1 on the first failure.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python"))
import msgpack  # noqa: E402
import switchyard_client as sc  # noqa: E402
from switchyard_client import JobError, Program  # noqa: E402

CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def eq(got, want):
    if got != want:
        raise AssertionError("got  %r\nwant %r" % (got, want))


def raises(exc, fragment, fn, *args, **kwargs):
    """fn(*args, **kwargs) raises exc whose text contains fragment."""
    try:
        fn(*args, **kwargs)
    except exc as e:
        if fragment not in str(e):
            raise AssertionError("%s raised %r, which does not say %r" % (fn, str(e), fragment))
        return
    raise AssertionError("%s did not raise %s (%r)" % (fn, exc.__name__, fragment))


@case
def text_and_roles():
    eq(Program().text("Hi {{name}}").text("be brief", role="system").steps(),
       [{"type": "text", "text": "Hi {{name}}"},
        {"type": "text", "text": "be brief", "role": "system"}])


@case
def gen_only_set_fields():
    eq(Program().gen("a").steps(), [{"type": "gen", "name": "a"}])
    eq(Program().gen("answer", max_tokens=64, temperature=0, stop=["\n"], top_k=40, seed=7,
                     min_p=0.05, repetition_penalty=1.1, repeat_last_n=32,
                     presence_penalty=0.5, frequency_penalty=0.25, top_p=0.9).steps(),
       [{"type": "gen", "name": "answer", "max_tokens": 64, "temperature": 0, "stop": ["\n"],
         "top_k": 40, "seed": 7, "min_p": 0.05, "repetition_penalty": 1.1, "repeat_last_n": 32,
         "presence_penalty": 0.5, "frequency_penalty": 0.25, "top_p": 0.9}])
    # append true is the default and left out; false is written
    eq(Program().gen("a", append=True).gen("b", append=False).steps(),
       [{"type": "gen", "name": "a"}, {"type": "gen", "name": "b", "append": False}])
    # one stop string travels as a list; tuples as lists; logit_bias keyed by decimal text
    eq(Program().gen("a", stop="END", logit_bias={15043: -100, "7": 2.5}).steps(),
       [{"type": "gen", "name": "a", "stop": ["END"], "logit_bias": {"15043": -100, "7": 2.5}}])
    eq(Program().gen("a", stop=("x", "y")).steps()[0]["stop"], ["x", "y"])


@case
def gen_constraints():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    eq(Program().gen("args", json_schema=schema, max_tokens=32, append=False).steps(),
       [{"type": "gen", "name": "args", "max_tokens": 32, "json_schema": schema,
         "append": False}])
    eq(Program().gen("j", json_schema='{"type": "integer"}').steps()[0]["json_schema"],
       '{"type": "integer"}')
    eq(Program().gen("g", grammar='root ::= "yes" | "no"').steps(),
       [{"type": "gen", "name": "g", "grammar": 'root ::= "yes" | "no"'}])
    eq(Program().gen("r", regex="[0-9]{3}").steps(),
       [{"type": "gen", "name": "r", "regex": "[0-9]{3}"}])
    eq(Program().gen("c", choices=("1", "2")).steps(),
       [{"type": "gen", "name": "c", "choices": ["1", "2"]}])
    raises(ValueError, "grammar, regex exclude each other", Program().gen, "x",
           grammar="root ::= \"a\"", regex="a")
    raises(ValueError, "choices must be a non-empty list", Program().gen, "x", choices=[])


@case
def gen_refuses_unknown_and_mistyped_fields():
    raises(TypeError, "unknown gen field 'max_token'", Program().gen, "x", max_token=4)
    raises(TypeError, "unknown gen field 'n'", Program().gen, "x", n=4)
    raises(TypeError, "'max_tokens' has the wrong type str", Program().gen, "x", max_tokens="4")
    raises(TypeError, "'max_tokens' has the wrong type bool", Program().gen, "x", max_tokens=True)
    raises(TypeError, "'append' has the wrong type int", Program().gen, "x", append=0)


@case
def select():
    eq(Program().select("intent", [" search", " chat"]).steps(),
       [{"type": "select", "name": "intent", "choices": [" search", " chat"]}])
    eq(Program().select("i", ["a", "b"], method="greedy_first_token", append=False).steps(),
       [{"type": "select", "name": "i", "choices": ["a", "b"], "method": "greedy_first_token",
         "append": False}])
    raises(ValueError, "method 'best' is not one of", Program().select, "i", ["a"], "best")
    raises(ValueError, "choices must be a non-empty list of str", Program().select, "i", [])
    raises(ValueError, "choices must be a non-empty list of str", Program().select, "i", [1])


@case
def fork_n_and_join_list():
    draft = Program().text("\nSummary:").gen("draft", max_tokens=48, temperature=0.8)
    p = (Program().text("Document:\n{{document}}\n")
         .fork(n=4, steps=draft, name="d")
         .join_list("drafts", var="draft")
         .gen("best", choices=["1", "2", "3", "4"]))
    eq(p.steps(),
       [{"type": "text", "text": "Document:\n{{document}}\n"},
        {"type": "fork", "name": "d", "n": 4,
         "steps": [{"type": "text", "text": "\nSummary:"},
                   {"type": "gen", "name": "draft", "max_tokens": 48, "temperature": 0.8}]},
        {"type": "join", "mode": "list", "name": "drafts", "var": "draft"},
        {"type": "gen", "name": "best", "choices": ["1", "2", "3", "4"]}])
    # the fork took a copy: changing the branch program afterwards changes nothing
    draft.gen("late")
    eq(len(p.steps()[1]["steps"]), 2)
    eq(len(p), 4)


@case
def fork_branches_and_join_text():
    p = (Program()
         .fork(branches=[Program().gen("a", max_tokens=8),
                         [{"type": "gen", "name": "b"}]])
         .join(separator="\n")
         .fork(branches=[Program().text("x")])
         .join()
         .fork(branches=[Program().text("y")])
         .join(mode="list", name="l", var="v"))
    eq(p.steps(),
       [{"type": "fork", "branches": [[{"type": "gen", "name": "a", "max_tokens": 8}],
                                      [{"type": "gen", "name": "b"}]]},
        {"type": "join", "separator": "\n"},
        {"type": "fork", "branches": [[{"type": "text", "text": "x"}]]},
        {"type": "join"},
        {"type": "fork", "branches": [[{"type": "text", "text": "y"}]]},
        {"type": "join", "mode": "list", "name": "l", "var": "v"}])
    raises(ValueError, "give branches=[...], or n= with steps=", Program().fork)
    raises(ValueError, "give branches=[...], or n= with steps=", Program().fork,
           branches=[Program()], steps=Program(), n=2)
    raises(ValueError, "steps= needs n=", Program().fork, steps=Program())
    raises(ValueError, "n goes with steps=", Program().fork, branches=[Program()], n=2)
    raises(ValueError, "n must be at least 1", Program().fork, n=0, steps=Program())
    raises(ValueError, "branches must be a non-empty list", Program().fork, branches=[])
    raises(TypeError, "branches[1] must be a Program or a list", Program().fork,
           branches=[Program(), "gen"])
    raises(TypeError, "must be a step map with a str 'type'", Program().fork,
           branches=[[{"name": "x"}]])
    raises(ValueError, "name and var belong to mode 'list'", Program().join, name="x")
    raises(ValueError, "separator belongs to mode 'text'", Program().join, mode="list",
           name="a", var="b", separator=",")
    raises(ValueError, "mode 'lists' is not 'text' or 'list'", Program().join, mode="lists")


@case
def tool():
    eq(Program().tool("passage", tool="search", arguments="{{query}}").steps(),
       [{"type": "tool", "name": "passage", "tool": "search", "arguments": "{{query}}"}])
    eq(Program().tool("r", tool="calc", arguments="{{args}}", timeout_ms=5000, role="tool",
                      append=False).steps(),
       [{"type": "tool", "name": "r", "tool": "calc", "arguments": "{{args}}",
         "tool_timeout_ms": 5000, "role": "tool", "append": False}])
    eq(Program().tool("r", tool="now").steps(), [{"type": "tool", "name": "r", "tool": "now"}])
    raises(ValueError, "tool (the tool's name) must not be empty", Program().tool, "r", tool="")
    raises(TypeError, "'timeout_ms' has the wrong type float", Program().tool, "r", tool="t",
           timeout_ms=1.5)


@case
def bad_names():
    for bad in ("2x", "a-b", "", "a b", "x.y", "é", "a\n", None, 3):
        raises(ValueError, "is not a valid name", Program().gen, bad)
        raises(ValueError, "is not a valid name", Program().select, bad, ["a"])
        raises(ValueError, "is not a valid name", Program().tool, bad, tool="t")
        if bad is not None:  # a fork's name is optional
            raises(ValueError, "is not a valid name", Program().fork, name=bad, n=2,
                   steps=Program())
        raises(ValueError, "is not a valid name", Program().join_list, bad, var="v")
        raises(ValueError, "is not a valid name", Program().join_list, "ok", var=bad)
    # the message names the step as the server does, by this builder's index
    raises(ValueError, "step 1 (gen 'a-b'): name 'a-b' is not a valid name",
           Program().text("x").gen, "a-b")
    for good in ("a", "_", "A_1", "snake_case_99", "_x"):
        Program().gen(good).select(good, ["a"]).tool(good, tool="t").join_list(good, var=good)
    # a failed call appends nothing
    p = Program().text("x")
    raises(ValueError, "is not a valid name", p.gen, "1")
    eq(len(p), 1)


@case
def program_message_and_encoding():
    p = Program().text("Q: {{question}}\nA:").gen("answer", max_tokens=16)
    msg = sc.program_message("q-17", "acme", p, inputs={"question": "Who wrote Dune?"},
                             max_tokens=32, temperature=0, stream=True, priority="batch",
                             token="t0k", stop="\n")
    eq(msg, {"v": 1, "type": "submit", "id": "q-17", "tenant": "acme", "program": p.steps(),
             "inputs": {"question": "Who wrote Dune?"}, "max_tokens": 32, "temperature": 0,
             "stream": True, "priority": "batch", "token": "t0k", "stop": ["\n"]})
    decoded = msgpack.unpackb(sc.encode(msg), raw=False)
    eq(decoded, msg)
    eq("program" in decoded and "prompt" not in decoded and "messages" not in decoded, True)
    eq(decoded["program"][1], {"type": "gen", "name": "answer", "max_tokens": 16})
    # the encoding is the wire's: str keys as msgpack str (fixstr a7 "program"), an array of maps
    data = sc.encode(msg)
    eq(b"\xa7program\x92\x82\xa4type\xa4text" in data, True)
    # a list of step maps is taken as it is; no inputs: no `inputs` key
    eq(sc.program_message("j", "t", [{"type": "gen", "name": "x"}]),
       {"v": 1, "type": "submit", "id": "j", "tenant": "t",
        "program": [{"type": "gen", "name": "x"}]})
    raises(ValueError, "a program needs at least one step", sc.program_message, "j", "t",
           Program())
    raises(ValueError, "is not a valid name", sc.program_message, "j", "t", p, {"a-b": "x"})
    raises(TypeError, "input 'q' must be a str", sc.program_message, "j", "t", p, {"q": 1})
    raises(TypeError, "'n' cannot go with a program", sc.program_message, "j", "t", p, n=2)
    raises(TypeError, "'json_schema' cannot go with a program: a constraint belongs to a gen",
           sc.program_message, "j", "t", p, json_schema={})
    raises(TypeError, "unknown submit option 'prompt'", sc.program_message, "j", "t", p,
           prompt="x")
    raises(TypeError, "must be a Program or a list of step maps", sc.program_message, "j", "t",
           "text")


@case
def tool_result_message():
    msg = sc.tool_result_message("q-17", "acme", "4", "Dune is by Frank Herbert.", token="t0k")
    eq(msg, {"v": 1, "type": "tool_result", "id": "q-17", "tenant": "acme", "token": "t0k",
             "call": "4", "content": "Dune is by Frank Herbert."})
    eq(msgpack.unpackb(sc.encode(msg), raw=False), msg)
    raises(TypeError, "field 'content' must be a str", sc.tool_result_message, "j", "t", "0", 5)


@case
def docs_example():
    # the example at the top of docs/programs.md builds what its table says
    p = (Program()
         .text("Question: {{question}}\nIntent:")
         .select("intent", [" search", " chat"])
         .text("\nQuery:")
         .gen("query", max_tokens=16, stop=["\n"])
         .tool("passage", tool="search", arguments="{{query}}")
         .text("\nAnswer:")
         .gen("answer", max_tokens=64))
    eq([s["type"] for s in p.steps()],
       ["text", "select", "text", "gen", "tool", "text", "gen"])
    eq(p.steps()[4], {"type": "tool", "name": "passage", "tool": "search",
                      "arguments": "{{query}}"})
    # Program(steps) starts from a copy of existing steps
    eq(Program(p).steps(), p.steps())
    eq(Program(p.steps()).text("more").steps()[-1], {"type": "text", "text": "more"})


class FakeServer:
    """A ROUTER on an inproc endpoint, in a thread, playing a server's side of a script: each
    entry is ("recv", check(msg)) or ("send", msg). Not a server: it checks the client's loop
    (run_program, wait) against the messages docs/programs.md describes."""

    def __init__(self, ctx, endpoint, script):
        import threading
        import zmq
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.bind(endpoint)
        self.script = script
        self.failure = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        peer = None
        try:
            for what, arg in self.script:
                if what == "recv":
                    # Bounded so that a client that never sends fails the case, not hangs it.
                    if not self.sock.poll(5000):
                        raise AssertionError("fake server: nothing received")
                    peer, body = self.sock.recv_multipart()
                    arg(msgpack.unpackb(body, raw=False))
                else:
                    msg = dict(arg, v=1)
                    self.sock.send_multipart([peer, msgpack.packb(msg, use_bin_type=True)])
        except Exception as e:  # reported by finish()
            self.failure = e

    def finish(self):
        self.thread.join(10)
        self.sock.close(0)
        if self.thread.is_alive():
            raise AssertionError("fake server did not finish its script")
        if self.failure is not None:
            raise self.failure


@case
def run_program_answers_tool_calls():
    import zmq
    ctx = zmq.Context()
    key = {"id": "p1", "tenant": "acme"}
    p = (Program().text("Q: {{q}}\nQuery:").gen("query", max_tokens=8)
         .tool("passage", tool="search", arguments="{{query}}").gen("answer"))

    def check_submit(m):
        eq(m["type"], "submit")
        eq(m["program"], p.steps())
        eq(m["inputs"], {"q": "Dune?"})
        eq(m["token"], "tk")
        eq(m["stream"], True)

    def check_tool_result(m):
        eq(m, {"v": 1, "type": "tool_result", "id": "p1", "tenant": "acme", "token": "tk",
               "call": "2", "content": "passage for 'dune author'"})

    done = dict(key, type="done", finish_reason="stop", text="Frank Herbert",
                vars={"q": "Dune?", "query": "dune author", "passage": "passage for 'dune author'",
                      "answer": "Frank Herbert"}, steps=3,
                usage={"prompt_tokens": 30, "completion_tokens": 6}, timings={"total_ms": 1})
    script = [
        ("recv", check_submit),
        ("send", dict(key, type="accepted", queue_position=0)),
        ("send", dict(key, type="tokens", step="1", index=0, ids=[5], text="dune")),
        ("send", dict(key, type="tokens", step="1", index=1, ids=[6], text=" author")),
        ("send", dict(key, type="step", step="1", name="query", kind="gen", output="dune author")),
        ("send", dict(key, type="tool_call", call="2", name="search", arguments="dune author")),
        ("recv", check_tool_result),
        ("send", dict(key, type="step", step="2", name="passage", kind="tool",
                      output="passage for 'dune author'")),
        ("send", dict(key, type="tokens", step="3", index=0, ids=[7], text="Frank Herbert")),
        ("send", done),
    ]
    server = FakeServer(ctx, "inproc://programs-1", script)
    seen = []
    with sc.Client("inproc://programs-1", context=ctx, tenant="acme", token="tk") as c:
        got = c.run_program("p1", p, {"q": "Dune?"}, stream=True, timeout_ms=5000,
                            tools={"search": lambda a: "passage for %r" % a},
                            on_message=lambda m: seen.append(m["type"]))
    server.finish()
    eq(got, dict(done, v=1))
    eq(seen, ["accepted", "tokens", "tokens", "step", "tool_call", "step", "tokens", "done"])

    # wait() gathers the same events into a Result; an error ends run_program with JobError
    def check_cancel(m):
        eq((m["type"], m["id"], m["tenant"], m["token"]), ("cancel", "p3", "acme", ""))

    script = [
        ("recv", lambda m: eq(m["id"], "p2")),
        ("send", dict(key, id="p2", type="step", step="0", name="a", kind="gen", output="x")),
        ("send", dict(key, id="p2", type="tokens", step="1", index=0, ids=[1], text="y")),
        ("send", dict(key, id="p2", type="tool_call", call="1", name="t", arguments="x")),
        ("send", dict(key, id="p2", type="done", finish_reason="stop", text="z",
                      vars={"a": "x", "l": ["1", "2"]}, steps=2)),
        ("recv", lambda m: eq(m["id"], "p3")),
        ("send", dict(key, id="p3", type="tool_call", call="0", name="missing", arguments="")),
        ("recv", check_cancel),
        ("recv", lambda m: eq(m["id"], "p4")),
        ("send", dict(key, id="p4", type="error", code="bad_request",
                      message="step 1 (gen 'a'): unknown field 'max_token'")),
    ]
    server = FakeServer(ctx, "inproc://programs-2", script)
    with sc.Client("inproc://programs-2", context=ctx) as c:
        c.submit_program("p2", [{"type": "gen", "name": "a"}], tenant="acme")
        r = c.wait("p2", 5000, "acme")
        eq((r.ok, r.text, r.vars, r.step_text, r.ids), (True, "z", {"a": "x", "l": ["1", "2"]},
                                                          {"1": "y"}, []))
        eq([m["type"] for m in r.steps + r.tool_calls], ["step", "tool_call"])
        raises(KeyError, "calls tool 'missing', which run_program was not given", c.run_program,
               "p3", Program().gen("a"), tenant="acme", timeout_ms=5000)
        raises(JobError, "bad_request: step 1 (gen 'a')", c.run_program, "p4",
               Program().gen("a"), tenant="acme", timeout_ms=5000)
        raises(TypeError, "no tenant", c.submit_program, "p5", Program().gen("a"))
    server.finish()
    ctx.term()


def main():
    for fn in CASES:
        try:
            fn()
        except Exception as e:  # report which case, then stop
            print("FAIL %s: %s: %s" % (fn.__name__, type(e).__name__, e))
            return 1
        print("ok   %s" % fn.__name__)
    print("%d passed" % len(CASES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
