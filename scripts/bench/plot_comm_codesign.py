#!/usr/bin/python3
"""Summarises the runs of comm_codesign.sh (the paper's Figures 9-12) as markdown
tables and one PNG per figure.

Inputs: a directory of metrics files named KEY__REP.jsonl (the JSON lines
`orpheus train --metrics` writes: one per clock, eval clocks with test_accuracy,
then a summary line), the configurations (KEY=FLAGS), the figures to report and the
header facts as KEY=VALUE arguments. Standard library (json) plus matplotlib, which
is optional: without it only the tables are written.
"""

import argparse
import json
import os
import statistics
import sys

from bench_metrics import read_metrics

# Figure -> title, PNG name, rows (key, label), reference key of the bytes ratio.
FIGURES = {
    "fig9": {
        "title": "Figure 9: SV selection, C of the B = 100 SVGs per clock (random multicast, Q = 3)",
        "png": "fig9_select.png",
        "rows": [("c10", "C = 10"), ("c25", "C = 25"), ("c50", "C = 50"), ("c100", "C = 100 (no selection)")],
        "ref": "c100",
    },
    "fig10": {
        "title": "Figure 10: random multicast fanout Q (C = 25)",
        "png": "fig10_fanout.png",
        "rows": [("q1", "Q = 1"), ("c25", "Q = 3"), ("q7", "Q = 7 (broadcast to all peers)")],
        "ref": "q7",
    },
    "fig11": {
        "title": "Figure 11: multicast schedule (C = 25, Q = 3)",
        "png": "fig11_schedule.png",
        "rows": [("fixed", "fixed (DM)"), ("ring", "ring (RRM)"), ("c25", "random (RM)")],
        "ref": "c25",
    },
    "fig12": {
        "title": "Figure 12: link failures, 10% of directed links broken each clock (C = 25, Q = 3)",
        "png": "fig12_failures.png",
        "rows": [("drop_fixed", "fixed (DM), 10% links down"), ("drop_ring", "ring (RRM), 10% links down"),
                 ("drop_random", "random (RM), 10% links down")],
        "baseline": {"drop_fixed": "fixed", "drop_ring": "ring", "drop_random": "c25"},
    },
}
SCHEDULE = {"drop_fixed": "fixed (DM)", "drop_ring": "ring (RRM)", "drop_random": "random (RM)"}




