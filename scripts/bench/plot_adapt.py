"""The adapt suite's report: time to target per scenario and setting, the ratios,
and the knobs --adapt chose over time against the link rate (scripts/bench/adapt.sh)."""
import argparse
import json
import os

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--scenarios", default="1gbit,10gbit,drop")
    ap.add_argument("--np", type=int, default=4)
    args = ap.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]

    rows = ["| scenario | setting | reached | seconds to target | clocks | bytes/clock | adapt / this |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for s in scenarios:
        runs = {c: load(os.path.join(args.raw, s, f"{c}.jsonl")) for c in CONFIGS}
        adapt_s = (runs["adapt"] or {}).get("summary", {}).get("seconds")
        for c in CONFIGS:
            r = runs[c]
            if r is None:
                continue
            sm = r["summary"]
            ok = sm.get("reached_target", False)
            ratio = f"{adapt_s / sm['seconds']:.2f}" if ok and adapt_s and sm.get("seconds") else "—"
            rows.append(f"| {s} | {c} | {'yes' if ok else 'no'} | {sm.get('seconds', float('nan')):.1f} | "
                        f"{sm.get('clocks', '')} | {sm.get('bytes_per_clock', float('nan')):.0f} | {ratio} |")
    report = [f"# --adapt against hand-tuned and default settings (np {args.np}, MLP-2048, target {args.target})", "",
              *rows, "",
              "Ratios below 1 mean --adapt reached the target sooner. The knobs over time are in adapt.png."]
    with open(os.path.join(args.out, "adapt.md"), "w") as f:
        f.write("\n".join(report) + "\n")
    print("\n".join(report))

    fig, axes = plt.subplots(len(scenarios), 1, figsize=(9, 3.2 * len(scenarios)), squeeze=False)
    for ax, s in zip(axes[:, 0], scenarios):
        r = load(os.path.join(args.raw, s, "adapt.jsonl"))
        ax.set_title(f"{s}: knobs chosen by --adapt")
        if r is None:
            continue
        seconds = {l["clock"]: l["seconds"] for l in r["clocks"]}
        sm = r["summary"]
        batch = sm.get("batch_per_rank", 0)
        # From the start (the flags, as the summary records them) through every decision;
        # C = 0 means all B columns.
        start = {"clock": 0, "select": sm.get("select", 0), "fanout": r["decisions"][0]["fanout"]
                 if r["decisions"] else sm.get("fanout", 0), "staleness": sm.get("staleness", 0),
                 "average_every": sm.get("average_every", 0)}
        points = [start] + r["decisions"]
        for knob, style in (("select", "-"), ("fanout", "--"), ("staleness", ":"), ("average_every", "-.")):
            xs = [seconds.get(d["clock"], 0.0) for d in points]
            ys = [(d[knob] or batch) if knob == "select" else d[knob] for d in points]
            if xs:
                ax.step(xs, ys, style, where="post", label=knob)
        ax.set_xlabel("seconds")
        ax.set_ylabel("knob value")
        ax.legend(loc="upper left", fontsize=8)
        rt = rates(os.path.join(args.raw, s, "adapt.rates"))
        if rt:
            end = max(seconds.values(), default=rt[-1][0])
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
