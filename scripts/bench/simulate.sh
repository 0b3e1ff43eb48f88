#!/usr/bin/env bash
# scripts/bench/simulate.sh: orpheus simulate, calibrated and at scale. Writes
# scripts/bench/results/simulate.md (and simulate_scaling.csv, simulate.png).
#
#  1. Calibration: a simulated P = 4 and 8 on the model of the emulated 1 Gbit/s
#     cluster (scripts/netcluster.sh: 1 Gbit/s links, 0.1 ms one way) next to a real
#     run on that cluster (needs root; skipped otherwise): seconds per clock, side by
#     side, and the ratio (the issue asks for within 15%).
#  2. Scaling: P in $PS on a $GBPS Gbit/s model, MLR on Fashion-MNIST, for broadcast,
#     random (Q = 4), fixed and ring multicast, each without and with selection
#     (--select $SELECT) and averaging (--average-every $AVERAGE): simulated time to
#     $TARGET test accuracy, bytes per worker per clock, and where a dense ring
#     all-reduce of the same model would stand on the same network (analytic:
#     2(P-1)(latency + 4n/(P*bandwidth)) per clock plus the measured compute).
#
# Options (environment): PS="8 32 128 512 1000" GBPS=10 CLOCKS=400 BATCH=10 TARGET=0.75
#   SELECT=5 AVERAGE=50 KINDS="all random fixed ring" CAL_PS="4 8" CAL_CLOCKS=200
#   SMOKE=1 (tiny settings: a check that the script runs, not a measurement)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/common.sh"
ORPHEUS=${ORPHEUS:-$ROOT/build-release/engine/orpheus}
DATA=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
PS=${PS:-8 32 128 512 1000}; GBPS=${GBPS:-10}; CLOCKS=${CLOCKS:-400}; BATCH=${BATCH:-10}
TARGET=${TARGET:-0.75}; SELECT=${SELECT:-5}; AVERAGE=${AVERAGE:-50}; KINDS=${KINDS:-all random fixed ring}
CAL_PS=${CAL_PS:-4 8}; CAL_CLOCKS=${CAL_CLOCKS:-200}
if [ "${SMOKE:-0}" = 1 ]; then
  PS="8"; CLOCKS=4; KINDS="all random"; CAL_PS="4"; CAL_CLOCKS=4; TARGET=0.99
fi
RES="$ROOT/scripts/bench/results"; RAW="$ROOT/build/bench-raw/simulate"
mkdir -p "$RES" "$RAW"
data=(--train "$DATA/train-images-idx3-ubyte.gz" --test "$DATA/t10k-images-idx3-ubyte.gz" --progress off --log-level warn)

field() { tail -1 "$1" | grep -o "\"$2\": [^,}]*" | head -1 | cut -d' ' -f2; }
# Seconds per clock of a real run's metrics, leaving out the first clock (warm-up).
real_per_clock() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' not in l]
print((rows[-1]["seconds"] - rows[0]["seconds"]) / max(1, len(rows) - 1))
PY
}

