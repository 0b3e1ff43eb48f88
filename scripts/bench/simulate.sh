#!/usr/bin/env bash
# scripts/bench/simulate.sh: orpheus simulate, calibrated and at scale. Writes
# scripts/bench/results/simulate.md (and simulate_scaling.csv, simulate.png).
#
#  1. Calibration: a simulated P = 4 and 8 on the model of the emulated 1 Gbit/s
#     cluster (scripts/netcluster.sh: 1 Gbit/s links, 0.1 ms one way) next to a real
#     run on that cluster (needs root; skipped otherwise): seconds per clock, side by
#     side, and the ratio (the issue asks for within 15%). The real cluster is P
#     processes on this machine's $CAL_CORES cores, so the simulation is told so
#     (--sim-cores $CAL_CORES --sim-hosts 1); the column with a core per worker shows
#     what the CPU-share model corrects. The last column adds the host's network
#     stack (--sim-stack-gbps): the CPU the kernel spends per byte sent and received,
#     on the same shared cores. Its rate is measured first, apart from any training
#     run: one TCP stream between two emulated hosts with no rate limit, sender and
#     receiver each on a core (scripts/bench/stack_probe.py), unless STACK_GBPS is given.
#  2. Scaling: P in $PS on a $GBPS Gbit/s model, MLR on Fashion-MNIST, for broadcast,
#     random (Q = 4), fixed and ring multicast, each without and with selection
#     (--select $SELECT) and averaging (--average-every $AVERAGE): simulated time to
#     $TARGET test accuracy, bytes per worker per clock, and where a dense ring
#     all-reduce of the same model would stand on the same network (analytic:
#     2(P-1)(latency + 4n/(P*bandwidth)) per clock plus the measured compute).
#     Broadcast costs P^2 decodes and updates per clock in real time (every replica
#     applies every batch): at P >= $BCAST_CAP_P it runs $BCAST_CLOCKS clocks only, and
#     its time to target is extrapolated (marked ~): the clocks to target of the
#     largest P run in full times the seconds per clock measured at this P.
#  3. The small MLP (scripts/bench/mlp_small.loss) at P = $MLP_P under random
#     multicast: $MLP_CLOCKS clocks, peak memory and real time.
#
# Options (environment): PS="8 32 128 512 1000" GBPS=10 CLOCKS=400 BATCH=10 TARGET=0.75
#   SELECT=5 AVERAGE=50 KINDS="all random fixed ring" CAL_PS="4 8" CAL_CLOCKS=200
#   CAL_CORES=$(nproc) BCAST_CAP_P=512 BCAST_CLOCKS=10 MLP_P=1000 MLP_CLOCKS=20
#   STACK_GBPS (measured) PARTS="calibration scaling mlp"
#   SMOKE=1 (tiny settings: a check that the script runs, not a measurement)
#   REUSE=1 (keep a scaling run whose metrics file already ends in a summary: continues
#   a table that was cut off, with the same settings)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/common.sh"
ORPHEUS=${ORPHEUS:-$ROOT/build-release/engine/orpheus}
DATA=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
PS=${PS:-8 32 128 512 1000}; GBPS=${GBPS:-10}; CLOCKS=${CLOCKS:-400}; BATCH=${BATCH:-10}
TARGET=${TARGET:-0.75}; SELECT=${SELECT:-5}; AVERAGE=${AVERAGE:-50}; KINDS=${KINDS:-all random fixed ring}
CAL_PS=${CAL_PS:-4 8}; CAL_CLOCKS=${CAL_CLOCKS:-200}; CAL_CORES=${CAL_CORES:-$(nproc)}
PARTS=${PARTS:-calibration scaling mlp}; STACK_GBPS=${STACK_GBPS:-}
BCAST_CAP_P=${BCAST_CAP_P:-512}; BCAST_CLOCKS=${BCAST_CLOCKS:-10}; MLP_P=${MLP_P:-1000}; MLP_CLOCKS=${MLP_CLOCKS:-20}
if [ "${SMOKE:-0}" = 1 ]; then
  PS="8 16"; CLOCKS=4; KINDS="all random"; CAL_PS="4"; CAL_CLOCKS=4; TARGET=0.99; BCAST_CAP_P=16; BCAST_CLOCKS=2
  MLP_P=16; MLP_CLOCKS=2
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

