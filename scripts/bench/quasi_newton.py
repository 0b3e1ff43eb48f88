"""quasi_newton.py: --optimizer bfgs and dfp against sgd, adam and SciPy's L-BFGS.

    /usr/bin/python3 scripts/bench/quasi_newton.py [--orpheus BIN] [--np 4] [--target 0.55]
        [--out scripts/bench/results/quasi_newton.md]

Multiclass logistic regression on Fashion-MNIST pooled to 14x14 (196 features, 1,970
parameters; scripts/bench/fmnist14.py), 20,000 training images over NP ranks, the
10,000 test images evaluated every clock. For each optimizer: clocks, bytes (all
ranks) and seconds until the test loss first reaches TARGET, and where it ends.
bfgs and dfp take full-batch clocks (--batch = the shard) at lr 1; sgd and adam take
minibatches of 100 per rank at the lr given below. Every run uses --sync dense: a
1,970-entry gradient is smaller than the SVs of even 10 examples (10 x (10 + 196)
floats), and the table also shows bfgs with --sync sv for the bytes SVs would cost.
SciPy's L-BFGS (float64, one process, the same data) is the single-process yardstick:
its iterations and gradient evaluations stand in for clocks.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def orpheus_run(args, work, name, flags):
    metrics = os.path.join(work, f"{name}.jsonl")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "-n", str(args.np), args.orpheus, "train",
           "--train", os.path.join(work, "train.csv"), "--test", os.path.join(work, "test.csv"),
           "--eval-every", "1", "--progress", "off", "--log-level", "warn", "--seed", "7",
           "--metrics", metrics, "--save", os.path.join(work, f"{name}.h5")] + flags
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    lines = [json.loads(l) for l in open(metrics) if l.strip()]
    clocks = [l for l in lines if "summary" not in l]
    summary = lines[-1]
    reached, sent = None, 0
    for c in clocks:
        sent += c["bytes_sent"]
        if reached is None and c.get("test_loss", 1e9) <= args.target:
            reached = (c["clock"], sent, c["seconds"])
    return {"name": name, "reached": reached, "final_loss": summary["test_loss"],
            "final_accuracy": summary["test_accuracy"], "clocks": summary["clocks"],
            "bytes_per_clock": summary["bytes_per_clock"], "seconds": summary["seconds"],
            "skips": summary.get("quasi_newton_skips")}


def scipy_lbfgs(args, work):
    from scipy.optimize import minimize

    def load(name):
        data = np.loadtxt(os.path.join(work, name), delimiter=",", dtype=np.float64)
        return data[:, 1:], data[:, 0].astype(int)

    x, y = load("train.csv")
    xt, yt = load("test.csv")
    k, f = 10, x.shape[1]

    def loss_grad(theta, xs, ys):
        w, b = theta[:k * f].reshape(k, f), theta[k * f:]
        a = xs @ w.T + b
        a -= a.max(axis=1, keepdims=True)
        p = np.exp(a)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.mean(np.log(p[np.arange(len(ys)), ys]))
        p[np.arange(len(ys)), ys] -= 1.0
        p /= len(ys)
        return loss, np.concatenate([(p.T @ xs).ravel(), p.sum(axis=0)])

    trace = []
    start = time.perf_counter()
    evals = [0]

    def fun(theta):
        evals[0] += 1
        return loss_grad(theta, x, y)

    def callback(theta):
        trace.append((len(trace) + 1, evals[0], loss_grad(theta, xt, yt)[0], time.perf_counter() - start))

    result = minimize(fun, np.zeros(k * f + k), jac=True, method="L-BFGS-B", callback=callback,
                      options={"maxiter": args.lbfgs_iterations})
    reached = next(((it, ev, s) for it, ev, loss, s in trace if loss <= args.target), None)
    w, b = result.x[:k * f].reshape(k, f), result.x[k * f:]
    accuracy = float(np.mean(np.argmax(xt @ w.T + b, axis=1) == yt))
    return {"reached": reached, "final_loss": trace[-1][2], "final_accuracy": accuracy,
            "iterations": len(trace), "evals": evals[0]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--orpheus", default=os.path.join(ROOT, "build", "engine", "orpheus"))
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--target", type=float, default=0.55)
    p.add_argument("--train-examples", type=int, default=20000)
    p.add_argument("--qn-clocks", type=int, default=100)
    p.add_argument("--first-order-clocks", type=int, default=1500)
    p.add_argument("--lbfgs-iterations", type=int, default=100)
    p.add_argument("--fashion-mnist", default=os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
    p.add_argument("--out", default=os.path.join(HERE, "results", "quasi_newton.md"))
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="qn-bench-")
    subprocess.run([sys.executable, os.path.join(HERE, "fmnist14.py"), args.fashion_mnist, work,
                    str(args.train_examples)], check=True)
    shard = args.train_examples // args.np
    qn = ["--batch", str(shard), "--clocks", str(args.qn_clocks)]
    first = ["--batch", "100", "--clocks", str(args.first_order_clocks), "--sync", "dense"]
    runs = [
        orpheus_run(args, work, "bfgs", ["--optimizer", "bfgs", "--sync", "dense"] + qn),
        orpheus_run(args, work, "dfp", ["--optimizer", "dfp", "--sync", "dense"] + qn),
        orpheus_run(args, work, "bfgs, --sync sv", ["--optimizer", "bfgs", "--sync", "sv", "--batch", str(shard),
                                                    "--clocks", "40"]),
        orpheus_run(args, work, "sgd lr 0.5", ["--optimizer", "sgd", "--lr", "0.5"] + first),
        orpheus_run(args, work, "adam lr 0.01", ["--optimizer", "adam", "--lr", "0.01"] + first),
    ]
    ref = scipy_lbfgs(args, work)

    def fmt_reached(r):
        return ("not reached", "", "") if r is None else (str(r[0]), f"{r[1] / 1e6:.2f}", f"{r[2]:.1f}")

    lines = [
        f"# Quasi-Newton against first-order optimizers and SciPy's L-BFGS",
        "",
        f"`scripts/bench/quasi_newton.py`, {time.strftime('%Y-%m-%d')}: multiclass logistic regression on "
        f"Fashion-MNIST pooled to 14x14 (196 features, 1,970 parameters), {args.train_examples:,} training images "
        f"over {args.np} ranks (one host, loopback), the 10,000 test images evaluated every clock; target: test loss "
        f"<= {args.target}. bfgs and dfp: full-batch clocks ({shard} examples per rank), lr 1. sgd and adam: 100 "
        f"examples per rank per clock. `--sync dense` unless said (the gradient, 7.9 kB, is smaller than the SVs "
        f"of 10 examples). Clocks and bytes are deterministic (one run each); seconds are on a 2-core machine "
        f"with {args.np} ranks.",
        "",
        "| optimizer | clocks to target | MB sent to target (all ranks) | seconds to target | clocks run | "
        "final test loss | final test accuracy | bytes per clock | W updates skipped |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        c, mb, s = fmt_reached(r["reached"])
        skips = "" if r["skips"] is None else str(r["skips"])
        lines.append(f"| {r['name']} | {c} | {mb} | {s} | {r['clocks']} | {r['final_loss']:.4f} | "
                     f"{r['final_accuracy']:.4f} | {r['bytes_per_clock']:,.0f} | {skips} |")
    rr = ref["reached"]
    lines.append(f"| SciPy L-BFGS-B, 1 process, float64 | {rr[0] if rr else 'not reached'} iterations "
                 f"({rr[1] if rr else '-'} gradient evaluations) | 0 | {f'{rr[2]:.1f}' if rr else ''} | "
                 f"{ref['iterations']} | {ref['final_loss']:.4f} | {ref['final_accuracy']:.4f} | | |")
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
