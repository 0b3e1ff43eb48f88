#!/usr/bin/env bash
# Benchmark: the KJV LSTM language model (examples/lstm.loss) in Orpheus against
# PyTorch's nn.LSTM + DDP over gloo on the same data, model, shards, streams and
# SGD step (scripts/bench/lstm_torch.py), in one run:
#   (a) validation perplexity against examples processed, every EVAL_EVERY clocks,
#       for torch-ddp, torch-powersgd (PowerSGD at rank PSGD_RANK with blocking all-reduces,
#       as torch's hook computes it: scripts/bench/peers.py), orpheus-dense, orpheus-powersgd (--sync powersgd --sv-rank PSGD_RANK),
#       orpheus-svrank (--sv-rank PSGD_RANK: each worker's update at that rank, error feedback),
#       orpheus-broadcast (every SVG to every rank, BSP)
#       and orpheus-best (SELECT of the B examples per rank, each with its T steps, random multicast to FANOUT, SSP
#       STALENESS, averaging every AVERAGE): the final perplexities and their ratios;
#   (b) time to TARGET_PPL (training seconds, evaluations excluded) on each network of
#       NETWORKS: loopback (shared memory) and 1gbit (scripts/netcluster.sh, needs root);
#   (c) the SV economics per matrix: B*T*(J+K) floats of SVs against J*K of a dense
#       gradient, and the measured bytes per clock of each configuration;
#   (d) what selection selects (--select-unit): orpheus-select-example sends SELECT
#       whole examples (each with its T steps), orpheus-select-step SELECT*T
#       (example, step) pairs chosen by JMCSS over all B*T; both broadcast under BSP,
#       the same SV pairs (bytes apart from the least-squares cores, measured):
#       perplexity after CLOCKS clocks and bytes per clock side by side.
# Every configuration runs REPS times, interleaved (repetition r runs them all before
# r + 1 starts), so drifts of the machine fall on all alike; the tables give the
# median and the range (min-max) over the repetitions.
# Prints markdown and writes it to RESULTS, and the perplexity curves to RESULTS with .png
# for .md (scripts/bench/plot_lstm.py).
#
# Usage: scripts/bench/lstm_vs_torch.sh       (or scripts/bench/run.sh lstm)
# Environment (defaults in brackets): NP [4], BATCH [20] streams per rank, STEPS [35],
#   VOCAB [2000], CLOCKS [2000], LR [0.1], EVAL_EVERY [100], TARGET_PPL [200],
#   SELECT [5], FANOUT [2], STALENESS [4], AVERAGE [50], PSGD_RANK [4], NETWORKS [loopback,1gbit],
#   REPS [2], CONFIGS [all: torch-ddp,orpheus-dense,orpheus-broadcast,orpheus-best,
#   orpheus-select-example,orpheus-select-step; also torch-powersgd,orpheus-powersgd,orpheus-svrank], BUILD_DIR [build],
#   RESULTS [scripts/bench/results/lstm_vs_torch.md],
#   KEEP_RAW [0]: 1 keeps the metrics files and prints where they are,
#   RUN_TIMEOUT [1800] seconds one Orpheus run may take, LAUNCH_TIMEOUT [120] seconds
#   until its metrics file must exist (else the launch is retried once).
# The model's sizes are examples/lstm.loss's (embed = hidden = 128).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NP="${NP:-4}"; BATCH="${BATCH:-20}"; STEPS="${STEPS:-35}"; VOCAB="${VOCAB:-2000}"
CLOCKS="${CLOCKS:-2000}"; LR="${LR:-0.1}"; EVAL_EVERY="${EVAL_EVERY:-100}"; TARGET_PPL="${TARGET_PPL:-200}"
SELECT="${SELECT:-5}"; FANOUT="${FANOUT:-2}"; STALENESS="${STALENESS:-4}"; AVERAGE="${AVERAGE:-50}"
PSGD_RANK="${PSGD_RANK:-4}"
NETWORKS="${NETWORKS:-loopback,1gbit}"; REPS="${REPS:-2}"; RUN_TIMEOUT="${RUN_TIMEOUT:-1800}"; LAUNCH_TIMEOUT="${LAUNCH_TIMEOUT:-120}"
CONFIGS="${CONFIGS:-torch-ddp,orpheus-dense,orpheus-broadcast,orpheus-best,orpheus-select-example,orpheus-select-step}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
RESULTS="${RESULTS:-$ROOT/scripts/bench/results/lstm_vs_torch.md}"
PYTHON=/usr/bin/python3
ORPHEUS="$BUILD_DIR/engine/orpheus"
EMBED=128; HIDDEN=128

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1