has_part() { [[ " $PARTS " == *" $1 "* ]]; }

# The network stack's rate: one TCP stream between two emulated hosts, no rate
# limit; the median of three.
measure_stack() {
  "$ROOT/scripts/netcluster.sh" up 2 --rate 100gbit --delay 0ms >/dev/null
  trap '"$ROOT/scripts/netcluster.sh" down >/dev/null' EXIT
  local out="$RAW/stack_probe.txt"
  : >"$out"
  for _ in 1 2 3; do
    "$ROOT/scripts/netcluster.sh" exec 0 /usr/bin/python3 "$ROOT/scripts/bench/stack_probe.py" recv 198.18.0.1 >>"$out" &
    local server=$!
    sleep 1
    "$ROOT/scripts/netcluster.sh" exec 1 /usr/bin/python3 "$ROOT/scripts/bench/stack_probe.py" send 198.18.0.1
    wait "$server"
  done
  "$ROOT/scripts/netcluster.sh" down >/dev/null
  sort -n "$out" | sed -n 2p
}

calibration() {
if [ -z "$STACK_GBPS" ]; then
  if [ "$(id -u)" = 0 ] && [ "${SMOKE:-0}" != 1 ]; then STACK_GBPS=$(measure_stack); else STACK_GBPS=0; fi
fi
echo "## Calibration: simulated vs real on the emulated 1 Gbit/s cluster (MLR, batch 100, broadcast, BSP)"
echo
echo "The host's network stack moved $STACK_GBPS Gbit/s on a core (one TCP stream between two emulated hosts, no"
echo "rate limit, median of 3: $(paste -sd' ' "$RAW/stack_probe.txt" 2>/dev/null); scripts/bench/stack_probe.py); the"
echo "last simulation charges that CPU per byte sent and received."
echo
echo "| P | simulated s/clock, a core per worker | P on $CAL_CORES cores | P on $CAL_CORES cores + stack | real s/clock | simulated (last) / real |"
echo "| --- | --- | --- | --- | --- | --- |"
for p in $CAL_PS; do
  flags=(--clocks "$CAL_CLOCKS" --batch 100 --eval-every 0)
  "$ORPHEUS" simulate --ranks "$p" "${data[@]}" "${flags[@]}" --sim-link-gbps 1 --sim-latency-us 100 \
    --metrics "$RAW/cal_sim_own_$p.jsonl" >/dev/null
  own=$(field "$RAW/cal_sim_own_$p.jsonl" seconds_per_clock)
  "$ORPHEUS" simulate --ranks "$p" "${data[@]}" "${flags[@]}" --sim-link-gbps 1 --sim-latency-us 100 \
    --sim-cores "$CAL_CORES" --sim-hosts 1 --metrics "$RAW/cal_sim_$p.jsonl" >/dev/null
  shared=$(field "$RAW/cal_sim_$p.jsonl" seconds_per_clock)
  "$ORPHEUS" simulate --ranks "$p" "${data[@]}" "${flags[@]}" --sim-link-gbps 1 --sim-latency-us 100 \
    --sim-cores "$CAL_CORES" --sim-hosts 1 --sim-stack-gbps "$STACK_GBPS" --metrics "$RAW/cal_sim_stack_$p.jsonl" >/dev/null
  sim=$(field "$RAW/cal_sim_stack_$p.jsonl" seconds_per_clock)
  real="n/a"; ratio="n/a"
  if [ "$(id -u)" = 0 ] && [ "${SMOKE:-0}" != 1 ]; then
    "$ROOT/scripts/netcluster.sh" up "$p" --rate 1gbit --delay 0.1ms >/dev/null
    trap '"$ROOT/scripts/netcluster.sh" down >/dev/null' EXIT
    # A launch can hang before any rank starts (past orte_startup_timeout): bounded, tried again.
    for attempt in 1 2 3; do
      # shellcheck disable=SC2046
      timeout "${RUN_TIMEOUT:-300}" mpirun -np "$p" $("$ROOT/scripts/netcluster.sh" mpirun-args) "$ORPHEUS" train \
        "${data[@]}" "${flags[@]}" --metrics "$RAW/cal_real_$p.jsonl" >/dev/null && break
      echo "simulate.sh: the real P = $p run failed or hung (attempt $attempt)" >&2
    done
    "$ROOT/scripts/netcluster.sh" down >/dev/null
    real=$(real_per_clock "$RAW/cal_real_$p.jsonl")
    ratio=$(/usr/bin/python3 -c "print(f'{$sim/$real:.3f}')")
  fi
  echo "| $p | $own | $shared | $sim | $real | $ratio |"
done
}

