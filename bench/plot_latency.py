#!/usr/bin/python3
# Draws bench_loadgen's latency samples as CDFs (one panel per metric, one line per class).
# Usage: plot_latency.py SAMPLES.json OUT.png   (bench_loadgen --plot runs it itself)
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display on servers
import matplotlib.pyplot as plt
import matplotlib.ticker


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_latency.py SAMPLES.json OUT.png")
    with open(sys.argv[1]) as f:
        data = json.load(f)
    title = data.pop("title", "")
    metrics = [k for k in data if any(data[k].values())]
    if not metrics:
        sys.exit("plot_latency.py: no samples")
    cols = 2 if len(metrics) > 1 else 1
    rows = (len(metrics) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    for ax, metric in zip(axes.flat, metrics):
        for name, values in data[metric].items():
            values = sorted(v for v in values if v is not None)
            if not values:
                continue
            n = len(values)
            ys = [(i + 1) / n for i in range(n)]
            label = f"{name} (n={n}, p50={values[(n - 1) // 2]:.3g})"
            ax.step(values, ys, where="post", label=label)
        ax.set_title(metric)
        ax.set_xlabel(metric)
        ax.set_ylabel("fraction of samples")
        # Latencies span orders of magnitude (queueing tails): a log axis keeps both ends visible.
        lo = min(min(v) for v in data[metric].values() if v)
        hi = max(max(v) for v in data[metric].values() if v)
        # ...but a narrow range reads better on a linear one (log ticks would crowd it).
        if lo > 0 and hi / lo > 20:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"bench_loadgen: {title}")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
