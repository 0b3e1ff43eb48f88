#!/usr/bin/python3
"""Correctness checks of the benchmark's peers (peers.py, run through ddp_fmnist.py as the
harness runs them): 2 ranks, gloo over loopback, float64, MLP 784-64-64-10 on Fashion-MNIST,
batch 100 per rank, lr 0.1, the same seed, shards and batches for every run, 20 steps.

  powersgd        against torch's powerSGD_hook (--peer powersgd-hook, the same rank, start
                  step and defaults) at ranks 1, 2 (Gram-Schmidt) and 4 (QR): the same
                  parameters within 1e-5 and the same bytes every step; and not DDP's
                  parameters (the compression did something).
  localsgd        with H = 1 against DDP: the same parameters within 1e-6.
  diloco          with outer lr 1 and no momentum against localsgd, H = 5: within 1e-6 (the
                  outer step on the averaged delta is the average).

Exit status 0: all passed; 1: a check failed; 77: skipped (no torch, or no Fashion-MNIST).
Runs in about half a minute on 2 cores.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
BASE = ["--np", "2", "--model", "mlp", "--hidden", "64", "--batch", "100", "--lr", "0.1", "--seed", "1",
        "--clocks", "20", "--eval-every", "0", "--dtype", "float64", "--timeout", "60", "--data", DATA]


def skip(why):
    print(f"peers_check: skipped: {why}")
    sys.exit(77)


def main():
    for module, package in (("numpy", "python3-numpy"), ("torch", "python3-torch")):
        if importlib.util.find_spec(module) is None:
            skip(f"{module} is not installed (Debian: {package})")
    import numpy as np
    if not os.path.isfile(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        skip(f"no Fashion-MNIST in {DATA} (Debian: dataset-fashion-mnist)")

    work = tempfile.mkdtemp(prefix="peers-check-")
    try:
        failed = checks(np, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failed else 0)


def checks(np, work):
    """Runs the checks; returns the number that failed."""
    runs = {}

    def run(name, *flags):
        """Parameters of rank 0 after the run, and its bytes_sent per step."""
        if name not in runs:
            params, metrics = os.path.join(work, name + ".npz"), os.path.join(work, name + ".jsonl")
            cmd = [sys.executable, os.path.join(HERE, "ddp_fmnist.py"), *BASE, *flags,
                   "--save-params", params, "--metrics", metrics]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            if done.returncode != 0:
                sys.exit(f"peers_check: {name} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
            with np.load(params) as f:
                values = [f[k] for k in f.files]
            with open(metrics) as f:
                sent = [r["bytes_sent"] for r in map(json.loads, f) if "clock" in r]
            runs[name] = values, sent
        return runs[name]

    results = []

    def check(what, ok, detail):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {detail}", flush=True)

    def gap(a, b):
        return max(float(np.max(np.abs(x - y))) for x, y in zip(run(*a)[0], run(*b)[0]))

    ddp = ("ddp", "--peer", "ddp")
    for rank in (1, 2, 4):
        mine = (f"powersgd-r{rank}", "--peer", "powersgd", "--rank-r", str(rank))
        hook = (f"powersgd-hook-r{rank}", "--peer", "powersgd-hook", "--rank-r", str(rank))
        d = gap(mine, hook)
        check(f"powersgd rank {rank} = torch's powerSGD_hook", d <= 1e-5, f"max |difference| {d:.3g} (≤ 1e-5)")
        same_bytes = run(*mine)[1] == run(*hook)[1]
        check(f"powersgd rank {rank}: bytes per step as the hook's", same_bytes,
              f"{run(*mine)[1][-1]} bytes at step 20" if same_bytes else f"{run(*mine)[1]} against {run(*hook)[1]}")
        d = gap(mine, ddp)
        check(f"powersgd rank {rank} is not DDP", d > 1e-4, f"max |difference| {d:.3g} (> 1e-4)")
    d = gap(("localsgd-h1", "--peer", "localsgd", "--local-steps", "1"), ddp)
    check("localsgd H = 1 = DDP", d <= 1e-6, f"max |difference| {d:.3g} (≤ 1e-6)")
    d = gap(("diloco-h5-plain", "--peer", "diloco", "--local-steps", "5", "--outer-lr", "1", "--outer-momentum", "0"),
            ("localsgd-h5", "--peer", "localsgd", "--local-steps", "5"))
    check("diloco H = 5, outer lr 1, momentum 0 = localsgd H = 5", d <= 1e-6, f"max |difference| {d:.3g} (≤ 1e-6)")

    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    main()
