#!/usr/bin/env bash
# Benchmark: one rank's clock of the KJV LSTM language model (examples/lstm.loss,
# embed = hidden = 128, vocabulary VOCAB, B = BATCH streams, T = STEPS), Orpheus against
# PyTorch's nn.LSTM on one process, one BLAS thread each, no network:
#   orpheus dense   orpheus train --sync dense (the dense gradient of the clock, one SGD step)
#   orpheus sv      orpheus train --sync sv (the clock's SVs, the rebuild of the own batch)
#   torch           scripts/bench/lstm_torch.py --ranks 1 (embedding, nn.LSTM, linear, summed
#                   cross-entropy, backward, SGD), the same data, init and step
#   baseline dense, baseline sv   the same two with BASELINE's orpheus (an older build), if given
# Orpheus: the mean clock_seconds from clock 6 on; torch: its training seconds over its
# clocks (evaluation excluded on both). Runs are interleaved (REPS rounds of every
# engine), so a drifting machine hits all alike; the table gives the median over the
# rounds and each round. Prints markdown and writes it to RESULTS.
#
# Usage: scripts/bench/lstm_step.sh
# Environment (defaults in brackets): REPS [3], CLOCKS [100], BATCH [20], STEPS [35],
#   VOCAB [2000], BUILD_DIR [build], BASELINE [none: a build folder, or an orpheus binary,
#   to weigh against], RESULTS [scripts/bench/results/lstm_step.md].
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REPS="${REPS:-3}"; CLOCKS="${CLOCKS:-100}"; BATCH="${BATCH:-20}"; STEPS="${STEPS:-35}"; VOCAB="${VOCAB:-2000}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
RESULTS="${RESULTS:-$ROOT/scripts/bench/results/lstm_step.md}"
PYTHON=/usr/bin/python3
ORPHEUS="$BUILD_DIR/engine/orpheus"
BASELINE="${BASELINE:-}"
[ -d "$BASELINE" ] && BASELINE="$BASELINE/engine/orpheus"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

say() { echo "lstm_step: $*" >&2; }
[ -x "$ORPHEUS" ] || { say "missing $ORPHEUS (build first)"; exit 2; }
[ -z "$BASELINE" ] || [ -x "$BASELINE" ] || { say "BASELINE: no orpheus binary at $BASELINE"; exit 2; }
"$PYTHON" -c 'import torch' 2>/dev/null || { say "missing python3-torch"; exit 2; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/orpheus-lstm-step.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
"$ROOT/scripts/data/make_tokens.sh" "$WORK/kjv" --vocab "$VOCAB" --steps "$STEPS" >&2
TRAIN="$WORK/kjv/kjv.train.tokens"; TEST="$WORK/kjv/kjv.test.tokens"

orpheus() {  # BINARY MODE ROUND: ms per clock
  local bin=$1; shift
  local metrics="$WORK/$1-$2.jsonl"
  "$bin" train --model "$ROOT/examples/lstm.loss" --train "$TRAIN" --test "$TEST" --batch "$BATCH" \
    --clocks "$CLOCKS" --lr 0.1 --eval-every 0 --threads 1 --progress off --log-level warn --sync "$1" \
    --metrics "$metrics" >/dev/null
  "$PYTHON" - "$metrics" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{1e3 * statistics.mean(r['clock_seconds'] for r in rows if 'clock' in r and not r.get('summary') and r['clock'] > 5):.2f}")
EOF
}
torch() {
  "$PYTHON" "$ROOT/scripts/bench/lstm_torch.py" --train "$TRAIN" --valid "$TEST" --ranks 1 --batch "$BATCH" \
    --clocks "$CLOCKS" --lr 0.1 --eval-every 0 --embed 128 --hidden 128 >"$WORK/torch.jsonl"
  "$PYTHON" - "$WORK/torch.jsonl" <<'EOF'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
print(f"{1e3 * r['seconds'] / r['clocks']:.2f}")
EOF
}

declare -A ms
engines=(dense sv torch)
[ -z "$BASELINE" ] || engines=(baseline-dense dense baseline-sv sv torch)
for ((r = 1; r <= REPS; r++)); do
  for engine in "${engines[@]}"; do
    case $engine in
      torch) v=$(torch) ;;
      baseline-*) v=$(orpheus "$BASELINE" "${engine#baseline-}" "b$r") ;;
      *) v=$(orpheus "$ORPHEUS" "$engine" "$r") ;;
    esac
    ms[$engine]+="$v "
    say "round $r: $engine $v ms"
  done
done

{
  echo "# One rank's LSTM clock: Orpheus against PyTorch"
  echo
  echo "examples/lstm.loss (embed = hidden = 128), KJV vocabulary $VOCAB, B $BATCH, T $STEPS, one process, one BLAS thread, $CLOCKS clocks a run, $REPS interleaved rounds; $(date -u +%F), $(hostname), $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); orpheus $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)${BASELINE:+, baseline $BASELINE}."
  echo
  echo "| engine | ms per clock (median of rounds) | each round | vs torch |"
  echo "| --- | ---: | --- | ---: |"
  args=()
  for engine in "${engines[@]}"; do args+=("$engine" "${ms[$engine]}"); done
  "$PYTHON" - "${args[@]}" <<'EOF'
import statistics, sys
names = sys.argv[1::2]
runs = [[float(v) for v in a.split()] for a in sys.argv[2::2]]
torch = statistics.median(runs[names.index("torch")])
names = [n if n == "torch" else "orpheus " + n.replace("baseline-", "") + (" (baseline)" if "baseline" in n else "")
         for n in names]
for name, r in zip(names, runs):
    m = statistics.median(r)
    print(f"| {name} | {m:.1f} | {', '.join(f'{v:.1f}' for v in r)} | {m / torch:.2f}x |")
EOF
} | tee "$RESULTS"
