#!/usr/bin/python3
"""Summarises the runs of sv_vs_dense.sh as markdown tables.

Inputs: a directory of metrics files named WORKLOAD__SYNC__REP.jsonl (the JSON
lines `orpheus train --metrics` writes: one per clock, then a summary line), the
JSON lines of orpheus_bench_rebuild, and the header facts as KEY=VALUE arguments.
Standard library only, so it runs with the system's Python.
"""

import argparse
import json
import os
import statistics
import sys

import bench_metrics

SV_HEADER_BYTES = 64
SV_MATRIX_ENTRY_BYTES = 32
FLOAT_BYTES = 4


def read_metrics(path):
    clocks, summary = bench_metrics.read_metrics(path)
    if summary is None:
        sys.exit(f"summarize: {path} has no summary line (did the run fail?)")
    return clocks, summary


def parse_model(spec):
    """'mlr features=K classes=J' -> (J, K): W is J x K."""
    fields = dict(part.split("=", 1) for part in spec.split()[1:] if "=" in part)
    return int(fields["classes"]), int(fields["features"])


def analytic_bytes(sync, rows, cols, n, ranks):
    """Bytes all ranks send in one clock, as the transport counts them."""
    if sync == "sv":
        # One dense-V matrix per batch; the bias rides on U and adds nothing to the wire.
        per_batch = (SV_HEADER_BYTES + SV_MATRIX_ENTRY_BYTES + FLOAT_BYTES * n
                     + FLOAT_BYTES * rows * n + FLOAT_BYTES * cols * n)
        return per_batch * (ranks - 1) * ranks
    params = rows * cols + rows  # W and its bias
    return 2 * (ranks - 1) / ranks * FLOAT_BYTES * params * ranks


