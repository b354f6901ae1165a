#!/usr/bin/env python3
"""Folds `perf script` output into stacks and draws them as an SVG flame graph.

    perf script -i perf.data | python3 bench/flamegraph.py - --svg flame.svg \
        [--folded stacks.txt] [--top 20] [--title TEXT] [--width 1400] [--no-comm]

A stack is one sample's frames, outermost first, joined by ';' (the thread's name first unless
--no-comm), and the folded text is one line per distinct stack: `frame;frame;...;leaf COUNT`. The
SVG draws every frame as a box whose width is its share of the samples, callers below their
callees; hovering a box shows its name, samples and share. --top prints, as Markdown, the frames
with the most samples on top of the stack (self) and the most samples under them (total).

Symbols are shortened: the offset (+0x..), the parameter list of C++ functions and the library
path go; a frame without a symbol is named after its library ([libc.so.6]). Uses only the
standard library.
"""
import argparse
import collections
import html
import re
import sys
import zlib

# A frame line of `perf script`: address, symbol (maybe "[unknown]" or "sym+0x1f"), (library).
FRAME = re.compile(r"^\s+([0-9a-fA-F]+)\s+(.*?)\s+\(([^()]*)\)\s*$")
# A sample's first line starts in column 0: "comm pid[/tid] [cpu] time: period event:".
ANON = "(anonymous namespace)"


def short_symbol(sym, dso):
    """The name a box shows: no offset, no C++ parameter list, no path."""
    if sym in ("", "[unknown]"):
        base = dso.rsplit("/", 1)[-1].strip("[]") or "unknown"
        return "[" + base + "]"
    sym = re.sub(r"\+0x[0-9a-fA-F]+$", "", sym)
    sym = sym.replace(ANON, "\x01")
    # Cut at the first '(' outside template brackets: what follows is the parameter list
    # (and a trailing const or [clone ...], kept only for clones).
    depth = 0
    for i, ch in enumerate(sym):
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            if sym[:i].endswith("operator") and sym[i : i + 2] == "()":
                continue  # the call operator's own name, not its parameters
            clone = re.search(r"\[clone [^\]]*\]", sym[i:])
            sym = sym[:i] + (" " + clone.group(0) if clone else "")
            break
    return sym.replace("\x01", ANON)


def fold(lines, with_comm=True):
    """Counts of each stack (a tuple of frames, outermost first) in `perf script` text."""
    counts = collections.Counter()
    comm, frames = None, []

    def flush():
        if comm is not None and frames:
            stack = list(reversed(frames))
            if with_comm:
                stack.insert(0, comm)
            counts[tuple(stack)] += 1

    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            flush()
            comm, frames = None, []
            continue
        if not line[0].isspace():
            flush()
            frames = []
            # The thread name may hold spaces; it ends before the " PID" or " PID/TID" field.
            m = re.match(r"^(.*?)\s+\d+(/\d+)?\s", line)
            comm = (m.group(1) if m else line.split()[0]).strip()
            continue
        m = FRAME.match(line)
        if m and comm is not None:
            frames.append(short_symbol(m.group(2), m.group(3)))
    flush()
    return counts


def build_tree(counts):
    """A tree of dicts: {"n": samples, "kids": {name: node}}, kids in name order when drawn."""
    root = {"n": 0, "kids": {}}
    for stack, n in counts.items():
        root["n"] += n
        node = root
        for frame in stack:
            node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
            node["n"] += n
    return root


def color(name):
    """A warm colour that depends only on the name, so a frame keeps its colour across graphs."""
    h = zlib.crc32(name.encode())
    r = 205 + h % 50
    g = 80 + (h >> 8) % 130
    b = 40 + (h >> 16) % 50
    return "rgb(%d,%d,%d)" % (r, g, b)


