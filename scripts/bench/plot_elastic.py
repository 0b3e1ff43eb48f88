"""The elastic suite's plot, from its report (scripts/bench/results/elastic.md): test
accuracy by clock of the static job and of the preempted one (half the ranks leave, then
come back), and the scale-out runs' seconds against Litz's ideal."""
import argparse
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def table_after(lines, heading_prefix):
    """Rows (lists of cells) of the first markdown table after a heading or line that
    starts with heading_prefix."""
    start = next((i for i, l in enumerate(lines) if l.startswith(heading_prefix)), None)
    if start is None:
        return []
    rows, inside = [], False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            inside = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r"-+", c) for c in cells):
                rows.append(cells)
        elif inside:
            break
    return rows[1:]  # without the header


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("report")
    p.add_argument("png")
    a = p.parse_args()
    lines = open(a.report).read().splitlines()
    accuracy = table_after(lines, "Test accuracy by clock")
    scale = table_after(lines, "# Scale-out")
    preempt = table_after(lines, "# Preemption")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    if accuracy:
        clocks = [int(r[0]) for r in accuracy]
        ax.plot(clocks, [float(r[1]) for r in accuracy], marker="o", label="static, 4 ranks")
        ax.plot(clocks, [float(r[2]) for r in accuracy], marker="s", label="4 → 2 → 4 live")
        for row in preempt[1:2]:
            for i in (4, 5):
                for c in row[i].split():
                    ax.axvline(int(c), color="grey", alpha=0.3)
        ax.set_xlabel("clock")
        ax.set_ylabel("test accuracy")
        ax.set_title("MLR: half the ranks preempted, then back (grey: change clocks)")
        ax.legend()
    ax = axes[1]
    if scale:
        models = [r[0] for r in scale]
        kinds = [("static 4", 2), ("static 8", 3), ("4 → 8 live", 4), ("ideal", 7)]
        width = 0.2
        for k, (name, col) in enumerate(kinds):
            xs = [m + (k - 1.5) * width for m in range(len(models))]
            ax.bar(xs, [float(r[col]) for r in scale], width, label=name)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels([f"{m} ({r[1]} clocks)" for m, r in zip(models, scale)])
        ax.set_ylabel("wall seconds")
        ax.set_title("Scale-out 4 → 8 at 30% of the clocks (2 cores)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
    print(f"plot: {a.png}")


if __name__ == "__main__":
    main()
