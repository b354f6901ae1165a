# Renders a chat template with Jinja2 as Hugging Face does (trim_blocks, lstrip_blocks, loop
# controls, raise_exception, tojson without HTML escaping): the reference for the tests.
# stdin: JSON {"template", "messages", "bos_token", "eos_token", "add_generation_prompt"};
# stdout: the rendered text; exit 3 with "raised: MESSAGE" when the template raised.
# stdin may also be a JSON array of such requests: stdout is then a JSON array of
# {"status": 0 or 3, "out": text} in the same order (one interpreter start for many renders).
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def render(env, req):
    """(0, text) or (3, "raised: MESSAGE")."""
    try:
        return 0, env.from_string(req["template"]).render(
            messages=req["messages"], bos_token=req.get("bos_token", ""),
            eos_token=req.get("eos_token", ""),
            add_generation_prompt=req.get("add_generation_prompt", True))
    except Raised as e:
        return 3, "raised: " + str(e)


def main():
    req = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    if isinstance(req, list):
        out = [dict(zip(("status", "out"), render(env, r))) for r in req]
        sys.stdout.buffer.write(json.dumps(out).encode("utf-8"))
        return
    status, out = render(env, req)
    sys.stdout.buffer.write(out.encode("utf-8"))
    sys.exit(status)


if __name__ == "__main__":
    main()