def analyse(path, target, also=()):
    clocks, summary = read_metrics(path)
    if summary is None or not clocks:
        return None
    evals = [(c["clock"], c["seconds"], c["test_accuracy"]) for c in clocks if "test_accuracy" in c]
    hit = next((e for e in evals if e[2] >= target), None)
    mean = lambda field: statistics.fmean(c[field] for c in clocks)  # noqa: E731
    r = {
        "evals": evals,
        "to_target_clock": hit[0] if hit else None,
        "to_target_seconds": hit[1] if hit else None,
        "final": summary.get("test_accuracy", evals[-1][2] if evals else float("nan")),
        "best": max((e[2] for e in evals), default=float("nan")),
        "bytes_per_clock": summary["bytes_per_clock"],
        "messages_per_clock": summary["messages"] / max(1, summary["clocks"]),
        "seconds": summary["seconds"],
        "clock": mean("clock_seconds"),
        "compute": mean("compute_seconds") - mean("select_seconds"),
        "select": mean("select_seconds"),
        "comm": mean("comm_seconds"),
        "update": mean("update_seconds"),
        "wait": mean("wait_seconds"),
        "max_gap": summary.get("max_clock_gap", 0),
        "fanout": summary.get("fanout"),
        "ranks": summary.get("ranks"),
    }
    # The fastest window of consecutive clocks: less sensitive to other work that shared the
    # cores for part of the run.
    width = max(1, min(100, len(clocks) // 10))
    r["clock_best"] = min(statistics.fmean(c["clock_seconds"] for c in clocks[i:i + width])
                          for i in range(0, len(clocks) - width + 1, width))
    r["window"] = width
    r["also"] = {}
    for t in also:
        h = next((e for e in evals if e[2] >= t), None)
        r["also"][t] = (h[0], h[1]) if h else None
    r["other"] = r["clock"] - (r["compute"] + r["select"] + r["comm"] + r["update"] + r["wait"])
    return r


def spread(values, fmt):
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def fmt_ms(seconds):
    return f"{seconds * 1e3:.1f}"


def fmt_mb(b):
    return f"{b / 1e6:.2f}"


def target_cell(runs, field, fmt, unreached=None):
    reached = [r[field] for r in runs if r[field] is not None]
    if not reached:
        return unreached or f"not reached (best {max(r['best'] for r in runs):.4f})"
    cell = spread(reached, fmt)
    if len(reached) < len(runs):
        cell += f" ({len(reached)}/{len(runs)} reached)"
    return cell


def ratio_cell(num, den):
    return f"{num / den:.3f}×" if den else ""


def also_cell(runs, t):
    hits = [r["also"][t] for r in runs if r["also"].get(t)]
    if not hits:
        return "—"
    cell = f"{spread([h[0] for h in hits], str)} ({spread([h[1] for h in hits], lambda s: f'{s:.0f}')} s)"
    if len(hits) < len(runs):
        cell += f" ({len(hits)}/{len(runs)} reached)"
    return cell


def figure_table(fig, spec, results, confs, target, also=()):
    lines = [f"### {spec['title']}", ""]
    missing = [k for k, _ in spec["rows"] if not results.get(k)]
    if missing:
        lines += [f"Missing or failed runs: {', '.join(missing)}.", ""]
    ref = spec.get("ref")
    ref_bytes = statistics.median(r["bytes_per_clock"] for r in results[ref]) if results.get(ref) else None
    ref_label = dict(spec["rows"]).get(ref, ref)
    lines += [
        f"| setting | clocks to {target} | seconds to {target} | "
        + "".join(f"clocks (s) to {t:.2f} | " for t in also)
        + "final acc. | best acc. "
        f"| MB/clock | {'vs ' + ref_label if ref else 'vs no failures'} | msgs/clock | clock ms | clock ms, fastest window "
        "| compute / select / comm / update / wait / other ms | max clock gap |",
        "|---|---:|---:|" + "---:|" * len(also) + "---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, label in spec["rows"]:
        runs = results.get(key)
        if not runs:
            lines.append(f"| {label} | failed |" + " |" * (10 + len(also)))
            continue
        bpc = [r["bytes_per_clock"] for r in runs]
        if ref:
            vs = ratio_cell(statistics.median(bpc), ref_bytes)
        else:
            base = results.get(spec["baseline"][key])
            vs = ratio_cell(statistics.median(bpc), statistics.median(r["bytes_per_clock"] for r in base)) if base else ""
        split = " / ".join(fmt_ms(statistics.median(r[k] for r in runs))
                           for k in ("compute", "select", "comm", "update", "wait", "other"))
        lines.append(
            f"| {label} | {target_cell(runs, 'to_target_clock', str)} "
            f"| {target_cell(runs, 'to_target_seconds', lambda s: f'{s:.1f}', '—')} "
            + "".join(f"| {also_cell(runs, t)} " for t in also)
            + f"| {spread([r['final'] for r in runs], lambda a: f'{a:.4f}')} "
            f"| {spread([r['best'] for r in runs], lambda a: f'{a:.4f}')} "
            f"| {spread(bpc, fmt_mb)} | {vs} "
            f"| {spread([r['messages_per_clock'] for r in runs], lambda m: f'{m:.1f}')} "
            f"| {spread([r['clock'] for r in runs], fmt_ms)} | {spread([r['clock_best'] for r in runs], fmt_ms)} "
            f"| {split} "
            f"| {max(r['max_gap'] for r in runs)} |")
    lines.append("")
    loads = "; ".join(f"{label}: {', '.join(r['load'] for r in results[key])}"
                      for key, label in spec["rows"] if results.get(key))
    if loads:
        ranks = next(r["ranks"] for key, _ in spec["rows"] for r in results.get(key) or [])
        lines.append(f"1-min load average at the end of each run ({os.cpu_count()} cores, {ranks} own ranks; "
                     f"more means other work shared the cores): {loads}.")
        lines.append("")
    lines.append("Flags: " + "; ".join(f"{label}: `{confs.get(key, '?')}`" for key, label in spec["rows"]) + ".")
    if fig == "fig12":
        lines += [""] + failure_table(spec, results, target, also)
    return lines


def failure_table(spec, results, target, also=()):
    """The paper's Figure 12: relative increase of convergence time under failures."""
    lines = [
        "Relative increase of convergence time with 10% of the links broken, against the same schedule "
        "without failures (the Figure 11 runs), to the target accuracy and to the lower ones:",
        "",
        "| schedule | accuracy | clocks, no failures → failures | increase | seconds, no failures → failures "
        "| increase |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def reached(runs, t):
        """(clock, seconds) medians to accuracy t, None unless every run reached it."""
        if t == target:
            hits = [(r["to_target_clock"], r["to_target_seconds"]) if r["to_target_clock"] is not None else None
                    for r in runs]
        else:
            hits = [r["also"].get(t) for r in runs]
        if any(h is None for h in hits):
            return None
        return statistics.median(h[0] for h in hits), statistics.median(h[1] for h in hits)

    finals = []
    for key, _ in spec["rows"]:
        drop, base = results.get(key), results.get(spec["baseline"][key])
        if not drop or not base:
            lines.append(f"| {SCHEDULE[key]} | | missing run | | | |")
            continue
        for t in sorted(set(also) | {target}):
            b, d = reached(base, t), reached(drop, t)
            cells = []
            for i, fmt in ((0, lambda v: f"{v:.0f}"), (1, lambda v: f"{v:.1f}")):
                cells.append(f"{fmt(b[i]) if b else 'not reached'} → {fmt(d[i]) if d else 'not reached'}")
                cells.append(f"{(d[i] / b[i] - 1) * 100:+.0f}%" if b and d else "n/a")
            lines.append(f"| {SCHEDULE[key]} | {t:.2f} | {' | '.join(cells)} |")
        fb = statistics.median(r["final"] for r in base)
        fd = statistics.median(r["final"] for r in drop)
        finals.append(f"{SCHEDULE[key]} {fb:.4f} → {fd:.4f}")
    lines += ["", "Final test accuracy, no failures → failures: " + "; ".join(finals) + ". "
              "Fixed and ring skip a broken link (fewer messages per clock); random draws further peers until it "
              "has Q intact ones (comm/schedule.cc), so it keeps its message count."]
    return lines


def plot(fig, spec, results, png_path, target):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_comm_codesign: matplotlib missing, no PNGs", file=sys.stderr)
        return False
    series = [(key, label, "-") for key, label in spec["rows"]]
    if fig == "fig12":
        series += [(spec["baseline"][key], f"{SCHEDULE[key]}, no failures", "--") for key, _ in spec["rows"]]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figure, (by_clock, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    lowest = 1.0
    for i, (key, label, style) in enumerate(series):
        colour = colours[i % len(spec["rows"]) % len(colours)]
        for rep, r in enumerate(results.get(key) or []):
            clocks = [e[0] for e in r["evals"]]
            seconds = [e[1] for e in r["evals"]]
            acc = [e[2] for e in r["evals"]]
            lowest = min([lowest] + acc)
            kw = dict(color=colour, linestyle=style, marker="." if style == "-" else None,
                      alpha=1.0 if rep == 0 else 0.4, label=label if rep == 0 else None)
            by_clock.plot(clocks, acc, **kw)
            by_time.plot(seconds, acc, **kw)
    for ax, xlabel in ((by_clock, "clock"), (by_time, "training seconds (eval excluded)")):
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(max(0.0, min(lowest, target) - 0.02), None)
        ax.grid(True, alpha=0.3)
    by_clock.legend(fontsize=8, loc="lower right")
    figure.suptitle(spec["title"], fontsize=10)
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--raw", required=True, help="directory of KEY__REP.jsonl metrics files")
    parser.add_argument("--reps", type=int, default=1, help="read reps 1..N of every configuration")
    parser.add_argument("--target", type=float, default=0.85, help="target test accuracy")
    parser.add_argument("--also-target", type=float, action="append", default=None,
                        help="a lower accuracy also reported as clocks (seconds) to reach it; default 0.80 and 0.83")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=FLAGS", help="a configuration")
    parser.add_argument("--fig", action="append", default=[], choices=sorted(FIGURES), help="a figure to report")
    parser.add_argument("--header", action="append", default=[], metavar="KEY=VALUE",
                        help="a line of the header, in order")
    parser.add_argument("--out", help="also write the markdown here")
    parser.add_argument("--png-dir", help="write one PNG per figure here")
    args = parser.parse_args()

    also = [0.80, 0.83] if args.also_target is None else sorted(args.also_target)
    confs = dict(item.split("=", 1) for item in args.conf)
    results = {}
    for key in confs:
        runs = []
        for rep in range(1, args.reps + 1):
            path = os.path.join(args.raw, f"{key}__{rep}.jsonl")
            r = analyse(path, args.target, also) if os.path.exists(path) else None
            if r is None:
                print(f"plot_comm_codesign: {path} missing or incomplete (the run failed?)", file=sys.stderr)
            else:
                runs.append(r)
        results[key] = runs
        for rep, r in enumerate(runs, 1):
            load = os.path.join(args.raw, f"{key}__{rep}.load")
            r["load"] = open(load).read().strip() if os.path.exists(load) else "?"

    figs = args.fig or sorted(FIGURES, key=lambda f: int(f[3:]))
    lines = ["## Communication co-design: Orpheus paper Figures 9–12 (MLP, Fashion-MNIST)", ""]
    for item in args.header:
        key, _, value = item.partition("=")
        lines.append(f"- **{key}:** {value}")
    lines += [
        "",
        f"Columns: clocks / seconds to {args.target}: the first eval clock whose test accuracy is ≥ {args.target}, "
        "and the `seconds` (training time of rank 0, evaluation excluded) at that clock; the same for lower "
        f"accuracies ({', '.join(f'{t:.2f}' for t in also)}), which more settings reach and where the curves are steeper. Final acc.: the test "
        "accuracy after the last clock (summary line); best acc.: the best eval. MB/clock: bytes all ranks send "
        "per clock (summary `bytes_per_clock`), with its ratio to the figure's reference. Clock ms: mean over "
        "clocks of `clock_seconds` (mean over ranks); fastest window: the lowest mean over consecutive windows of "
        "100 clocks (a tenth of the run when shorter), less skewed by other work on the cores, which inflates every "
        "time and seconds column of a run whose load average exceeds its rank count; the split is the means of the phase times: compute "
        "(forward/backward and SV identification), select (JMCSS), comm (encode and send, and under SSP also "
        "applying the batches that arrived meanwhile), update (own batch), wait (blocked on the staleness bound), "
        "other (the rest: batch fetch, bookkeeping). Max clock gap: the largest spread of clocks between ranks.",
        "",
    ]
    for fig in figs:
        spec = FIGURES[fig]
        lines += figure_table(fig, spec, results, confs, args.target, also)
        if args.png_dir and any(results.get(k) for k, _ in spec["rows"]):
            png = os.path.join(args.png_dir, spec["png"])
            if plot(fig, spec, results, png, args.target):
                lines += ["", f"![{spec['title']}]({spec['png']})"]
        lines.append("")
    text = "\n".join(lines)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
