#!/usr/bin/python3
"""Example: best-of-4 with a judge, as one program (docs/programs.md): the document is prefilled
once, `fork` runs 4 drafts of a summary side by side from its cached KV (48 tokens each at
temperature 0.8: every branch draws with its own seed salt, so they differ), `join` gathers them
into the list variable `drafts`, and a judge `gen` constrained to the choices "1".."4" picks one.

Run it (Debian's python3 has zmq and msgpack; a pyenv python3 may not):
    ./build/switchyard serve --model ../shared/models/stories260K.gguf &   # any model works
    /usr/bin/python3 examples/program_fork_judge.py [ENDPOINT] [DOCUMENT_FILE]
  It prints the four drafts, the judge's pick, and usage: `cached_tokens` shows the document was
  computed once, not once per branch.
Break it:
    - no server: "no answer within 30 s", exit 1;
    - --n 20: more branches than a fork may have (16): bad_request naming the fork step;
    - --n-conflict: also sends n=4 as a submit field, which a program refuses; the client
      catches it before sending (TypeError naming `n`), exit 1;
    - --no-join: the fork has no join after it: the server refuses the program (bad_request).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients",
                                "python"))
from switchyard_client import Client, JobError, Program  # noqa: E402

DOCUMENT = ("Switchyard is an LLM serving runtime for work that arrives on message queues. "
            "Producers push generation jobs over ZeroMQ; actors admit them, order them by tenant "
            "and priority, batch them continuously, and execute them on GPUs or CPUs.")


def build(n=4, join=True):
    draft = Program().text("\nSummary:").gen("draft", max_tokens=48, temperature=0.8,
                                             stop=["\n"])
    p = (Program()
         .text("Document:\n{{document}}\n")
         .fork(n=n, name="d", steps=draft))
    if join:
        p.join_list("drafts", var="draft")
    # The drafts are the branches' own context; the judge sees them listed (one per line).
    return (p.text("\nCandidate summaries, one per line:\n{{drafts}}\nThe best one is number ")
            .gen("best", choices=["1", "2", "3", "4"], temperature=0))


def main():
    argv, args, n = sys.argv[1:], [], 4
    while argv:
        a = argv.pop(0)
        if a == "--n":
            n = int(argv.pop(0))
        elif not a.startswith("--"):
            args.append(a)
    endpoint = args[0] if args else "tcp://127.0.0.1:5555"
    document = DOCUMENT
    if len(args) > 1:
        with open(args[1], encoding="utf-8") as f:
            document = f.read()
    extra = {"n": 4} if "--n-conflict" in sys.argv else {}
    with Client(endpoint, tenant="demo") as c:
        try:
            done = c.run_program("judge-%d" % os.getpid(), build(n, "--no-join" not in sys.argv),
                                 {"document": document}, timeout_ms=30000, **extra)
        except TimeoutError:
            print("no answer within 30 s (is the server running?)", file=sys.stderr)
            return 1
        except (JobError, TypeError) as e:
            print("program refused: %s" % e, file=sys.stderr)
            return 1
    drafts = done.get("vars", {}).get("drafts", [])
    for i, d in enumerate(drafts, 1):
        print("%d: %s" % (i, d.strip()))
    print("judge picks:", done["text"])
    print("usage:", done.get("usage"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
