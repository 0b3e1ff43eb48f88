#!/usr/bin/env bash
# simulate.sh ORPHEUS COMPARE CHECK MPIEXEC CHECKS...: orpheus simulate against the
# real engine. Each check:
#   bitwise        P = 4, BSP, no selection: broadcast and random multicast (Q = 2),
#                  and an LSTM on token streams, give bitwise the parameters of real
#                  np-4 runs (same flags, same seed).
#   messages:P     P workers, 3 clocks of MLR (batch 10): every clock sends exactly P*Q
#                  messages under random multicast (Q = 4) and P(P-1) under broadcast.
#   memory:P:MB    P workers of MLR under random multicast (Q = 4): peak RSS <= MB.
#   mlp-memory:P:MB  P workers of the small MLP (scripts/bench/mlp_small.loss), random
#                  multicast (Q = 4): peak RSS <= MB.
#   ssp            P = 8 under SSP (s = 2, random multicast, given compute): two runs
#                  give bitwise the same parameters (batches applied in virtual-time order).
#   cores          the CPU-share model: P = 8 on 2 simulated cores computes 4 times as
#                  long per clock as on a core each (given compute, so exactly).
#   peers          P = 8, one worker slowed 2x (--sim-slow), given compute: BSP waits for
#                  it; --sync powersgd pays two all-reduces a clock, ring or tree, and
#                  --sync dense one, each step the latency (computed by hand).
set -euo pipefail
orpheus=$1; compare=$2; check=$3; mpiexec=$4; shift 4
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
train="$data/train-images-idx3-ubyte.gz"
common=(--train "$train" --progress off --log-level warn --seed 11)

for c in "$@"; do
  IFS=: read -r what p bound <<<"$c"
  case "$what" in
    bitwise)
      for m in "all" "random --fanout 2"; do
        # shellcheck disable=SC2086
        "$mpiexec" -n 4 --oversubscribe "$orpheus" train "${common[@]}" --clocks 30 --batch 50 --multicast $m \
          --save "$out/real.h5" >/dev/null
        # shellcheck disable=SC2086
        "$orpheus" simulate --ranks 4 "${common[@]}" --clocks 30 --batch 50 --multicast $m --save "$out/sim.h5" >/dev/null
        echo "multicast $m:"
        "$compare" "$out/sim.h5" "$out/real.h5" 0
      done
      # A sequence model: the token streams cut as train cuts them (one per minibatch column).
      here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
      "$here/synthetic_tokens.sh" "$out/tokens"
      sed -e 's/^dim embed = .*/dim embed = 8/' -e 's/^dim hidden = .*/dim hidden = 8/' \
        "$here/../../examples/lstm.loss" >"$out/lstm.loss"
      lstm=(--model "$out/lstm.loss" --train "$out/tokens" --progress off --log-level warn --clocks 10 --batch 4)
      "$mpiexec" -n 4 --oversubscribe "$orpheus" train "${lstm[@]}" --save "$out/lstm-real.h5" >/dev/null
      "$orpheus" simulate --ranks 4 "${lstm[@]}" --save "$out/lstm-sim.h5" >/dev/null
      echo "lstm:"
      "$compare" "$out/lstm-sim.h5" "$out/lstm-real.h5" 0 ;;
    messages)
      q=4
      "$orpheus" simulate --ranks "$p" "${common[@]}" --clocks 3 --batch 10 --multicast random --fanout $q \
        --metrics "$out/random.jsonl" >/dev/null
      "$check" "$out/random.jsonl" "messages_per_clock_min>=$((p * q))" "messages_per_clock_max<=$((p * q))" \
        "in_degree_mean>=$q" "in_degree_mean<=$q"
      "$orpheus" simulate --ranks "$p" "${common[@]}" --clocks 3 --batch 10 --multicast all \
        --metrics "$out/all.jsonl" >/dev/null
      "$check" "$out/all.jsonl" "messages_per_clock_min>=$((p * (p - 1)))" "messages_per_clock_max<=$((p * (p - 1)))" \
        "seconds>=1e-9"
      echo "P = $p: $((p * q)) messages per clock (random, Q = $q), $((p * (p - 1))) (broadcast)" ;;
    memory)
      "$orpheus" simulate --ranks "$p" "${common[@]}" --clocks 3 --batch 10 --multicast random --fanout 4 \
        --test "$data/t10k-images-idx3-ubyte.gz" --metrics "$out/memory.jsonl"
      "$check" "$out/memory.jsonl" "peak_rss_mb<=$bound" "test_accuracy>=0.1" ;;
    mlp-memory)
      mlp="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/bench/mlp_small.loss"
      "$orpheus" simulate --ranks "$p" "${common[@]}" --model "$mlp" --clocks 3 --batch 10 --multicast random \
        --fanout 4 --test "$data/t10k-images-idx3-ubyte.gz" --metrics "$out/mlp.jsonl"
      "$check" "$out/mlp.jsonl" "peak_rss_mb<=$bound" "test_accuracy>=0.05" ;;
    ssp)
      for i in 1 2; do
        "$orpheus" simulate --ranks 8 "${common[@]}" --clocks 40 --batch 20 --multicast random --fanout 2 \
          --consistency ssp --staleness 2 --sim-compute-ms 2 --sim-threads 3 --save "$out/ssp$i.h5" >/dev/null
      done
      echo "SSP, two runs:"
      "$compare" "$out/ssp1.h5" "$out/ssp2.h5" 0 ;;
    cores)
      for c in 0 2; do
        "$orpheus" simulate --ranks 8 "${common[@]}" --clocks 5 --batch 10 --multicast random --fanout 2 \
          --sim-compute-ms 10 --sim-link-gbps 1000 --sim-latency-us 0 --sim-cores $c --metrics "$out/cores$c.jsonl" >/dev/null
      done
      # A core each: 10 ms per clock plus a few microseconds of wire; 2 cores for 8: 40 ms.
      "$check" "$out/cores0.jsonl" "seconds_per_clock>=0.0099" "seconds_per_clock<=0.0105" "cpu_slowdown_max<=1"
      "$check" "$out/cores2.jsonl" "seconds_per_clock>=0.0399" "seconds_per_clock<=0.0405" "cpu_slowdown_max>=4" ;;
    peers)
      # 10 ms a clock, 20 ms for the straggler; 100 us a message, the wire next to free.
      run() { "$orpheus" simulate --ranks 8 "${common[@]}" --clocks 5 --batch 10 --sim-compute-ms 10 --sim-slow 0.1:2 \
        --sim-link-gbps 1000 --sim-latency-us 100 "$@" >/dev/null; }
      run --sync powersgd --sv-rank 1 --sim-allreduce tree --metrics "$out/tree.jsonl"
      run --sync powersgd --sv-rank 1 --sim-allreduce ring --metrics "$out/ring.jsonl"
      run --sync dense --metrics "$out/dense.jsonl"
      # Tree: 2 all-reduces of 2 log2(8) = 6 steps; ring: of 2(8 - 1) = 14 steps.
      "$check" "$out/tree.jsonl" "seconds_per_clock>=0.0212" "seconds_per_clock<=0.0213"
      "$check" "$out/ring.jsonl" "seconds_per_clock>=0.0228" "seconds_per_clock<=0.0229"
      "$check" "$out/dense.jsonl" "seconds_per_clock>=0.0214" "seconds_per_clock<=0.0215" ;;
    *) echo "simulate.sh: unknown check '$c'" >&2; exit 2 ;;
  esac
done
