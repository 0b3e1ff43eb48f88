#!/usr/bin/env bash
# adapt.sh ORPHEUS COMPARE MPIEXEC: --adapt at np 3 (BSP, MLR on Fashion-MNIST,
# random multicast, averaging), its timing replayed from a recorded trace
# (--adapt-trace) so that the decisions repeat run after run:
#  - C, Q and R change during the run, each decision a metrics line with its reason
#    and the errors e(c) measured for it (C moves by goodput);
#  - no clock sends more than --max-bytes-per-clock per rank (averaging clocks
#    amortized: over the run, the mean stays under it too);
#  - restore --clock T equals, bitwise, a run of T clocks, and latest equals every
#    replica saved at the end;
#  - kill -9 mid-run and --resume: the final parameters equal the whole run's,
#    bitwise, which needs the resumed job to take up the knobs its log recorded.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'pkill -9 -f "ckpt-dir $out" 2>/dev/null || true; rm -rf "$out"' EXIT
budget=200000
adapt_flags $budget 25
train() { "$mpiexec" -n 3 --oversubscribe "$orpheus" train "${flags[@]}" "$@" >/dev/null; }

mkdir -p "$out/replicas"
train --clocks 300 --ckpt sv --ckpt-dir "$out/whole" --save "$out/whole.h5" --save-replicas "$out/replicas" \
  --metrics "$out/whole.jsonl"

/usr/bin/python3 - "$out/whole.jsonl" $budget 3 <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
budget, ranks = float(sys.argv[2]), int(sys.argv[3])
decisions = [l for l in lines if l.get("decision")]
clocks = [l for l in lines if "clock" in l and not l.get("decision") and not l.get("summary")]
assert len(clocks) == 300, len(clocks)
assert len(decisions) == 29, len(decisions)
assert all(d["reason"] for d in decisions)
changed = [d for d in decisions if d["changed"]]
for knob in ("select", "fanout", "average_every"):
    assert len({d[knob] for d in decisions}) >= 2, f"{knob} never changed"
assert all(d["predicted_bytes_per_clock"] <= budget for d in decisions)
# The goodput rule moves C on the errors measured at each decision's clock.
assert any(d["rule"] == "goodput" and d["changed"] for d in decisions)
for d in decisions:
    assert len(d["errors"]) == 3 and all(0.0 <= e <= 1.0 for e in d["errors"]), d
    assert d["errors"][0] >= d["errors"][2], d  # fewer SVGs never keep more
for l in clocks:
    if not l.get("averaged"):
        assert l["bytes_sent"] / ranks <= budget, l
total = sum(l["bytes_sent"] for l in clocks) / ranks / len(clocks)
assert total <= budget, total
print(f"{len(changed)} of {len(decisions)} decisions changed knobs; mean {total:.0f} B per rank per clock")
for d in changed[:6]: print(f'  clock {d["clock"]}: {d["rule"]}: {d["reason"]}')
PY

# restore(T) replays the knob changes: bitwise a run of T clocks, and the end.
train --clocks 135 --save "$out/run135.h5"
"$orpheus" restore --ckpt-dir "$out/whole" --clock 135 --out "$out/restored135.h5"
"$compare" "$out/restored135.h5" "$out/run135.h5" 0
for r in 0 1 2; do
  "$orpheus" restore --ckpt-dir "$out/whole" --replica $r --clock latest --out "$out/latest$r.h5"
  "$compare" "$out/latest$r.h5" "$out/replicas/replica-$r.h5" 0
done

# Resume after kill -9: the knobs come back from the log.
"$mpiexec" -n 3 --oversubscribe "$orpheus" train "${flags[@]}" --clocks 300 --ckpt sv --ckpt-dir "$out/killed" \
  --save "$out/resumed.h5" --inject-delay 0:10 >/dev/null 2>&1 &
job=$!
# Kill every process once a few segments are durable.
wait_for_segments "$out/killed/replica-0" 2 || true
kill_job "ckpt-dir $out/killed" "$job"
[ ! -e "$out/resumed.h5" ] || { echo "the job finished before it was killed"; exit 1; }
train --clocks 300 --ckpt sv --ckpt-dir "$out/killed" --save "$out/resumed.h5" --resume
"$compare" "$out/resumed.h5" "$out/whole.h5" 0
