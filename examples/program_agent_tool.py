#!/usr/bin/python3
"""Example: a one-tool agent as one program (docs/programs.md): a `gen` constrained by a JSON
Schema writes the tool's arguments, a `tool` step sends them to this client as a tool_call and
waits for the result (a local weather function here), and a final `gen` answers with it. The
program is a chat: text steps with roles render through the model's chat template, and the tool's
result is a `tool` message.

Run it (Debian's python3 has zmq and msgpack; a pyenv python3 may not):
    ./build/switchyard serve --model ../shared/models/stories260K.gguf &   # a chat model is
    /usr/bin/python3 examples/program_agent_tool.py [ENDPOINT] ["request"]  # better; any works
  It prints the arguments the model wrote (always valid JSON of the schema when the gen ended
  with "stop"), the tool's result and the final answer.
  (A model without a chat template, like stories260K, needs `--chat-template chatml` on serve.)
Break it:
    - no server: "no answer within 30 s", exit 1;
    - --bad-name: the arguments gen is named "tool-args", which is not a name: the client's
      builder raises ValueError before anything is sent, exit 1;
    - --tool-fails: the tool raises; run_program cancels the program and re-raises, exit 1;
    - --tiny: the arguments gen may write only 4 tokens: the JSON is cut (finish "length"), the
      tool gets text that does not parse and says so, and the answer is built on that error.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients",
                                "python"))
from switchyard_client import Client, JobError, Program  # noqa: E402

# The arguments the model must write: one city, a unit from a fixed set.
ARGS_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 32},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}


def weather(arguments):
    """The `weather` tool: a canned forecast for the city the arguments name."""
    try:
        args = json.loads(arguments)
        city, unit = args["city"], args["unit"]
    except (ValueError, KeyError, TypeError) as e:
        return "error: arguments %r are not {city, unit}: %s" % (arguments[:80], e)
    temp = 21 if unit == "celsius" else 70
    return json.dumps({"city": city, "forecast": "sunny", "temperature": temp, "unit": unit})


def build(args_name="args", args_tokens=48):
    return (Program()
            .text("You call the weather tool with JSON arguments, then answer in one sentence.",
                  role="system")
            .text("{{request}}", role="user")
            .gen(args_name, max_tokens=args_tokens, temperature=0, json_schema=ARGS_SCHEMA,
                 append=False)
            .tool("forecast", tool="weather", arguments="{{%s}}" % args_name,
                  timeout_ms=10000)
            .gen("answer", max_tokens=48, temperature=0))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    endpoint = args[0] if args else "tcp://127.0.0.1:5555"
    request = args[1] if len(args) > 1 else "Will I need an umbrella in Lisbon today?"
    tools = {"weather": weather}
    if "--tool-fails" in sys.argv:
        def broken(_):
            raise RuntimeError("the weather service is down")
        tools = {"weather": broken}
    try:
        program = build("tool-args" if "--bad-name" in sys.argv else "args",
                        4 if "--tiny" in sys.argv else 48)
    except ValueError as e:
        print("program not built: %s" % e, file=sys.stderr)
        return 1

    def show(m):
        if m["type"] == "tool_call":
            print("tool_call %s(%s)" % (m["name"], m["arguments"]))
        elif m["type"] == "step" and m["kind"] == "tool":
            print("tool result:", m["output"])

    with Client(endpoint, tenant="demo") as c:
        try:
            done = c.run_program("agent-%d" % os.getpid(), program, {"request": request},
                                 tools=tools, timeout_ms=30000, on_message=show)
        except TimeoutError:
            print("no answer within 30 s (is the server running?)", file=sys.stderr)
            return 1
        except (JobError, RuntimeError) as e:
            print("program failed: %s" % e, file=sys.stderr)
            return 1
    print("answer:", done["text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
