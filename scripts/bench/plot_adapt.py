"""The adapt suite's report: time to target per scenario and setting (median [min-max]
over the reps), the ratios of the medians, and the knobs --adapt chose over time against
the link rate (scripts/bench/adapt.sh)."""
import argparse
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CONFIGS = ["defaults", "hand", "adapt"]
RATE_BITS = {"1gbit": 1.0, "10gbit": 10.0}


def load(path):
    if not os.path.exists(path):
        return None
    lines = [json.loads(l) for l in open(path) if l.strip()]
    return {
        "clocks": [l for l in lines if "clock" in l and not l.get("decision") and not l.get("summary")],
        "decisions": [l for l in lines if l.get("decision")],
        "summary": next((l for l in lines if l.get("summary")), {}),
    }


def rates(path):
    if not os.path.exists(path):
        return []
    return [(float(t), RATE_BITS.get(r, 0.0)) for t, r in (l.split() for l in open(path) if l.strip())]


def rep_dirs(raw, reps):
    """RAW/rep1 .. RAW/repN; a RAW without rep folders (one run each) is its own rep."""
    dirs = [os.path.join(raw, f"rep{r}") for r in range(1, reps + 1)]
    dirs = [d for d in dirs if os.path.isdir(d)]
    return dirs or [raw]


def spread(values, fmt):
    if not values:
        return "—"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--scenarios", default="1gbit,10gbit,drop")
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    reps = rep_dirs(args.raw, args.reps)

    rows = ["| scenario | setting | reached | seconds to target | clocks | bytes/clock | adapt / this |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for s in scenarios:
        summaries = {}
        for c in CONFIGS:
            runs = [load(os.path.join(d, s, f"{c}.jsonl")) for d in reps]
            summaries[c] = [r["summary"] for r in runs if r is not None]
        reached = {c: [sm for sm in summaries[c] if sm.get("reached_target") and sm.get("seconds")]
                   for c in CONFIGS}
        adapt_s = statistics.median([sm["seconds"] for sm in reached["adapt"]]) if reached["adapt"] else None
        for c in CONFIGS:
            sms = summaries[c]
            if not sms:
                continue
            ok = reached[c]
            seconds = [sm["seconds"] for sm in ok]
            ratio = f"{adapt_s / statistics.median(seconds):.2f}" if adapt_s and seconds else "—"
            rows.append(f"| {s} | {c} | {len(ok)}/{len(sms)} | {spread(seconds, '{:.1f}')} | "
                        f"{spread([sm['clocks'] for sm in ok if 'clocks' in sm], '{:.0f}')} | "
                        f"{spread([sm['bytes_per_clock'] for sm in sms if 'bytes_per_clock' in sm], '{:.0f}')} | "
                        f"{ratio} |")
    report = [f"# --adapt against hand-tuned and default settings (np {args.np}, MLP-2048, target {args.target})", "",
              f"Median [min-max] over {len(reps)} rep(s), run interleaved; 'reached' counts the reps that reached "
              "the target, and the seconds and clocks are theirs.", "",
              *rows, "",
              "Ratios (of the medians) below 1 mean --adapt reached the target sooner. The knobs over time are in "
              "adapt.png."]
    with open(os.path.join(args.out, "adapt.md"), "w") as f:
        f.write("\n".join(report) + "\n")
    print("\n".join(report))

    fig, axes = plt.subplots(len(scenarios), 1, figsize=(9, 3.2 * len(scenarios)), squeeze=False)
    for ax, s in zip(axes[:, 0], scenarios):
        ax.set_title(f"{s}: knobs chosen by --adapt" + (f" ({len(reps)} reps)" if len(reps) > 1 else ""))
        end = 0.0
        for i, d in enumerate(reps):
            r = load(os.path.join(d, s, "adapt.jsonl"))
            if r is None:
                continue
            seconds = {l["clock"]: l["seconds"] for l in r["clocks"]}
            end = max(end, max(seconds.values(), default=0.0))
            sm = r["summary"]
            batch = sm.get("batch_per_rank", 0)
            # From the start (the flags, as the summary records them) through every decision;
            # C = 0 means all B columns.
            start = {"clock": 0, "select": sm.get("select", 0), "fanout": r["decisions"][0]["fanout"]
                     if r["decisions"] else sm.get("fanout", 0), "staleness": sm.get("staleness", 0),
                     "average_every": sm.get("average_every", 0)}
            points = [start] + r["decisions"]
            for knob, color in (("select", "C0"), ("fanout", "C1"), ("staleness", "C2"),
                                ("average_every", "C3")):
                xs = [seconds.get(p["clock"], 0.0) for p in points]
                ys = [(p[knob] or batch) if knob == "select" else p[knob] for p in points]
                style = ["-", "--", ":", "-."][i % 4]
                if xs:
                    ax.step(xs, ys, style, color=color, where="post", alpha=1.0 if i == 0 else 0.5,
                            label=f"{knob} (rep {i + 1})" if len(reps) > 1 else knob)
        ax.set_xlabel("seconds")
        ax.set_ylabel("knob value")
        ax.legend(loc="upper left", fontsize=7, ncol=2)
        rt = rates(os.path.join(reps[0], s, "adapt.rates"))
        if rt:
            end = max(end, rt[-1][0])
            xs = [t for t, _ in rt] + [end]
            ys = [b for _, b in rt] + [rt[-1][1]]
            ax2 = ax.twinx()
            ax2.step(xs, ys, "k", where="post", alpha=0.4, label="link Gbit/s")
            ax2.set_ylabel("link rate (Gbit/s)")
            ax2.set_ylim(0, 11)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "adapt.png"), dpi=110)


if __name__ == "__main__":
    main()
