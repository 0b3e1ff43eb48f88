#!/usr/bin/env bash
# Time per clock of MLR written as a loss expression (examples/mlr.loss, SVs found
# by the engine) against the hand-written MLR (--model mlr), at np 4 on
# Fashion-MNIST, interleaved A B A B in one run. Goal: generated / hand-written <= 1.1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
BUILD="${BUILD_DIR:-$ROOT/build}"
REPS="${REPS:-3}"
CLOCKS="${CLOCKS:-400}"
[ -x "$BUILD/engine/orpheus" ] || build "$BUILD" Release
DATA=/usr/share/datasets/fashion-mnist
RUNS=$(mktemp -d); trap 'rm -rf "$RUNS"' EXIT

for rep in $(seq 1 "$REPS"); do
  for model in mlr "$ROOT/examples/mlr.loss"; do
    name=$([ "$model" = mlr ] && echo handwritten || echo generated)
    mpirun -np 4 --oversubscribe "$BUILD/engine/orpheus" train --model "$model" \
      --train "$DATA/train-images-idx3-ubyte.gz" --clocks "$CLOCKS" --batch 100 --seed 1 \
      --progress off --log-level warn --metrics "$RUNS/${name}__$rep.jsonl" >/dev/null
  done
done

/usr/bin/python3 - "$RUNS" "$CLOCKS" <<'PY'
import json, os, statistics, sys
runs, clocks = sys.argv[1], int(sys.argv[2])
per = {}
for f in sorted(os.listdir(runs)):
    name = f.split("__")[0]
    times = []
    for line in open(os.path.join(runs, f)):
        r = json.loads(line)
        if "clock_seconds" in r and r["clock"] > 5:
            times.append(r["clock_seconds"])
    per.setdefault(name, []).append(statistics.median(times))
print(f"## Generated vs hand-written MLR (np 4, batch 100 per rank, {clocks} clocks, {len(per['generated'])} reps, interleaved)\n")
print("| model | time/clock ms, median | min–max |")
print("|---|---:|---:|")
for name in ("handwritten", "generated"):
    v = per[name]
    print(f"| {name} | {1e3*statistics.median(v):.3f} | {1e3*min(v):.3f}–{1e3*max(v):.3f} |")
ratio = statistics.median(per["generated"]) / statistics.median(per["handwritten"])
print(f"| **generated / hand-written** | **{ratio:.2f}×** | goal ≤ 1.1× |")
PY
