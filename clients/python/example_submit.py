#!/usr/bin/python3
"""Example: submit one job with the Python client, streamed, and print the text as it comes.

Run it (Debian's python3 has zmq and msgpack; a pyenv python3 may not):
    ./build/switchyard serve &
    /usr/bin/python3 clients/python/example_submit.py [ENDPOINT] ["prompt"] [MAX_TOKENS]
Break it:
    - no server: "no answer within 10 s", exit 1;
    - MAX_TOKENS 0: the server answers error bad_request naming max_tokens;
    - --garbage as the prompt: sends random bytes instead of a job and prints the error reply.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from switchyard_client import Client  # noqa: E402


def main():
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
    prompt = sys.argv[2] if len(sys.argv) > 2 else "Once upon a time"
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    with Client(endpoint) as c:
        if prompt == "--garbage":
            c.send_raw(os.urandom(32))
            m = c.next(10000)
            print(m if m else "no answer within 10 s")
            return 0 if m else 1
        c.submit("py-example-1", "demo", prompt, max_tokens=max_tokens, temperature=0, stream=True)
        while True:
            m = c.next(10000)
            if m is None:
                print("\nno answer within 10 s (is the server running?)", file=sys.stderr)
                return 1
            if m["type"] == "tokens":
                print(m.get("text", ""), end="", flush=True)
            elif m["type"] == "done":
                print()
                usage = m.get("usage", {})
                print("finish=%s completion_tokens=%s ttft_ms=%.2f" % (
                    m["finish_reason"], usage.get("completion_tokens"),
                    m.get("timings", {}).get("ttft_ms", 0.0)), file=sys.stderr)
                return 0
            elif m["type"] == "error":
                print("\nerror %s: %s" % (m["code"], m["message"]), file=sys.stderr)
                return 1


if __name__ == "__main__":
    sys.exit(main())
