#!/usr/bin/env bash
# adapt_bf16.sh ORPHEUS COMPARE MPIEXEC: --adapt-bf16 at np 3 (MLR on Fashion-MNIST,
# random multicast, averaging, timing from a recorded trace), under a budget that
# f32 SVs meet only at a smaller C:
#  - the controller meets it by sending U and V as bf16 (the start decision, and the
#    summary's final_sv_dtype), keeping C at the top of its bounds, and no clock
#    sends more than the budget per rank;
#  - restore --clock T equals, bitwise, a run of T clocks;
#  - a job stopped at clock 135 and resumed to 300 equals the whole run, bitwise: the
#    resumed job takes the bf16 knob back from its log.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
budget=100000
adapt_flags $budget 24
train() { "$mpiexec" -n 3 --oversubscribe "$orpheus" train "${flags[@]}" "$@" >/dev/null; }

train --clocks 300 --adapt-bf16 --ckpt sv --ckpt-dir "$out/whole" --save "$out/whole.h5" --metrics "$out/whole.jsonl"
train --clocks 300 --metrics "$out/f32.jsonl"
/usr/bin/python3 - "$out/whole.jsonl" "$out/f32.jsonl" $budget 3 <<'PY'
import json, sys
def read(path):
    lines = [json.loads(l) for l in open(path)]
    clocks = [l for l in lines if "clock" in l and not l.get("decision") and not l.get("summary")]
    return lines, clocks
lines, clocks = read(sys.argv[1])
_, f32 = read(sys.argv[2])
budget, ranks = float(sys.argv[3]), int(sys.argv[4])
summary = lines[-1]
assert summary["final_sv_dtype"] == "bf16", summary
assert all(d["sv_dtype"] == "bf16" for d in lines if d.get("decision")), "a decision went back to f32"
for l in clocks:
    if not l.get("averaged"):
        assert l["bytes_sent"] / ranks <= budget, l
first, first32 = clocks[0]["bytes_sent"] / ranks, f32[0]["bytes_sent"] / ranks
# f32 meets the budget with fewer SVGs; bf16 sends more of them in fewer bytes.
assert first <= budget and first32 <= budget, (first, first32)
print(f"clock 1: {first:.0f} B per rank in bf16, {first32:.0f} B in f32 (budget {budget:.0f}); "
      f"final C: bf16 {summary['final_select']}, f32 {read(sys.argv[2])[0][-1]['final_select']}")
PY
train --clocks 135 --adapt-bf16 --save "$out/run135.h5"
"$orpheus" restore --ckpt-dir "$out/whole" --clock 135 --out "$out/restored135.h5"
"$compare" "$out/restored135.h5" "$out/run135.h5" 0
train --clocks 135 --adapt-bf16 --ckpt sv --ckpt-dir "$out/part"
train --clocks 300 --adapt-bf16 --ckpt sv --ckpt-dir "$out/part" --resume --save "$out/resumed.h5"
"$compare" "$out/resumed.h5" "$out/whole.h5" 0
