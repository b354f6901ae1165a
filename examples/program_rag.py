#!/usr/bin/python3
"""Example: retrieval-augmented answering as one program (docs/programs.md): classify the
question's intent with `select`, write a search query with `gen`, fetch a passage through a
`search` tool answered by a local function, and answer with `gen`, all in one submit.

Run it (Debian's python3 has zmq and msgpack; a pyenv python3 may not):
    ./build/switchyard serve --model ../shared/models/stories260K.gguf &   # any model works
    /usr/bin/python3 examples/program_rag.py [ENDPOINT] ["question"]
  It prints each step as the server finishes it (intent, query, the tool call and its passage,
  answer), then the program's variables and usage. The demo model's text is noise, but the flow,
  the tool round trip and the variables are real.
Break it:
    - no server: "no answer within 30 s", exit 1;
    - --no-tool: the search tool is not given to run_program, which cancels the program and
      reports the missing tool (KeyError), exit 1;
    - --bad-template: the answer step names {{pasage}}, which no step defines: the server refuses
      the whole program before running anything (bad_request naming the step), exit 1;
    - --slow-tool: the tool takes 3 s but the step allows 1 s (timeout_ms=1000): the program
      ends with deadline_exceeded naming the tool step, exit 1.
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients",
                                "python"))
from switchyard_client import Client, JobError, Program  # noqa: E402

# The "index" the search tool reads: one passage per keyword, a stand-in for a vector store.
PASSAGES = {
    "dune": "Dune is a 1965 science fiction novel by Frank Herbert, set on the desert planet "
            "Arrakis.",
    "zeromq": "ZeroMQ is a messaging library: sockets that carry whole messages in patterns "
              "such as request-reply, publish-subscribe and push-pull.",
    "msgpack": "MessagePack is a binary serialization format, like JSON but smaller and faster.",
}


def search(arguments):
    """The `search` tool: the passage whose keyword the query mentions, else a fallback."""
    query = arguments.lower()
    for keyword, passage in PASSAGES.items():
        if keyword in query:
            return passage
    return "No passage matched the query %r." % arguments.strip()[:80]


def build(bad_template=False, tool_timeout_ms=None):
    intents = [" lookup", " compare", " explain", " chat"]  # 4 intents, scored in one step
    answer_context = "{{pasage}}" if bad_template else "{{passage}}"
    return (Program()
            .text("Question: {{question}}\nIntent:")
            .select("intent", intents)
            .text("\nSearch query:")
            .gen("query", max_tokens=16, temperature=0, stop=["\n"])
            # append=False: the passage goes into the context where the next text puts it
            .tool("passage", tool="search", arguments="{{query}} {{question}}",
                  timeout_ms=tool_timeout_ms, append=False)
            .text("\nPassage: " + answer_context + "\nAnswer:")
            .gen("answer", max_tokens=48, temperature=0, stop=["\n\n"]))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = {a for a in sys.argv[1:] if a.startswith("--")}
    endpoint = args[0] if args else "tcp://127.0.0.1:5555"
    question = args[1] if len(args) > 1 else "Who wrote Dune?"
    tools = {"search": search}
    if "--no-tool" in flags:
        tools = {}
    if "--slow-tool" in flags:
        tools = {"search": lambda a: (time.sleep(3), search(a))[1]}
    program = build("--bad-template" in flags, 1000 if "--slow-tool" in flags else None)

    def show(m):
        if m["type"] == "step":
            print("[%s] %s %s = %r" % (m["step"], m["kind"], m["name"], m["output"]))
        elif m["type"] == "tool_call":
            print("[%s] tool_call %s(%r)" % (m["call"], m["name"], m["arguments"]))

    with Client(endpoint, tenant="demo") as c:
        try:
            done = c.run_program("rag-%d" % os.getpid(), program, {"question": question},
                                 tools=tools, timeout_ms=30000, on_message=show)
        except TimeoutError:
            print("no answer within 30 s (is the server running?)", file=sys.stderr)
            return 1
        except (JobError, KeyError) as e:
            print("program failed: %s" % e, file=sys.stderr)
            return 1
    print("answer:", done["text"])
    print("vars:", done.get("vars"))
    print("steps=%s usage=%s" % (done.get("steps"), done.get("usage")), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