def fmt_ms(seconds):
    ms = seconds * 1e3
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def fmt_bytes(b):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def table_a(runs_dir, warmup, labels):
    runs = {}
    for name in sorted(os.listdir(runs_dir)):
        if not name.endswith(".jsonl"):
            continue
        workload, sync, rep = name[: -len(".jsonl")].split("__")
        clocks, summary = read_metrics(os.path.join(runs_dir, name))
        timed = [c for c in clocks if c["clock"] > warmup]
        if not timed:
            sys.exit(f"summarize: {name} has no clocks after the {warmup} warm-up clocks")
        runs.setdefault(workload, {}).setdefault(sync, []).append({
            "rep": int(rep),
            "clock": statistics.median(c["clock_seconds"] for c in timed),
            "compute": statistics.median(c["compute_seconds"] for c in timed),
            "comm": statistics.median(c["comm_seconds"] for c in timed),
            "update": statistics.median(c["update_seconds"] for c in timed),
            "clocks": len(timed),
            "summary": summary,
        })

    lines = [
        "| workload | sync | time/clock ms, median | min–max over reps | compute / comm / update ms "
        "| bytes/clock measured | bytes/clock analytic | measured/analytic |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for workload in labels:
        if workload not in runs:
            continue
        by_sync = runs[workload]
        medians = {}
        bytes_per_clock = {}
        for sync in ("sv", "dense"):
            reps = by_sync.get(sync)
            if not reps:
                continue
            s = reps[0]["summary"]
            rows, cols = parse_model(s["model"])
            measured = {r["summary"]["bytes_per_clock"] for r in reps}
            if len(measured) != 1:
                print(f"summarize: {workload} {sync}: bytes per clock differ between reps: {sorted(measured)}",
                      file=sys.stderr)
            measured_bytes = statistics.median(r["summary"]["bytes_per_clock"] for r in reps)
            expected = analytic_bytes(sync, rows, cols, s["batch_per_rank"], s["ranks"])
            per_rep = [r["clock"] for r in reps]
            medians[sync] = statistics.median(per_rep)
            bytes_per_clock[sync] = measured_bytes
            split = " / ".join(fmt_ms(statistics.median(r[k] for r in reps)) for k in ("compute", "comm", "update"))
            lines.append(
                f"| {labels[workload]} | {sync} | {fmt_ms(medians[sync])} "
                f"| {fmt_ms(min(per_rep))}–{fmt_ms(max(per_rep))} | {split} "
                f"| {measured_bytes:,.0f} ({fmt_bytes(measured_bytes)}) | {expected:,.0f} "
                f"| {measured_bytes / expected:.4f} |")
        if "sv" in medians and "dense" in medians:
            lines.append(
                f"| {labels[workload]} | **sv/dense** | **{medians['sv'] / medians['dense']:.2f}×** | | "
                f"| **{bytes_per_clock['sv'] / bytes_per_clock['dense']:.3g}×** | | |")
    reps = max((len(v) for w in runs.values() for v in w.values()), default=0)
    timed = sorted({r["clocks"] for w in runs.values() for v in w.values() for r in v})
    lines.append("")
    lines.append(
        f"Time per clock: `clock_seconds` (mean over ranks) of clocks after the first {warmup}, "
        f"median per run ({'/'.join(map(str, timed))} clocks), then median and min–max over {reps} runs per "
        "configuration; compute / comm / update are the medians of the per-clock phase times. Bytes per clock "
        "from the summary line: sent by all ranks together. Analytic: sv = (64 + 32 + 4n + 4Jn + 4Kn)(P−1)P, "
        "dense = 2(P−1)/P · 4 · (JK + J) · P.")
    return lines


def table_b(bench_path):
    info, peak, rows = {}, None, []
    with open(bench_path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            if record["kind"] == "info":
                info = record
            elif record["kind"] == "peak":
                peak = record
            else:
                rows.append(record)
    if peak is None:
        sys.exit(f"summarize: {bench_path} has no peak measurement")

    def spread(r):
        # Rate at the slowest and fastest sample.
        return f"{r['flops'] / r['max_seconds'] / 1e9:.1f}–{r['flops'] / r['min_seconds'] / 1e9:.1f}"

    lines = [
        "| measurement | shape (J×K, columns) | median time | GFLOP/s, median | min–max | ratio to peak "
        "| ratio to same-shape GEMM |",
        "|---|---|---:|---:|---:|---:|---:|",
        f"| single-core sgemm peak (Eigen → OpenBLAS) | {peak['shape']} | {fmt_ms(peak['median_seconds'])} ms "
        f"| {peak['gflops']:.1f} | {spread(peak)} | 1.00 | |",
    ]
    gemm = {r["shape"]: r for r in rows if r["kind"] == "gemm"}
    for r in rows:
        if r["kind"] != "rebuild":
            continue
        shape = f"{r['shape']}, {r['columns']} = {r['batches']}×{r['columns'] // r['batches']}"
        g = gemm.get(r["shape"])
        if g:
            lines.append(
                f"| plain GEMM W += U Vᵀ, same shape | {shape} | {fmt_ms(g['median_seconds'])} ms "
                f"| {g['gflops']:.1f} | {spread(g)} | {g['gflops'] / peak['gflops']:.2f} | 1.00 |")
        ratio = r["gflops"] / peak["gflops"]
        goal = ""
        if r["rows"] >= 1024 and r["cols"] >= 1024:
            goal = " ✅ (goal ≥ 0.6)" if ratio >= 0.6 else " ❌ (goal ≥ 0.6)"
        vs_gemm = f"{r['gflops'] / g['gflops']:.2f}" if g else ""
        lines.append(
            f"| **rebuild** `applySvBatches`, {r['batches']} batches | {shape} | {fmt_ms(r['median_seconds'])} ms "
            f"| {r['gflops']:.1f} | {spread(r)} | **{ratio:.2f}**{goal} | {vs_gemm} |")
    lines.append("")
    lines.append(
        f"GFLOP/s = 2·J·K·columns / time, one BLAS thread ({info.get('blas', 'unknown BLAS')}); the rebuild's "
        "U·diag(c) scaling, column concatenation and bias update count as overhead. Median over "
        f"{peak['samples']} samples per measurement, taken round-robin across the measurements; min–max is the "
        "rate at the slowest and fastest sample.")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", required=True, help="directory of WORKLOAD__SYNC__REP.jsonl metrics files")
    parser.add_argument("--bench", required=True, help="output of orpheus_bench_rebuild")
    parser.add_argument("--warmup", type=int, default=5, help="clocks to skip at the start of every run")
    parser.add_argument("--label", action="append", default=[], metavar="WORKLOAD=TEXT",
                        help="table label of a workload, in table order")
    parser.add_argument("--header", action="append", default=[], metavar="KEY=VALUE",
                        help="a line of the header, in order")
    parser.add_argument("--out", help="also write the markdown here")
    args = parser.parse_args()

    labels = dict(item.split("=", 1) for item in args.label)
    lines = ["## SV broadcast vs dense allreduce", ""]
    for item in args.header:
        key, _, value = item.partition("=")
        lines.append(f"- **{key}:** {value}")
    lines += ["", "### (a) Time and bytes per clock", ""]
    lines += table_a(args.runs, args.warmup, labels)
    lines += ["", "### (b) Rebuild GEMM rate vs single-core sgemm", ""]
    lines += table_b(args.bench)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
