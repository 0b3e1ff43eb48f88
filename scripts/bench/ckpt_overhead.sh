#!/usr/bin/env bash
# Cost of checkpointing, side by side in one run (np 4, Fashion-MNIST MLP,
# --select 25 --multicast random --fanout 3, BSP): time per clock with no
# checkpoint, the incremental SV checkpoint and the whole-matrix baseline, bytes
# written per clock, and the time of restore(T) with and without snapshots.
# Goal: the SV checkpoint costs <= 3% of time per clock against none.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
BUILD="${BUILD_DIR:-$ROOT/build}"
REPS="${REPS:-2}"
CLOCKS="${CLOCKS:-200}"
[ -x "$BUILD/engine/orpheus" ] || build "$BUILD" Release
ORPHEUS="$BUILD/engine/orpheus"
DATA=/usr/share/datasets/fashion-mnist
RUNS=$(mktemp -d); trap 'rm -rf "$RUNS"' EXIT
common=(--model "$ROOT/examples/mlp.loss" --train "$DATA/train-images-idx3-ubyte.gz" --clocks "$CLOCKS" --batch 100
        --select 25 --multicast random --fanout 3 --seed 1 --progress off --log-level warn)

for rep in $(seq 1 "$REPS"); do
  for mode in none sv matrix; do
    extra=()
    case $mode in
      sv) extra=(--ckpt sv --ckpt-dir "$RUNS/ckpt-$mode-$rep") ;;
      matrix) extra=(--ckpt matrix --ckpt-every 50 --ckpt-dir "$RUNS/ckpt-$mode-$rep") ;;
    esac
    mpirun -np 4 --oversubscribe "$ORPHEUS" train "${common[@]}" "${extra[@]}" --metrics "$RUNS/${mode}__$rep.jsonl" >/dev/null
    if [ -d "$RUNS/ckpt-$mode-$rep" ]; then du -sb "$RUNS/ckpt-$mode-$rep" | cut -f1 > "$RUNS/${mode}__$rep.bytes"; fi
  done
done

# restore(T) with snapshots (averaging every 50 clocks) and without.
mpirun -np 4 --oversubscribe "$ORPHEUS" train "${common[@]}" --average-every 50 --ckpt sv --ckpt-dir "$RUNS/snap" >/dev/null
restore_times() {
  for T in 50 100 150 200; do
    [ "$T" -le "$CLOCKS" ] || continue
    s=$(date +%s%N); "$ORPHEUS" restore --ckpt-dir "$1" --clock "$T" --out "$RUNS/r.h5" >/dev/null; e=$(date +%s%N)
    echo "$T $(awk -v n=$((e - s)) 'BEGIN { print n / 1e9 }')"
  done
}
restore_times "$RUNS/snap" > "$RUNS/restore_snap.txt"
restore_times "$RUNS/ckpt-sv-1" > "$RUNS/restore_nosnap.txt"

/usr/bin/python3 - "$RUNS" "$CLOCKS" <<'PY'
import json, os, statistics, sys
runs, clocks = sys.argv[1], int(sys.argv[2])
per, wait, written = {}, {}, {}
for f in sorted(os.listdir(runs)):
    if not f.endswith(".jsonl"):
        continue
    mode = f.split("__")[0]
    times, waits = [], []
    for line in open(os.path.join(runs, f)):
        r = json.loads(line)
        if "clock_seconds" in r and r["clock"] > 5:
            times.append(r["clock_seconds"]); waits.append(r.get("ckpt_wait_seconds", 0.0))
    per.setdefault(mode, []).append(statistics.median(times))
    wait.setdefault(mode, []).append(statistics.mean(waits))
    b = os.path.join(runs, f.replace(".jsonl", ".bytes"))
    if os.path.exists(b):
        written.setdefault(mode, []).append(int(open(b).read()) / clocks)
base = statistics.median(per["none"])
print(f"## Checkpoint cost (np 4, MLP, --select 25 --multicast random --fanout 3, {clocks} clocks, {len(per['none'])} interleaved reps)\n")
print("| checkpoint | time/clock ms, median | vs none | compute wait on the writer ms/clock | bytes written per clock |")
print("|---|---:|---:|---:|---:|")
for mode, label in (("none", "none"), ("sv", "SV log (--ckpt sv)"), ("matrix", "whole matrix every 50 clocks")):
    t = statistics.median(per[mode])
    w = 1e3 * statistics.mean(wait[mode])
    b = f"{statistics.mean(written[mode]) / 1e6:.2f} MB" if mode in written else "0"
    print(f"| {label} | {1e3 * t:.1f} | {t / base:.3f}× | {w:.3f} | {b} |")
print("\n| restore to clock T | with snapshots (every 50) s | without snapshots s |")
print("|---:|---:|---:|")
snap = dict(l.split() for l in open(os.path.join(runs, "restore_snap.txt")))
nosnap = dict(l.split() for l in open(os.path.join(runs, "restore_nosnap.txt")))
for T in snap:
    print(f"| {T} | {float(snap[T]):.2f} | {float(nosnap.get(T, 'nan')):.2f} |")
PY