scaling() {
echo "## Scaling on a $GBPS Gbit/s model (MLR, batch $BATCH per worker, target accuracy $TARGET)"
echo
echo "| P | multicast | select | average | clocks | simulated s to target | s/clock | bytes/worker/clock | dense ring all-reduce s/clock | real s | peak MB |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
echo "P,multicast,select,average,clocks,seconds,per_clock,bytes_per_worker,dense_per_clock,extrapolated,reached" >"$RES/simulate_scaling.csv"
declare -A full_clocks  # variant -> clocks to target of broadcast at the largest P run in full
for p in $PS; do
  for kind in $KINDS; do
    for variant in plain selavg; do
      capped=0
      [ "$kind" = all ] && [ "$p" -ge "$BCAST_CAP_P" ] && capped=1
      flags=(--batch "$BATCH" --multicast "$kind" --sim-link-gbps "$GBPS")
      if [ $capped = 1 ]; then
        flags+=(--clocks "$BCAST_CLOCKS" --eval-every 0)
      else
        flags+=(--clocks "$CLOCKS" --eval-every 20 --target-accuracy "$TARGET")
      fi
      [ "$kind" != all ] && flags+=(--fanout 4)
      sel=0; avg=0
      [ "$variant" = selavg ] && { flags+=(--select "$SELECT" --average-every "$AVERAGE"); sel=$SELECT; avg=$AVERAGE; }
      m="$RAW/scale_${p}_${kind}_${variant}.jsonl"
      [ "${REUSE:-0}" = 1 ] && tail -1 "$m" 2>/dev/null | grep -q '"summary"' ||
      "$ORPHEUS" simulate --ranks "$p" "${data[@]}" "${flags[@]}" --metrics "$m" >/dev/null
      clocks=$(field "$m" clocks); secs=$(field "$m" seconds); per=$(field "$m" seconds_per_clock)
      bpw=$(field "$m" bytes_per_worker_per_clock); comp=$(field "$m" compute_seconds_per_worker_per_clock)
      realsec=$(field "$m" real_seconds); rss=$(field "$m" peak_rss_mb)
      reached=1
      [ "$(field "$m" reached_target)" = true ] || reached=0
      extra=0
      if [ $capped = 1 ]; then
        # The clocks to target of the largest P run in full, at this P's seconds per clock.
        clocks="~${full_clocks[$variant]:-$CLOCKS}"
        secs="~$(/usr/bin/python3 -c "print(f'{${full_clocks[$variant]:-$CLOCKS} * $per:.4g}')")"
        extra=1
      elif [ "$kind" = all ]; then
        full_clocks[$variant]=$clocks
      fi
      [ $capped = 1 ] && reached=1
      shown=$clocks
      [ $reached = 1 ] || shown="$clocks, not reached (accuracy $(field "$m" test_accuracy))"
      # MLR on Fashion-MNIST: n = 10 x 784 floats; ring all-reduce on the same model (5 us latency).
      dense=$(/usr/bin/python3 -c "p=$p; n=7840*4; bw=$GBPS*1e9/8; print(f'{$comp + 2*(p-1)*(5e-6 + n/p/bw):.3g}')")
      echo "| $p | $kind | $sel | $avg | $shown | $secs | $per | $bpw | $dense | $(printf %.0f "$realsec") | $(printf %.0f "$rss") |"
      echo "$p,$kind,$sel,$avg,${clocks#\~},${secs#\~},$per,$bpw,$dense,$extra,$reached" >>"$RES/simulate_scaling.csv"
    done
  done
done
echo
echo "Broadcast at P >= $BCAST_CAP_P ran $BCAST_CLOCKS clocks (every replica applies every batch: P^2 work per"
echo "clock in real time); its clocks and time to target (~) are extrapolated from the largest P run in full."
}

