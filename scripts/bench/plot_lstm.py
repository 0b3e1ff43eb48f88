"""Plots the lstm suite's perplexity curves (scripts/bench/lstm_vs_torch.sh): validation
perplexity against examples processed (clock x B x P), one panel per network, the
median over the repetitions of each configuration.

Usage: plot_lstm.py OUT.png EXAMPLES_PER_CLOCK NETWORK=DIR [NETWORK=DIR ...]
Each DIR holds CONFIG.REP.jsonl metrics files (the suite's raw runs)."""
import glob
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def curve(path):
    points = {}
    for line in open(path):
        record = json.loads(line)
        for key in ("valid_perplexity", "test_perplexity"):
            if key in record and not record.get("summary"):
                points[record["clock"]] = record[key]
    return points


def median_curve(paths):
    curves = [curve(p) for p in paths]
    clocks = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    return clocks, [statistics.median(c[k] for c in curves) for k in clocks]


def main():
    out, per_clock, nets = sys.argv[1], int(sys.argv[2]), [a.split("=", 1) for a in sys.argv[3:]]
    fig, axes = plt.subplots(1, len(nets), figsize=(6.5 * len(nets), 4.5), squeeze=False)
    for ax, (net, directory) in zip(axes[0], nets):
        configs = sorted({os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(directory, "*.jsonl"))})
        for config in configs:
            clocks, ppl = median_curve(sorted(glob.glob(os.path.join(directory, f"{config}.*.jsonl"))))
            if clocks:
                ax.plot([c * per_clock for c in clocks], ppl, marker=".", label=config)
        ax.set_title(f"KJV LSTM, {net}")
        ax.set_xlabel("examples processed (clock x B x P)")
        ax.set_ylabel("validation perplexity")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