def svg(counts, title, width=1400, row=17, min_px=0.3):
    root = build_tree(counts)
    total = root["n"] or 1
    # Depth of the drawn tree (boxes narrower than min_px are left out, with their callees).
    scale = (width - 20) / total
    boxes = []

    def walk(node, name, x, depth):
        w = node["n"] * scale
        if w < min_px:
            return depth
        if name is not None:
            boxes.append((name, x, depth, w, node["n"]))
        deepest = depth
        cx = x
        for kid_name in sorted(node["kids"]):
            kid = node["kids"][kid_name]
            deepest = max(deepest, walk(kid, kid_name, cx, depth + 1))
            cx += kid["n"] * scale
        return deepest

    max_depth = walk(root, "all", 10.0, 0)
    height = (max_depth + 1) * row + 50
    out = [
        '<?xml version="1.0" standalone="no"?>',
        '<svg version="1.1" width="%d" height="%d" xmlns="http://www.w3.org/2000/svg" '
        'font-family="Verdana, sans-serif" font-size="11">' % (width, height),
        '<rect x="0" y="0" width="%d" height="%d" fill="#f8f8f0"/>' % (width, height),
        '<text x="%d" y="22" text-anchor="middle" font-size="15">%s</text>'
        % (width // 2, html.escape(title)),
        '<text x="10" y="%d" fill="#555">%d samples; hover a box for its name and share</text>'
        % (height - 8, total),
    ]
    char_px = 6.6  # average glyph width of 11px Verdana
    for name, x, depth, w, n in boxes:
        y = height - 30 - (depth + 1) * row
        label = "%s (%d samples, %.2f%%)" % (name, n, 100.0 * n / total)
        out.append("<g><title>%s</title>" % html.escape(label))
        out.append(
            '<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" rx="2"/>'
            % (x, y, max(w - 0.5, 0.1), row - 1, "rgb(200,200,200)" if depth == 0 else color(name))
        )
        fit = int((w - 6) / char_px)
        if fit >= 3:
            text = name if len(name) <= fit else name[: fit - 2] + ".."
            out.append('<text x="%.1f" y="%d">%s</text>' % (x + 3, y + row - 5, html.escape(text)))
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def top_table(counts, n):
    """Markdown: the frames with the most self and the most total samples."""
    total = sum(counts.values()) or 1
    self_n, total_n = collections.Counter(), collections.Counter()
    for stack, c in counts.items():
        self_n[stack[-1]] += c
        for frame in set(stack):
            total_n[frame] += c
    lines = ["| self % | frame (top of the stack) |", "| ---: | --- |"]
    for frame, c in self_n.most_common(n):
        lines.append("| %.1f | `%s` |" % (100.0 * c / total, frame))
    lines += ["", "| total % | frame (anywhere on the stack) |", "| ---: | --- |"]
    for frame, c in total_n.most_common(n):
        lines.append("| %.1f | `%s` |" % (100.0 * c / total, frame))
    return "\n".join(lines) + "\n"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("input", help="`perf script` output, or - for stdin")
    ap.add_argument("--svg", help="write the flame graph here")
    ap.add_argument("--folded", help="write the folded stacks here")
    ap.add_argument("--top", type=int, default=0, help="print the N heaviest frames (Markdown)")
    ap.add_argument("--title", default="Flame graph")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--no-comm", action="store_true", help="no thread name at the root")
    a = ap.parse_args(argv)
    if a.width < 200:
        ap.error("--width must be at least 200")
    src = sys.stdin if a.input == "-" else open(a.input, errors="replace")
    counts = fold(src, with_comm=not a.no_comm)
    if not counts:
        sys.stderr.write("flamegraph.py: no samples with stacks in %s\n" % a.input)
        return 1
    if a.folded:
        with open(a.folded, "w") as f:
            for stack, c in sorted(counts.items()):
                f.write("%s %d\n" % (";".join(stack), c))
    if a.svg:
        with open(a.svg, "w") as f:
            f.write(svg(counts, a.title, a.width))
    if a.top:
        sys.stdout.write(top_table(counts, a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