mlp() {
echo "## The small MLP at P = $MLP_P (scripts/bench/mlp_small.loss, random multicast Q = 4, batch $BATCH)"
echo
m="$RAW/mlp_$MLP_P.jsonl"
"$ORPHEUS" simulate --ranks "$MLP_P" "${data[@]}" --model "$ROOT/scripts/bench/mlp_small.loss" --clocks "$MLP_CLOCKS" \
  --batch "$BATCH" --multicast random --fanout 4 --eval-every 0 --sim-link-gbps "$GBPS" --metrics "$m" >/dev/null
echo "| P | clocks | simulated s/clock | bytes/worker/clock | test accuracy | real s | peak MB |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
echo "| $MLP_P | $(field "$m" clocks) | $(field "$m" seconds_per_clock) | $(field "$m" bytes_per_worker_per_clock) |" \
  "$(field "$m" test_accuracy) | $(printf %.0f "$(field "$m" real_seconds)") | $(printf %.0f "$(field "$m" peak_rss_mb)") |"
}

# Each part writes its section; simulate.md is the sections there are, so a part can be rerun alone.
for part in calibration scaling mlp; do
  if has_part "$part"; then "$part" | tee "$RES/simulate_$part.md"; fi
done
{
  echo "# orpheus simulate: calibration and scaling"
  for part in calibration scaling mlp; do
    [ -f "$RES/simulate_$part.md" ] && { echo; cat "$RES/simulate_$part.md"; }
  done
} >"$RES/simulate.md"
has_part scaling || exit 0

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
        line, = ax[0].plot([int(r["P"]) for r in rs], [float(r["seconds"]) for r in rs], marker="o", label=label)
        # Extrapolated points (broadcast at large P) hollow; runs that missed the target crossed.
        ex = [r for r in rs if r.get("extrapolated") == "1"]
        ax[0].plot([int(r["P"]) for r in ex], [float(r["seconds"]) for r in ex], linestyle="none", marker="o",
                   markerfacecolor="white", color=line.get_color())
        missed = [r for r in rs if r.get("reached") == "0"]
        ax[0].plot([int(r["P"]) for r in missed], [float(r["seconds"]) for r in missed], linestyle="none",
                   marker="X", markersize=9, color=line.get_color())
        ax[1].plot([int(r["P"]) for r in rs], [float(r["bytes_per_worker"]) for r in rs], marker="o", label=label)
ax[0].set(xscale="log", yscale="log", xlabel="P", ylabel="simulated seconds to target")
ax[0].set_title("hollow: extrapolated; X: target not reached (seconds of all clocks)", fontsize=9)
ax[1].set(xscale="log", yscale="log", xlabel="P", ylabel="bytes per worker per clock")
ax[0].legend(fontsize=7)
fig.tight_layout()
fig.savefig(sys.argv[2])
PY