say() { echo "lstm_vs_torch: $*" >&2; }
[ -x "$ORPHEUS" ] || { say "missing $ORPHEUS (build first)"; exit 2; }
"$PYTHON" -c 'import torch' 2>/dev/null || { say "missing python3-torch"; exit 2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/orpheus-bench.XXXXXX")"
if [ "${KEEP_RAW:-0}" = 1 ]; then say "raw runs in $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
"$ROOT/scripts/data/make_tokens.sh" "$WORK/kjv" --vocab "$VOCAB" --steps "$STEPS" >&2
TRAIN="$WORK/kjv/kjv.train.tokens"; VALID="$WORK/kjv/kjv.valid.tokens"

common=(--model "$ROOT/examples/lstm.loss" --train "$TRAIN" --test "$VALID" --batch "$BATCH" --clocks "$CLOCKS"
  --lr "$LR" --eval-every "$EVAL_EVERY" --progress off --log-level warn)
declare -A FLAGS=(
  [orpheus-dense]="--sync dense"
  [orpheus-powersgd]="--sync powersgd --sv-rank $PSGD_RANK"
  [orpheus-svrank]="--sync sv --sv-rank $PSGD_RANK"
  [orpheus-broadcast]="--sync sv"
  [orpheus-best]="--sync sv --select $SELECT --multicast random --fanout $FANOUT --consistency ssp --staleness $STALENESS --average-every $AVERAGE"
  [orpheus-select-example]="--sync sv --select $SELECT --select-unit example"
  [orpheus-select-step]="--sync sv --select $((SELECT * STEPS)) --select-unit step"
)
IFS=, read -ra CONFIG_LIST <<<"$CONFIGS"

run_torch() {  # NETWORK FILE CONFIG
  local net=$1 file=$2 torch_cmd
  torch_cmd=("$PYTHON" "$ROOT/scripts/bench/lstm_torch.py" --train "$TRAIN" --valid "$VALID" --ranks "$NP"
    --batch "$BATCH" --clocks "$CLOCKS" --lr "$LR" --eval-every "$EVAL_EVERY" --embed "$EMBED" --hidden "$HIDDEN")
  if [ "$3" = torch-powersgd ]; then torch_cmd+=(--powersgd "$PSGD_RANK"); fi
  if [ "$net" = 1gbit ]; then
    local pids=() i
    for ((i = 0; i < NP; i++)); do
      "$ROOT/scripts/netcluster.sh" exec "$i" env GLOO_SOCKET_IFNAME=eth0 "${torch_cmd[@]}" --rank "$i" --master 198.18.0.1 \
        >"$file.$i" &
      pids+=($!)
    done
    wait "${pids[@]}"
    mv "$file.0" "$file"
    rm -f "$file".[0-9]*
  else
    "${torch_cmd[@]}" --ddp >"$file"
  fi
}

# run_orpheus METRICS MPIRUN-ARGS...: one Orpheus run writing METRICS. A launch in the
# emulated cluster can hang before any rank starts: when no metrics file appears
# within LAUNCH_TIMEOUT seconds the launch is killed and tried once more; a run that
# started and fails, or exceeds RUN_TIMEOUT, ends the benchmark.
run_orpheus() {
  local metrics=$1 try pid waited
  shift
  for try in 1 2; do
    rm -f "$metrics"
    timeout "$RUN_TIMEOUT" mpirun -np "$NP" --oversubscribe "$@" --metrics "$metrics" >&2 &
    pid=$!
    waited=0
    while [ ! -e "$metrics" ] && [ "$waited" -lt "$LAUNCH_TIMEOUT" ] && kill -0 "$pid" 2>/dev/null; do
      sleep 1; waited=$((waited + 1))
    done
    if [ -e "$metrics" ] || ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" && return 0
      say "run failed: $*"; exit 1
    fi
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
    say "no rank started within ${LAUNCH_TIMEOUT}s (try $try of 2)"
  done
  exit 1
}

run_net() {  # NETWORK: every configuration REPS times, interleaved; metrics under $WORK/NETWORK/
  local net=$1 dir="$WORK/$1" launch=() rep config
  mkdir -p "$dir"
  if [ "$net" = 1gbit ]; then
    [ "$(id -u)" -eq 0 ] || { say "1gbit needs root; skipped"; return 0; }
    "$ROOT/scripts/netcluster.sh" up "$NP" --rate 1gbit >&2
    # shellcheck disable=SC2207
    launch=($("$ROOT/scripts/netcluster.sh" mpirun-args))
  fi
  for ((rep = 1; rep <= REPS; rep++)); do
    for config in "${CONFIG_LIST[@]}"; do
      say "$net $config (repetition $rep of $REPS)"
      if [[ "$config" == torch-* ]]; then
        run_torch "$net" "$dir/$config.$rep.jsonl" "$config"
        continue
      fi
      # shellcheck disable=SC2086
      run_orpheus "$dir/$config.$rep.jsonl" "${launch[@]}" "$ORPHEUS" train "${common[@]}" ${FLAGS[$config]}
    done
  done
  if [ "$net" = 1gbit ]; then "$ROOT/scripts/netcluster.sh" down >&2; fi
}

IFS=, read -ra NETS <<<"$NETWORKS"
for net in "${NETS[@]}"; do run_net "$net"; done

"$PYTHON" - "$WORK" "$TARGET_PPL" "$BATCH" "$STEPS" "$VOCAB" "$EMBED" "$HIDDEN" "$NP" "$REPS" "$CLOCKS" "$SELECT" \
  "$CONFIGS" "${NETS[@]}" <<'PY' | tee "$RESULTS"
import json, os, statistics, sys
work, target = sys.argv[1], float(sys.argv[2])
b, t, v, d, h, p, reps, clocks, select = (int(x) for x in sys.argv[3:12])
configs = sys.argv[12].split(",")
nets = sys.argv[13:]

def curve(path):
    points, summary = [], {}
    if not os.path.exists(path):
        return points, summary
    for line in open(path):
        r = json.loads(line)
        if r.get("summary"):
            summary = r
        elif "valid_perplexity" in r:
            points.append((r["clock"], r["seconds"], r["valid_perplexity"]))
        elif "test_perplexity" in r:
            points.append((r["clock"], r["seconds"], r["test_perplexity"]))
    return points, summary

def runs(net, c):
    return [curve(os.path.join(work, net, f"{c}.{r}.jsonl")) for r in range(1, reps + 1)]

def spread(values, fmt):
    values = [x for x in values if x is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt % med
    return f"{fmt % med} ({fmt % min(values)}-{fmt % max(values)})"

print(f"# LSTM language model on the KJV: Orpheus against PyTorch DDP (np {p}, B {b}, T {t}, vocabulary {v})\n")
print(f"Each cell: the median over {reps} interleaved repetitions, and (min-max).\n")
for net in nets:
    print(f"## {net}\n")
    print("| configuration | clocks | examples | final perplexity | ratio to torch | seconds to ppl "
          f"{target:g} | bytes per clock |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    base = None
    finals = {}
    for c in configs:
        done = [(pts, s) for pts, s in runs(net, c) if pts]
        if not done:
            print(f"| {c} | - | - | - | - | - | - |")
            continue
        clock = done[0][0][-1][0]
        ppls = [pts[-1][2] for pts, _ in done]
        finals[c] = statistics.median(ppls)
        base = finals[c] if c == "torch-ddp" else base
        reach = [next((s for _, s, q in pts if q <= target), None) for pts, _ in done]
        reached = [x for x in reach if x is not None]
        reach_text = spread(reached, "%.1f") + ("" if len(reached) == len(reach) else
                                                 f", not reached in {len(reach) - len(reached)}")
        ratio = f"{finals[c] / base:.3f}" if base else "-"
        bpc = spread([s.get("bytes_per_clock") for _, s in done], "%.0f")
        print(f"| {c} | {clock} | {clock * b * p} | {spread(ppls, '%.2f')} | {ratio} | "
              f"{reach_text if reached else 'not reached'} | {bpc} |")
    print()
    print("perplexity against examples (clock x B x P), medians:\n")
    print("| examples | " + " | ".join(configs) + " |")
    print("| --- " * (len(configs) + 1) + "|")
    curves = {}
    for c in configs:
        by_clock = {}
        for pts, _ in runs(net, c):
            for k, _, q in pts:
                by_clock.setdefault(k, []).append(q)
        curves[c] = {k: statistics.median(q) for k, q in by_clock.items()}
    for k in sorted(set().union(*[set(x) for x in curves.values()])):
        print(f"| {k * b * p} | " + " | ".join(f"{curves[c][k]:.2f}" if k in curves[c] else "-" for c in configs)
              + " |")
    print()
    if "orpheus-select-example" in finals and "orpheus-select-step" in finals:
        print(f"selection unit ({net}): {select} whole examples against {select * t} (example, step) pairs per rank "
              f"and clock, perplexity after {clocks} clocks: example {finals['orpheus-select-example']:.2f}, "
              f"step {finals['orpheus-select-step']:.2f} (step / example "
              f"{finals['orpheus-select-step'] / finals['orpheus-select-example']:.3f})\n")
print("## Where SVs stop paying (floats per clock per rank, before selection)\n")
print("| matrix | J x K | B*T*(J+K) | J*K | SVs / dense |")
print("| --- | --- | --- | --- | --- |")
for name, j, k, note in [("E (embedding; V one-hot, sparse)", d, v, "sparse"), ("W (gates)", 4 * h, d + h, ""),
                         ("V (output)", v, h, "")]:
    # A one-hot V column is stored as one index and one value.
    sv = b * t * (j + (2 if note else k))
    print(f"| {name} | {j} x {k} | {sv} | {j * k} | {sv / (j * k):.2f} |")
PY

plots=()
for net in "${NETS[@]}"; do [ -d "$WORK/$net" ] && plots+=("$net=$WORK/$net"); done
if "$PYTHON" -c 'import matplotlib' 2>/dev/null; then
  "$PYTHON" "$ROOT/scripts/bench/plot_lstm.py" "${RESULTS%.md}.png" $((BATCH * NP)) "${plots[@]}" >&2
else
  say "no plot: python3-matplotlib is not installed (scripts/bench/run.sh lstm installs it)"
fi
