#!/usr/bin/env bash
# Benchmark: one rank's training step, Orpheus against PyTorch, on the same shapes and
# the same OpenBLAS, without the network: the 784-HIDDEN-HIDDEN-10 MLP, BATCH examples.
#   orpheus dense   orpheus_bench_step --modes dense (dense gradient, W += scale * grad)
#   orpheus sv      orpheus_bench_step --modes sv (compute_svg, rebuild of the own batch)
#   torch           scripts/bench/step_torch.py (forward, cross-entropy, backward, SGD)
# Runs are interleaved (REPS rounds of every engine at every thread count), so drift of
# a busy machine hits all of them alike; each run reports the median time per clock.
# Prints markdown (median over the rounds, ratio to torch at the same thread count) and
# writes it to RESULTS.
#
# Usage: scripts/bench/step_vs_torch.sh       (or scripts/bench/run.sh step)
# Environment (defaults in brackets): REPS [3], CLOCKS [30], WARMUP [3], BATCH [100],
#   HIDDEN [2048] (1024: examples/mlp.loss, 2048: examples/mlp_wide.loss),
#   THREADS ["1 2"] BLAS threads per run, BUILD_DIR [build-release],
#   RESULTS [scripts/bench/results/step_vs_torch.md].
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REPS="${REPS:-3}"; CLOCKS="${CLOCKS:-30}"; WARMUP="${WARMUP:-3}"; BATCH="${BATCH:-100}"
HIDDEN="${HIDDEN:-2048}"; THREADS="${THREADS:-1 2}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-release}"
RESULTS="${RESULTS:-$ROOT/scripts/bench/results/step_vs_torch.md}"
PYTHON=/usr/bin/python3
BENCH="$BUILD_DIR/scripts/bench/orpheus_bench_step"

say() { echo "step_vs_torch: $*" >&2; }
case "$HIDDEN" in
  1024) LOSS="$ROOT/examples/mlp.loss" ;;
  2048) LOSS="$ROOT/examples/mlp_wide.loss" ;;
  *) say "HIDDEN must be 1024 or 2048 (the example models)"; exit 2 ;;
esac
[ -x "$BENCH" ] || { say "missing $BENCH (build first)"; exit 2; }
"$PYTHON" -c 'import torch' 2>/dev/null || { say "missing python3-torch"; exit 2; }

raw="$(mktemp)"
trap 'rm -f "$raw"' EXIT
for rep in $(seq 1 "$REPS"); do
  for t in $THREADS; do
    say "round $rep, $t thread(s)"
    OPENBLAS_NUM_THREADS="$t" "$BENCH" --loss "$LOSS" --batch "$BATCH" --clocks "$CLOCKS" --warmup "$WARMUP" \
      --threads "$t" --modes dense,sv >>"$raw"
    OPENBLAS_NUM_THREADS="$t" OMP_NUM_THREADS="$t" "$PYTHON" "$ROOT/scripts/bench/step_torch.py" --hidden "$HIDDEN" \
      --batch "$BATCH" --clocks "$CLOCKS" --warmup "$WARMUP" --threads "$t" >>"$raw"
  done
done

mkdir -p "$(dirname "$RESULTS")"
"$PYTHON" - "$raw" "$HIDDEN" "$BATCH" "$REPS" "$CLOCKS" <<'PY' | tee "$RESULTS"
import collections, datetime, json, platform, statistics, sys
raw, hidden, batch, reps, clocks = sys.argv[1:]
runs = collections.defaultdict(list)
for line in open(raw):
    r = json.loads(line)
    if r.get("kind") == "step":
        runs[(r["threads"], f'{r["engine"]} {r["mode"]}')].append(r["median_ms"])
print(f"# One rank's step: Orpheus against PyTorch\n")
print(f"784-{hidden}-{hidden}-10 MLP, batch {batch}, {clocks} clocks per run, {reps} interleaved rounds; "
      f"{datetime.date.today()}, {platform.node()}, {platform.processor() or platform.machine()}.\n")
print("| threads | engine | ms per clock (median of rounds) | each round | vs torch |")
print("| ---: | --- | ---: | --- | ---: |")
for t in sorted({k[0] for k in runs}):
    torch = statistics.median(runs[(t, "torch dense")]) if runs.get((t, "torch dense")) else None
    for name in ("orpheus dense", "orpheus sv", "torch dense"):
        ms = runs.get((t, name))
        if not ms:
            continue
        m = statistics.median(ms)
        ratio = f"{m / torch:.2f}x" if torch else "-"
        print(f"| {t} | {name} | {m:.1f} | {', '.join(f'{x:.1f}' for x in ms)} | {ratio} |")
PY
