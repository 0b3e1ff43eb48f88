#!/usr/bin/env bash
# adapt_rank.sh ORPHEUS COMPARE MPIEXEC: --adapt with --sv-rank at np 3 (MLR on
# Fashion-MNIST, BSP broadcast, averaging every 10, timing from a recorded trace), the
# controller moving the rank r in place of C:
#  - under a budget that rank 3 does not meet, it starts at rank 2 (the start decision),
#    no clock sends more than the budget per rank, C stays "all", and the summary says
#    final_rank; without the budget the goodput rule moves r;
#  - restore --clock T equals, bitwise, a run of T clocks;
#  - a job stopped at clock 60 and resumed to 120 equals the whole run, bitwise: the
#    resumed job takes r back from its log and the error feedback from its checkpoint.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
trace=${ORPHEUS_TEST_DATA:-$(dirname "${BASH_SOURCE[0]}")/../data}/adapt/e2e_trace.jsonl
budget=28000
flags=(--train "$data/train-images-idx3-ubyte.gz" --batch 50 --sv-rank 3 --average-every 10 --progress off
       --log-level warn --adapt --adapt-every 10 --adapt-rank 1:6 --adapt-trace "$trace")
train() { "$mpiexec" -n 3 --oversubscribe "$orpheus" train "${flags[@]}" "$@" >/dev/null; }

train --clocks 120 --max-bytes-per-clock $budget --ckpt sv --ckpt-dir "$out/whole" --save "$out/whole.h5" \
  --metrics "$out/whole.jsonl"
train --clocks 120 --metrics "$out/free.jsonl"
/usr/bin/python3 - "$out/whole.jsonl" "$out/free.jsonl" $budget 3 <<'PY'
import json, sys
def read(path):
    lines = [json.loads(l) for l in open(path)]
    clocks = [l for l in lines if "clock" in l and not l.get("decision") and not l.get("summary")]
    return lines, clocks, [l for l in lines if l.get("decision")]
lines, clocks, decisions = read(sys.argv[1])
budget, ranks = float(sys.argv[3]), int(sys.argv[4])
summary = lines[-1]
assert all(d["select"] == 0 for d in decisions), "C moved under --sv-rank"
assert all(1 <= d["rank"] <= 2 for d in decisions), [d["rank"] for d in decisions]
assert 1 <= summary["final_rank"] <= 2, summary
for l in clocks:
    if not l.get("averaged"):
        assert l["bytes_sent"] / ranks <= budget, l
_, free_clocks, free = read(sys.argv[2])
ranks_free = [d["rank"] for d in free]
assert any(d["rule"] == "goodput" and d["changed"] for d in free), [(d["rule"], d["reason"]) for d in free]
# The rank in force (3 from the flag, then each decision's from the clock after it)
# is what the clocks send: more bytes at a higher rank.
by_rank, rank, pending = {}, 3, {d["clock"]: d["rank"] for d in free}
for l in free_clocks:
    if not l.get("averaged"):
        by_rank.setdefault(rank, []).append(l["bytes_sent"])
    rank = pending.get(l["clock"], rank)
means = sorted((r, sum(b) / len(b)) for r, b in by_rank.items())
assert len(means) >= 2 and all(a[1] < b[1] for a, b in zip(means, means[1:])), means
print(f"under the budget: r {[d['rank'] for d in decisions]}; without: r {ranks_free}, bytes by r {means}; "
      f"clock 1 sent {clocks[0]['bytes_sent'] / ranks:.0f} B per rank (budget {budget:.0f})")
PY
train --clocks 60 --max-bytes-per-clock $budget --save "$out/run60.h5"
"$orpheus" restore --ckpt-dir "$out/whole" --clock 60 --out "$out/restored60.h5"
"$compare" "$out/restored60.h5" "$out/run60.h5" 0
train --clocks 60 --max-bytes-per-clock $budget --ckpt sv --ckpt-dir "$out/part"
train --clocks 120 --max-bytes-per-clock $budget --ckpt sv --ckpt-dir "$out/part" --resume --save "$out/resumed.h5"
"$compare" "$out/resumed.h5" "$out/whole.h5" 0
echo "adapt-rank checks passed"
