#!/usr/bin/env python3
"""Per-kernel time from Nsight Compute's summary, largest total first.

Reads the text of `ncu --metrics gpu__time_duration.sum --print-summary per-kernel PROGRAM` and
prints, per kernel name and grid, the total time (invocations x mean), the invocations and the
mean, in microseconds. Usage: bench/ncu_summary.py NCU_OUTPUT [ROWS]
"""
import re
import sys

UNITS = {"ns": 0.001, "us": 1.0, "ms": 1000.0, "s": 1e6}
HEADER = re.compile(r"^  (\S.*?) \((\d+, \d+, \d+)\)x\((\d+, \d+, \d+)\), .*Invocations (\d+)")
DURATION = re.compile(r"^\s+gpu__time_duration.sum\s+(\w+)\s+([\d,.]+)\s+([\d,.]+)\s+([\d,.]+)")


def main():
    rows, cur = [], None
    with open(sys.argv[1]) as f:
        for line in f:
            m = HEADER.match(line)
            if m:
                cur = (m.group(1), m.group(2), int(m.group(4)))
                continue
            m = DURATION.match(line)
            if m and cur:
                mean = float(m.group(4).replace(",", "")) * UNITS[m.group(1)]
                name = re.sub(r"\(.*", "", cur[0]).removeprefix("void ")
                name = name.replace("sy::<unnamed>::", "")
                rows.append((cur[2] * mean, cur[2], mean, name[:60], cur[1]))
                cur = None
    rows.sort(reverse=True)
    print(f"total {sum(r[0] for r in rows):.0f} us")
    print(f"{'total us':>10} {'calls':>5} {'mean us':>9}  {'kernel':<60} grid")
    for r in rows[: int(sys.argv[2]) if len(sys.argv) > 2 else 40]:
        print("%10.0f %5d %9.2f  %-60s %s" % r)


if __name__ == "__main__":
    main()
