#!/usr/bin/env bash
# balance.sh ORPHEUS MPIEXEC: --balance at np 3 (BSP) with rank 1 slowed by
# --inject-delay. From the metrics, not from wall time:
#  - every decision is a record; the first moves chunks off rank 1, whose chunk
#    count and minibatch go down and stay down, while the global batch stays P*B;
#  - --resume takes up the ownership the log holds at its clock (the record it
#    writes names the same owners as the killed job's last decision), and
#    `orpheus restore` reports that same ownership at any clock.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
orpheus=$1; mpiexec=$2
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
flags=(--train "synthetic:examples=6000,features=50,classes=5" --batch 20 --progress off --log-level warn
       --balance --balance-every 5 --chunk-rows 100 --inject-delay 1:30 --ckpt sv --ckpt-dir "$out/ckpt")
"$mpiexec" -n 3 --oversubscribe "$orpheus" train "${flags[@]}" --clocks 30 --metrics "$out/first.jsonl" >/dev/null
"$mpiexec" -n 3 --oversubscribe "$orpheus" train "${flags[@]}" --clocks 40 --metrics "$out/resumed.jsonl" --resume \
  >/dev/null
job_records "$orpheus" "$out/ckpt" chunks >"$out/chunks"
head -1 "$out/chunks" | grep -qx "layout rows 100 shards 2000 2000 2000" || { echo "bad chunk log layout"; exit 1; }
"$orpheus" restore --ckpt-dir "$out/ckpt" --clock 30 --out "$out/at30.h5" >"$out/restore30.txt"
"$orpheus" restore --ckpt-dir "$out/ckpt" --clock 12 --out "$out/at12.h5" >"$out/restore12.txt"
cat "$out/chunks" "$out/restore30.txt" "$out/restore12.txt"

/usr/bin/python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
def records(name):
    return [json.loads(l) for l in open(f"{out}/{name}") if '"rebalance"' in l]
first = records("first.jsonl")
assert [r["clock"] for r in first] == [5, 10, 15, 20, 25], [r["clock"] for r in first]
for r in first:
    assert sum(r["batch"]) == 60, r
    assert sum(r["chunks"]) == 60, r
    assert len(r["seconds_per_example"]) == 3 and min(r["seconds_per_example"]) > 0, r
    # The slowed rank stays below its starting share: 20 chunks, a batch of 20.
    assert r["chunks"][1] < 20 and r["batch"][1] < 20, r
d = first[0]
assert d["moves"] >= 1, d
assert d["seconds_per_example"][1] > max(d["seconds_per_example"][0], d["seconds_per_example"][2]), d
froms = [int(m.split(":")[1].split(">")[0]) for m in d["moved"].split()]
assert froms and froms.count(1) > len(froms) / 2, d["moved"]
print("chunks per rank after each decision:", [r["chunks"] for r in first])
print("batch per rank after each decision:", [r["batch"] for r in first])

resumed = records("resumed.jsonl")
start = [r for r in resumed if r.get("resumed")]
assert len(start) == 1 and start[0]["clock"] == 30, start
assert start[0]["owners"] == first[-1]["owners"], (start[0], first[-1])
assert start[0]["chunks"] == first[-1]["chunks"] and start[0]["batch"] == first[-1]["batch"]
assert [r["clock"] for r in resumed if not r.get("resumed")] == [35], resumed

def restored(name):
    line = [l for l in open(f"{out}/{name}") if l.startswith("data chunks at clock")]
    assert len(line) == 1, name
    return re.search(r"owners (\S+)\)", line[0]).group(1)
assert restored("restore30.txt") == first[-1]["owners"]
assert restored("restore12.txt") == first[1]["owners"]  # the decision at clock 10
PY
