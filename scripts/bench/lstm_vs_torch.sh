#!/usr/bin/env bash
# Benchmark: the KJV LSTM language model (examples/lstm.loss) in Orpheus against
# PyTorch's nn.LSTM + DDP over gloo on the same data, model, shards, streams and
# SGD step (scripts/bench/lstm_torch.py), in one run:
#   (a) validation perplexity against examples processed, every EVAL_EVERY clocks,
#       for torch-ddp, orpheus-dense, orpheus-broadcast (every SVG to every rank, BSP)
#       and orpheus-best (SELECT of the B examples per rank, each with its T steps, random multicast to FANOUT, SSP
#       STALENESS, averaging every AVERAGE): the final perplexities and their ratios;
#   (b) time to TARGET_PPL (training seconds, evaluations excluded) on each network of
#       NETWORKS: loopback (shared memory) and 1gbit (scripts/netcluster.sh, needs root);
#   (c) the SV economics per matrix: B*T*(J+K) floats of SVs against J*K of a dense
#       gradient, and the measured bytes per clock of each configuration.
# Prints markdown and writes it to RESULTS.
#
# Usage: scripts/bench/lstm_vs_torch.sh       (or scripts/bench/run.sh lstm)
# Environment (defaults in brackets): NP [4], BATCH [20] streams per rank, STEPS [35],
#   VOCAB [2000], CLOCKS [2000], LR [0.1], EVAL_EVERY [100], TARGET_PPL [200],
#   SELECT [5], FANOUT [2], STALENESS [4], AVERAGE [50], NETWORKS [loopback,1gbit],
#   BUILD_DIR [build], RESULTS [scripts/bench/results/lstm_vs_torch.md],
#   KEEP_RAW [0]: 1 keeps the metrics files and prints where they are.
# The model's sizes are examples/lstm.loss's (embed = hidden = 128).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NP="${NP:-4}"; BATCH="${BATCH:-20}"; STEPS="${STEPS:-35}"; VOCAB="${VOCAB:-2000}"
CLOCKS="${CLOCKS:-2000}"; LR="${LR:-0.1}"; EVAL_EVERY="${EVAL_EVERY:-100}"; TARGET_PPL="${TARGET_PPL:-200}"
SELECT="${SELECT:-5}"; FANOUT="${FANOUT:-2}"; STALENESS="${STALENESS:-4}"; AVERAGE="${AVERAGE:-50}"
NETWORKS="${NETWORKS:-loopback,1gbit}"
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
  [orpheus-broadcast]="--sync sv"
  [orpheus-best]="--sync sv --select $SELECT --multicast random --fanout $FANOUT --consistency ssp --staleness $STALENESS --average-every $AVERAGE"
)

run_net() {  # NETWORK: every configuration once, metrics under $WORK/NETWORK/
  local net=$1 dir="$WORK/$1" launch=() torch_cmd
  mkdir -p "$dir"
  if [ "$net" = 1gbit ]; then
    [ "$(id -u)" -eq 0 ] || { say "1gbit needs root; skipped"; return 0; }
    "$ROOT/scripts/netcluster.sh" up "$NP" --rate 1gbit >&2
    # shellcheck disable=SC2207
    launch=($("$ROOT/scripts/netcluster.sh" mpirun-args))
  fi
  for config in orpheus-dense orpheus-broadcast orpheus-best; do
    say "$net $config"
    # shellcheck disable=SC2086
    mpirun -np "$NP" --oversubscribe "${launch[@]}" "$ORPHEUS" train "${common[@]}" ${FLAGS[$config]} \
      --metrics "$dir/$config.jsonl" >&2
  done
  say "$net torch-ddp"
  torch_cmd=("$PYTHON" "$ROOT/scripts/bench/lstm_torch.py" --train "$TRAIN" --valid "$VALID" --ranks "$NP"
    --batch "$BATCH" --clocks "$CLOCKS" --lr "$LR" --eval-every "$EVAL_EVERY" --embed "$EMBED" --hidden "$HIDDEN")
  if [ "$net" = 1gbit ]; then
    local pids=() i
    for ((i = 0; i < NP; i++)); do
      "$ROOT/scripts/netcluster.sh" exec "$i" env GLOO_SOCKET_IFNAME=eth0 "${torch_cmd[@]}" --rank "$i" --master 198.18.0.1 \
        >"$dir/torch-ddp.$i.jsonl" &
      pids+=($!)
    done
    wait "${pids[@]}"
    mv "$dir/torch-ddp.0.jsonl" "$dir/torch-ddp.jsonl"
    "$ROOT/scripts/netcluster.sh" down >&2
  else
    "${torch_cmd[@]}" --ddp >"$dir/torch-ddp.jsonl"
  fi
}

IFS=, read -ra NETS <<<"$NETWORKS"
for net in "${NETS[@]}"; do run_net "$net"; done

"$PYTHON" - "$WORK" "$TARGET_PPL" "$BATCH" "$STEPS" "$VOCAB" "$EMBED" "$HIDDEN" "$NP" "${NETS[@]}" <<'PY' | tee "$RESULTS"
import json, os, sys
work, target = sys.argv[1], float(sys.argv[2])
b, t, v, d, h, p = (int(x) for x in sys.argv[3:9])
nets = sys.argv[9:]
configs = ["torch-ddp", "orpheus-dense", "orpheus-broadcast", "orpheus-best"]

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

print(f"# LSTM language model on the KJV: Orpheus against PyTorch DDP (np {p}, B {b}, T {t}, vocabulary {v})\n")
for net in nets:
    print(f"## {net}\n")
    print("| configuration | clocks | examples | final perplexity | ratio to torch | seconds to ppl "
          f"{target:g} | bytes per clock |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    base = None
    for c in configs:
        points, summary = curve(os.path.join(work, net, c + ".jsonl"))
        if not points:
            print(f"| {c} | - | - | - | - | - | - |")
            continue
        clock, _, ppl = points[-1]
        base = ppl if c == "torch-ddp" else base
        reach = next((s for _, s, q in points if q <= target), None)
        ratio = f"{ppl / base:.3f}" if base else "-"
        bpc = summary.get("bytes_per_clock", "-")
        print(f"| {c} | {clock} | {clock * b * p} | {ppl:.2f} | {ratio} | "
              f"{'%.1f' % reach if reach is not None else 'not reached'} | {bpc} |")
    print()
    print("perplexity against examples (clock x B x P):\n")
    print("| examples | " + " | ".join(configs) + " |")
    print("| --- " * (len(configs) + 1) + "|")
    curves = {c: {k: q for k, _, q in curve(os.path.join(work, net, c + ".jsonl"))[0]} for c in configs}
    for k in sorted(set().union(*[set(x) for x in curves.values()])):
        print(f"| {k * b * p} | " + " | ".join(f"{curves[c][k]:.2f}" if k in curves[c] else "-" for c in configs)
              + " |")
    print()
print("## Where SVs stop paying (floats per clock per rank, before selection)\n")
print("| matrix | J x K | B*T*(J+K) | J*K | SVs / dense |")
print("| --- | --- | --- | --- | --- |")
for name, j, k, note in [("E (embedding; V one-hot, sparse)", d, v, "sparse"), ("W (gates)", 4 * h, d + h, ""),
                         ("V (output)", v, h, "")]:
    # A one-hot V column is stored as one index and one value.
    sv = b * t * (j + (2 if note else k))
    print(f"| {name} | {j} x {k} | {sv} | {j * k} | {sv / (j * k):.2f} |")
PY