{
echo "# orpheus simulate: calibration and scaling"
echo
echo "## Calibration: simulated vs real on the emulated 1 Gbit/s cluster (MLR, batch 100, broadcast, BSP)"
echo
echo "| P | simulated s/clock | real s/clock | simulated / real |"
echo "| --- | --- | --- | --- |"
for p in $CAL_PS; do
  flags=(--clocks "$CAL_CLOCKS" --batch 100 --eval-every 0)
  "$ORPHEUS" simulate --ranks "$p" "${data[@]}" "${flags[@]}" --sim-link-gbps 1 --sim-latency-us 100 \
    --metrics "$RAW/cal_sim_$p.jsonl" >/dev/null
  sim=$(field "$RAW/cal_sim_$p.jsonl" seconds_per_clock)
  real="n/a"; ratio="n/a"
  if [ "$(id -u)" = 0 ] && [ "${SMOKE:-0}" != 1 ]; then
    "$ROOT/scripts/netcluster.sh" up "$p" --rate 1gbit --delay 0.1ms >/dev/null
    trap '"$ROOT/scripts/netcluster.sh" down >/dev/null' EXIT
    # shellcheck disable=SC2046
    mpirun -np "$p" $("$ROOT/scripts/netcluster.sh" mpirun-args) "$ORPHEUS" train "${data[@]}" "${flags[@]}" \
      --metrics "$RAW/cal_real_$p.jsonl" >/dev/null
    "$ROOT/scripts/netcluster.sh" down >/dev/null
    real=$(real_per_clock "$RAW/cal_real_$p.jsonl")
    ratio=$(/usr/bin/python3 -c "print(f'{$sim/$real:.3f}')")
  fi
  echo "| $p | $sim | $real | $ratio |"
done
echo
echo "## Scaling on a $GBPS Gbit/s model (MLR, batch $BATCH per worker, target accuracy $TARGET)"
echo
echo "| P | multicast | select | average | clocks | simulated s to target | s/clock | bytes/worker/clock | dense ring all-reduce s/clock |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
echo "P,multicast,select,average,clocks,seconds,per_clock,bytes_per_worker,dense_per_clock" >"$RES/simulate_scaling.csv"
for p in $PS; do
  for kind in $KINDS; do
    for variant in plain selavg; do
      flags=(--clocks "$CLOCKS" --batch "$BATCH" --multicast "$kind" --eval-every 20 --target-accuracy "$TARGET"
             --sim-link-gbps "$GBPS")
      [ "$kind" != all ] && flags+=(--fanout 4)
      sel=0; avg=0
      [ "$variant" = selavg ] && { flags+=(--select "$SELECT" --average-every "$AVERAGE"); sel=$SELECT; avg=$AVERAGE; }
      m="$RAW/scale_${p}_${kind}_${variant}.jsonl"
      "$ORPHEUS" simulate --ranks "$p" "${data[@]}" "${flags[@]}" --metrics "$m" >/dev/null
      clocks=$(field "$m" clocks); secs=$(field "$m" seconds); per=$(field "$m" seconds_per_clock)
      bpw=$(field "$m" bytes_per_worker_per_clock); comp=$(field "$m" compute_seconds_per_worker_per_clock)
      # MLR on Fashion-MNIST: n = 10 x 784 floats; ring all-reduce on the same model (5 us latency).
      dense=$(/usr/bin/python3 -c "p=$p; n=7840*4; bw=$GBPS*1e9/8; print(f'{$comp + 2*(p-1)*(5e-6 + n/p/bw):.3g}')")
      echo "| $p | $kind | $sel | $avg | $clocks | $secs | $per | $bpw | $dense |"
      echo "$p,$kind,$sel,$avg,$clocks,$secs,$per,$bpw,$dense" >>"$RES/simulate_scaling.csv"
    done
  done
done
} | tee "$RES/simulate.md"

/usr/bin/python3 - "$RES/simulate_scaling.csv" "$RES/simulate.png" <<'PY' || echo "simulate.sh: no plot (matplotlib missing?)" >&2
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open(sys.argv[1])))
fig, ax = plt.subplots(1, 2, figsize=(11, 4))
for kind in sorted({r["multicast"] for r in rows}):
    for sel in sorted({r["select"] for r in rows}):
        rs = [r for r in rows if r["multicast"] == kind and r["select"] == sel]
        label = f"{kind}" + (f", select {sel} + avg" if sel != "0" else "")
        ax[0].plot([int(r["P"]) for r in rs], [float(r["seconds"]) for r in rs], marker="o", label=label)
        ax[1].plot([int(r["P"]) for r in rs], [float(r["bytes_per_worker"]) for r in rs], marker="o", label=label)
ax[0].set(xscale="log", yscale="log", xlabel="P", ylabel="simulated seconds to target")
ax[1].set(xscale="log", yscale="log", xlabel="P", ylabel="bytes per worker per clock")
ax[0].legend(fontsize=7)
fig.tight_layout()
fig.savefig(sys.argv[2])
PY
