#!/usr/bin/python3
"""Helpers of table3.sh (the Orpheus paper's Table 3 on Fashion-MNIST, MLP).

  table3.py divergence --compare BIN --dir DIR --ranks P --out JSON
      Divergence of the final replicas DIR/replica-<r>.h5 (written by --save-replicas),
      from `compare_params A B RTOL`, which prints ||A - B||_F / ||B||_F over all
      parameters. It is run for every ordered pair (r, s), r != s, and gives:
        proxy_mean / proxy_max: mean / max over r = 1..P-1 of ||W_r - W_0|| / ||W_0||
          (the difference of each replica from replica 0; replica 0 itself, 0 by
          definition, is left out of the mean);
        div_mean / div_max: mean / max over r of ||W_r - W̄|| / ||W̄|| with W̄ the mean
          replica -- the same quantity as the engine's divergence_mean / divergence_max
          at an averaging clock. It is derived from the pairwise differences alone:
          ||W_r|| / ||W_0|| = d(r,0) / d(0,r), ||W_r - W_s|| = d(r,s) ||W_s||, then
          ||W_r - W̄||² = (1/P) Σ_s ||W_r - W_s||² - (1/2P²) Σ_{s,t} ||W_s - W_t||² and
          ||W̄||² = (1/P²) Σ_{s,t} <W_s, W_t>, <W_s, W_t> = (||W_s||² + ||W_t||² - ||W_s - W_t||²) / 2.
          compare_params prints 4 significant digits, so this is good to ~0.1%.

  table3.py report --raw DIR --reps N --target A --conf KEY=FLAGS ... --header KEY=VALUE ...
      Markdown tables (printed, and written to --out) and a PNG (--png) of test
      accuracy against training seconds and against clocks, from DIR/KEY__REP.jsonl
      (the JSON lines of `orpheus train --metrics`) and DIR/KEY__REP.divergence.json.

Standard library plus matplotlib (optional: without it, no PNG).
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys

from bench_metrics import read_metrics

# key -> (paper's name of the system, what the row adds), paper's Table 3 MLR hours (34 machines).
ROWS = [
    ("r1", "Matrix+PS → dense allreduce", "dense gradients, allreduce", 7.1),
    ("r2", "SVB", "SV broadcast, BSP", 2.7),
    ("r3", "SVB+SVS", "+ SV selection C = 25 of 100", 2.3),
    ("r4", "SVB+SVS+RM", "+ random multicast Q = 3, SSP s = 4", 2.1),
    ("r5", "SVB+SVS+RM+PCS", "+ averaging every 50 clocks", 2.0),
    ("r6", "SVB+SVS+RM+PCS+PRR", "+ rotation every 25 clocks", 1.9),
]


# A run whose slowest 100-clock segment is this much slower than its median segment is
# flagged: other work on the machine probably slowed it down for a while.
DISTURBED = 1.25


# --- divergence of the final replicas ----------------------------------------------------

def compare(binary, a, b):
    out = subprocess.run([binary, a, b, "1e30"], capture_output=True, text=True)
    m = re.search(r"relative Frobenius difference\s+([-+0-9.eE]+|nan|inf)", out.stdout)
    if out.returncode not in (0, 1) or not m:
        raise RuntimeError(f"compare_params {a} {b} failed ({out.returncode}): {out.stdout}{out.stderr}")
    return float(m.group(1))


def divergence(args):
    p = args.ranks
    files = [os.path.join(args.dir, f"replica-{r}.h5") for r in range(p)]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise SystemExit(f"table3.py: missing {', '.join(missing)}")
    d = [[0.0] * p for _ in range(p)]  # d[r][s] = ||W_r - W_s|| / ||W_s||
    for r in range(p):
        for s in range(p):
            if r != s:
                d[r][s] = compare(args.compare, files[r], files[s])
    # Norms in units of ||W_0||.
    n = [1.0] + [d[r][0] / d[0][r] if d[0][r] > 0 else 1.0 for r in range(1, p)]
    dist = [[0.5 * (d[r][s] * n[s] + d[s][r] * n[r]) for s in range(p)] for r in range(p)]
    total = sum(dist[s][t] ** 2 for s in range(p) for t in range(p))
    mean_norm2 = sum((n[s] ** 2 + n[t] ** 2 - dist[s][t] ** 2) / 2 for s in range(p) for t in range(p)) / p ** 2
    div = []
    for r in range(p):
        sq = sum(dist[r][s] ** 2 for s in range(p)) / p - total / (2 * p ** 2)
        div.append(math.sqrt(max(0.0, sq)) / math.sqrt(mean_norm2))
    proxy = [d[r][0] for r in range(1, p)]
    result = {
        "ranks": p,
        "proxy_mean": statistics.fmean(proxy),
        "proxy_max": max(proxy),
        "div_mean": statistics.fmean(div),
        "div_max": max(div),
        "div": div,
        "pairwise": d,
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
        f.write("\n")


# --- report ----------------------------------------------------------------------------



def analyse(path, target):
    clocks, summary = read_metrics(path)
    if summary is None or not clocks:
        return None
    evals = [(c["clock"], c["seconds"], c["test_accuracy"]) for c in clocks if "test_accuracy" in c]
    hit = next((e for e in evals if e[2] >= target), None)
    mean = lambda rows, field: statistics.fmean(c[field] for c in rows) if rows else float("nan")  # noqa: E731
    averaged = [c for c in clocks if c.get("averaged")]
    coordinated = [c for c in clocks if c.get("averaged") or c.get("rotated")]
    plain = [c for c in clocks if not (c.get("averaged") or c.get("rotated"))]
    r = {
        "evals": evals,
        "to_target_clock": hit[0] if hit else None,
        "to_target_seconds": hit[1] if hit else None,
        "final": summary.get("test_accuracy", evals[-1][2] if evals else float("nan")),
        "best": max((e[2] for e in evals), default=float("nan")),
        "bytes_per_clock": summary["bytes_per_clock"],
        "messages_per_clock": summary["messages"] / max(1, summary["clocks"]),
        "seconds": summary["seconds"],
        "clock": mean(clocks, "clock_seconds"),
        "clock_plain": mean(plain, "clock_seconds"),
        "clock_coord": mean(coordinated, "clock_seconds") if coordinated else None,
        "compute": mean(clocks, "compute_seconds") - mean(clocks, "select_seconds"),
        "select": mean(clocks, "select_seconds"),
        "comm": mean(clocks, "comm_seconds"),
        "update": mean(clocks, "update_seconds"),
        "wait": mean(clocks, "wait_seconds"),
        "max_gap": summary.get("max_clock_gap", 0),
        "averages": [(c["clock"], c["divergence_mean"], c["divergence_max"]) for c in averaged],
        "final_div": None,
    }
    r["other"] = r["clock"] - (r["compute"] + r["select"] + r["comm"] + r["update"] + r["wait"])
    # Pace of 100-clock segments (plain clocks only; the first segment, with start-up, left
    # out): a segment much slower than the others means other work shared the cores then.
    segments = []
    for begin in range(100, len(clocks), 100):
        seg = [c["clock_seconds"] for c in clocks[begin:begin + 100]
               if not (c.get("averaged") or c.get("rotated"))]
        if len(seg) >= 50:
            segments.append(statistics.fmean(seg))
    r["seg_min"] = min(segments) if segments else None
    r["seg_max"] = max(segments) if segments else None
    r["seg_median"] = statistics.median(segments) if segments else None
    r["disturbed"] = bool(segments) and r["seg_max"] > DISTURBED * r["seg_median"]
    r["load"] = ""
    log_path = path[: -len(".jsonl")] + ".log"
    if os.path.exists(log_path):
        with open(log_path) as f:
            loads = re.findall(r"load average (before|after): ([0-9.]+)", f.read())
        r["load"] = " → ".join(v for _, v in loads)
    div_path = path[: -len(".jsonl")] + ".divergence.json"
    if os.path.exists(div_path):
        with open(div_path) as f:
            r["final_div"] = json.load(f)
    return r


def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def target_cell(runs, field, fmt):
    reached = [r[field] for r in runs if r[field] is not None]
    if not reached:
        return f"not reached (best {max(r['best'] for r in runs):.4f})"
    cell = spread(reached, fmt)
    if len(reached) < len(runs):
        cell += f" ({len(reached)}/{len(runs)} reached)"
    return cell


def fmt_ms(seconds):
    return f"{seconds * 1e3:.0f}"


def fmt_div(x):
    return f"{x:.2e}"


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def report(args):
    confs = dict(item.split("=", 1) for item in args.conf)
    results = {}
    for key in confs:
        runs = []
        for rep in range(1, args.reps + 1):
            path = os.path.join(args.raw, f"{key}__{rep}.jsonl")
            r = analyse(path, args.target) if os.path.exists(path) else None
            if r is None:
                print(f"table3.py: {path} missing or incomplete (the run failed?)", file=sys.stderr)
            else:
                runs.append(r)
        results[key] = runs
    t = args.target
    ref_time = median_or_none([r["to_target_seconds"] for r in results.get("r1", [])])

    lines = ["## Orpheus paper Table 3: convergence as techniques are added (MLP, Fashion-MNIST)", ""]
    for item in args.header:
        key, _, value = item.partition("=")
        lines.append(f"- **{key}:** {value}")
    lines += ["", f"### Convergence to test accuracy {t}", ""]
    lines += [
        f"| # | system | adds | clocks to {t} | seconds to {t} | speed-up vs #1 | final acc. | best acc. "
        "| MB/clock | mean clock ms | divergence at averaging clocks, mean (max) "
        "| final replicas: mean ‖W_r − W_0‖/‖W_0‖ | paper, MLR (h) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, system, adds, paper in ROWS:
        runs = results.get(key)
        if not runs:
            lines.append(f"| {key[1:]} | {system} | {adds} | failed | | | | | | | | | {paper} |")
            continue
        secs = median_or_none([r["to_target_seconds"] for r in runs])
        speedup = f"{ref_time / secs:.2f}×" if ref_time and secs else "—"
        if any(r["averages"] for r in runs):
            avg_div = spread([statistics.fmean(a[1] for a in r["averages"]) for r in runs if r["averages"]], fmt_div)
            avg_div += " (" + spread([max(a[2] for a in r["averages"]) for r in runs if r["averages"]], fmt_div) + ")"
        else:
            avg_div = "— (no averaging)"
        proxy = spread([r["final_div"]["proxy_mean"] if r["final_div"] else None for r in runs], fmt_div)
        lines.append(
            f"| {key[1:]} | {system} | {adds} "
            f"| {target_cell(runs, 'to_target_clock', str)} "
            f"| {target_cell(runs, 'to_target_seconds', lambda s: f'{s:.1f}')} | {speedup} "
            f"| {spread([r['final'] for r in runs], lambda a: f'{a:.4f}')} "
            f"| {spread([r['best'] for r in runs], lambda a: f'{a:.4f}')} "
            f"| {spread([r['bytes_per_clock'] for r in runs], lambda b: f'{b / 1e6:.2f}')} "
            f"| {spread([r['clock'] for r in runs], fmt_ms)}{' †' if any(r['disturbed'] for r in runs) else ''} "
            f"| {avg_div} | {proxy} | {paper} |")
    lines.append("")
    lines.append("Flags on top of the common ones: " +
                 "; ".join(f"#{key[1:]} `{confs.get(key, '?')}`" for key, *_ in ROWS) + ".")
    lines += [
        "",
        f"Clocks / seconds to {t}: the first eval clock (every {args.eval_every}) with test accuracy ≥ {t}, and the "
        "`seconds` at that clock (rank 0's training time, evaluation excluded, averaging and rotation included); "
        f"the resolution is therefore {args.eval_every} clocks. Speed-up: seconds to target of #1 over this row's "
        "(the paper's Table 3 reports hours to convergence of MLR on 34 machines; its numbers are shown for the "
        "trend only). Final acc.: after the last clock (summary line); best acc.: the best eval. MB/clock: bytes "
        "sent by all ranks together per clock (summary `bytes_per_clock`). Mean clock ms: mean of "
        "`clock_seconds` over all clocks (each clock's value is the mean over ranks). † : the run was slowed down "
        f"for part of its clocks (a 100-clock segment more than {DISTURBED:.2f}× slower than the run's median segment; "
        "see the split table), most likely by other work on the machine, so its times are inflated.",
        "",
        "Test accuracy is the sum over ranks of each rank's replica scored on its own test shard. Evaluation "
        "runs after the clock's averaging, so in #5 and #6 (eval every 50 = average every 50) every eval scores "
        "the freshly averaged model, identical on all ranks, while in #1–#4 it scores 8 replicas that may differ "
        "(in #1–#3 they are kept identical or nearly so by BSP and broadcast/allreduce).",
        "",
    ]

    # Divergence details.
    first_avg = min((r["averages"][0][0] for runs in results.values() for r in runs if r["averages"]), default="—")
    last_avg = max((r["averages"][-1][0] for runs in results.values() for r in runs if r["averages"]), default="—")
    lines += [
        "### Replica divergence",
        "",
        f"| # | system | at first average (clock {first_avg}) | mean over averaging clocks | at last average "
        f"(clock {last_avg}) | max divergence_max | final replicas: "
        "mean (max) ‖W_r − W_0‖/‖W_0‖ | final replicas: mean (max) ‖W_r − W̄‖/‖W̄‖ |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, system, _, _ in ROWS:
        runs = results.get(key) or []
        with_avg = [r for r in runs if r["averages"]]
        if with_avg:
            first = spread([r["averages"][0][1] for r in with_avg], fmt_div)
            meanv = spread([statistics.fmean(a[1] for a in r["averages"]) for r in with_avg], fmt_div)
            last = spread([r["averages"][-1][1] for r in with_avg], fmt_div)
            maxv = spread([max(a[2] for a in r["averages"]) for r in with_avg], fmt_div)
        else:
            first = meanv = last = maxv = "—"
        fd = [r["final_div"] for r in runs if r["final_div"]]
        proxy = (spread([f["proxy_mean"] for f in fd], fmt_div) + " (" + spread([f["proxy_max"] for f in fd], fmt_div)
                 + ")") if fd else "—"
        exact = (spread([f["div_mean"] for f in fd], fmt_div) + " (" + spread([f["div_max"] for f in fd], fmt_div)
                 + ")") if fd else "—"
        lines.append(f"| {key[1:]} | {system} | {first} | {meanv} | {last} | {maxv} | {proxy} | {exact} |")
    lines += [
        "",
        "What each number measures:",
        "",
        "- *At averaging clocks* (#5, #6 only): the engine's `divergence_mean` / `divergence_max`, i.e. mean / max "
        "over the 8 replicas of ‖W_r − W̄‖_F/‖W̄‖_F (all parameters together) computed at the PCS barrier just "
        "before the replicas are replaced by their mean W̄. Since the previous average made them identical, it is "
        "the divergence accumulated over the last 50 clocks only (at the first average: over all clocks from the common "
        "initialisation, during which #4, #5 and #6 are the same configuration). In #6 rotation moves replicas between "
        "ranks in between, which does not change this quantity directly, only what each replica is trained on.",
        "- *Final replicas, ‖W_r − W_0‖/‖W_0‖* (the proxy asked for): every rank saves the replica it holds after "
        "the last clock (`--save-replicas`), and `compare_params replica-r.h5 replica-0.h5` gives the relative "
        "Frobenius difference of replica r from replica 0; the mean is over r = 1…7. It is a distance to one "
        "replica, not to the mean, so it is larger than ‖W_r − W̄‖/‖W̄‖ (about √2× for independent, similar "
        "deviations). In #4 it is the divergence accumulated over all the clocks, since nothing ever pulls the "
        "replicas together. In #5 and #6 the last clock is itself an averaging clock "
        "(the clock count is a multiple of 50), so the final replicas are identical and this proxy is 0 by construction: it says nothing about PCS/PRR there; use the "
        "'at averaging clocks' columns.",
        "- *Final replicas, ‖W_r − W̄‖/‖W̄‖*: the same definition as the engine's `divergence_mean`, derived "
        "exactly (to compare_params' 4 printed digits) from all 56 ordered pairwise `compare_params` differences "
        "(see table3.py), so #4's end state can be compared with the in-run numbers of #5 and #6, keeping in mind "
        "it accumulated over the whole run rather than over 50 clocks.",
        "",
    ]

    # Clock time split.
    lines += [
        "### Mean clock time split (ms)",
        "",
        "| # | system | clock | plain clocks | averaging/rotation clocks | compute | select | comm | update | wait "
        "| other | msgs/clock | max clock gap | 100-clock segments: fastest / median / slowest | 1-min load before → after |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, system, _, _ in ROWS:
        runs = results.get(key) or []
        if not runs:
            lines.append(f"| {key[1:]} | {system} | failed | | | | | | | | | | | | |")
            continue
        cells = [spread([r[k] for r in runs], fmt_ms)
                 for k in ("clock", "clock_plain", "clock_coord", "compute", "select", "comm", "update", "wait",
                           "other")]
        lines.append(f"| {key[1:]} | {system} | {' | '.join(cells)} "
                     f"| {spread([r['messages_per_clock'] for r in runs], lambda m: f'{m:.1f}')} "
                     f"| {max(r['max_gap'] for r in runs)} "
                     f"| {' / '.join(spread([r[k] for r in runs], fmt_ms) for k in ('seg_min', 'seg_median', 'seg_max'))}"
                     f"{' †' if any(r['disturbed'] for r in runs) else ''} "
                     f"| {'; '.join(r['load'] for r in runs)} |")
    lines += [
        "",
        "Phases (means over clocks of the per-rank means): compute (forward/backward and SV identification), "
        "select (JMCSS), comm (encode and send; under SSP also applying the batches that arrived meanwhile), "
        "update (own batch), wait (blocked on the staleness bound or on BSP), other (the rest, including the "
        "averaging allreduce and the rotation at coordination clocks). Max clock gap: the largest spread of "
        "clocks between ranks. 100-clock segments: mean time of the plain clocks of clocks 101–200, 201–300, …; "
        "the fastest segment is the best estimate of an undisturbed run's pace. Load: the 1-minute load average "
        "just before and after the run (the run itself puts 8 ranks on the cores).",
        "",
    ]

    if args.png and any(results.values()) and plot(results, args.png, t):
        lines += [f"![test accuracy against training seconds and clocks]({os.path.basename(args.png)})", ""]
    text = "\n".join(lines)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


def plot(results, png_path, target):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("table3.py: matplotlib missing, no PNG", file=sys.stderr)
        return False
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figure, (by_time, by_clock) = plt.subplots(1, 2, figsize=(13, 5))
    lowest = 1.0
    for i, (key, system, _, _) in enumerate(ROWS):
        for rep, r in enumerate(results.get(key) or []):
            clocks = [e[0] for e in r["evals"]]
            seconds = [e[1] for e in r["evals"]]
            acc = [e[2] for e in r["evals"]]
            lowest = min([lowest] + acc)
            kw = dict(color=colours[i % len(colours)], marker=".", alpha=1.0 if rep == 0 else 0.4,
                      label=f"#{key[1:]} {system}" if rep == 0 else None)
            by_time.plot(seconds, acc, **kw)
            by_clock.plot(clocks, acc, **kw)
    for ax, xlabel in ((by_time, "training seconds (evaluation excluded)"), (by_clock, "clock")):
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(max(0.0, min(lowest, target) - 0.02), None)
        ax.grid(True, alpha=0.3)
    by_time.legend(fontsize=8, loc="lower right")
    figure.suptitle("Orpheus Table 3 on Fashion-MNIST (MLP 784-1024-1024-10, np 8): test accuracy", fontsize=10)
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("divergence", help="divergence of the final replicas of one run")
    d.add_argument("--compare", required=True, help="the compare_params binary")
    d.add_argument("--dir", required=True, help="directory of replica-<r>.h5")
    d.add_argument("--ranks", type=int, required=True)
    d.add_argument("--out", required=True, help="JSON file to write")
    r = sub.add_parser("report", help="markdown tables and the PNG")
    r.add_argument("--raw", required=True, help="directory of KEY__REP.jsonl and KEY__REP.divergence.json")
    r.add_argument("--reps", type=int, default=1, help="read reps 1..N of every configuration")
    r.add_argument("--target", type=float, default=0.85, help="target test accuracy")
    r.add_argument("--eval-every", type=int, default=50, help="the runs' --eval-every (for the notes)")
    r.add_argument("--conf", action="append", default=[], metavar="KEY=FLAGS", help="a configuration")
    r.add_argument("--header", action="append", default=[], metavar="KEY=VALUE", help="a header line, in order")
    r.add_argument("--out", help="also write the markdown here")
    r.add_argument("--png", help="write the PNG here")
    args = parser.parse_args()
    if args.command == "divergence":
        divergence(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
