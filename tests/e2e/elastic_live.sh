#!/usr/bin/env bash
# elastic_live.sh ORPHEUS COMPARE MPIEXEC: ranks leave a running np 4 BSP job (MLR on
# Fashion-MNIST) at a clock boundary (engine/membership/live.h).
#  1. SIGTERM to rank 2: the job finishes its clocks on 3 ranks with exit 0, records
#     membership epoch 1 at the change clock C and a `left` line with the release
#     latency; the leaver's process ends (bounded wait); `restore` of each replica at
#     the last clock equals the replica the rank held, bitwise; at C every replica is
#     the average; the old replica 3 is still restorable before C.
#  2. `orpheus ctl DIR shrink 1 3`: the job goes on with 2 ranks, the same checks.
#  3. `orpheus ctl DIR grow 2`: two spawned ranks join, the job ends on 6 ranks; the
#     new replicas start from the average at the change clock, and `restore` of
#     every replica at the last clock equals the replica the rank held, bitwise.
#  In each, the summary's bytes_sent and messages cover every epoch of the run.
#  4. ctl's bad input (a missing directory, an unknown rank, rank 0, no rank left,
#     growing by 0): one line, exit 2.
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d)
job=
trap '[ -n "$job" ] && kill -9 $(pgrep -P "$job" 2>/dev/null) "$job" 2>/dev/null; rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
clocks=300
flags=(--train "$data/train-images-idx3-ubyte.gz" --test "$data/t10k-images-idx3-ubyte.gz" --batch 50
       --clocks $clocks --eval-every 100 --progress off --ckpt sv --inject-delay 0:10)

# The pid of rank $2 of the mpiexec $1 (from its environment).
rankPid() {
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$p"; return; fi
  done
}
# Waits (bounded) until the metrics $1 have a record of clock $2 or later.
waitClock() {
  for _ in $(seq 600); do
    c=$(grep -o '"clock": [0-9]*' "$1" 2>/dev/null | tail -n 1 | grep -o '[0-9]*$' || true)
    [ -n "$c" ] && [ "$c" -ge "$2" ] && return 0
    kill -0 "$job" 2>/dev/null || { echo "the job ended before clock $2"; exit 1; }
    sleep 0.05
  done
  echo "no clock $2 within 30 s"; exit 1
}
# checkTotals METRICS and checkEnd DIR RANKS (tests/e2e/live_checks.sh).
source "$(dirname "${BASH_SOURCE[0]}")/live_checks.sh"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# checkRun DIR RANKS_LEFT OLD_RANK: the checks every live change passes.
checkRun() {
  local d=$1 ranks=$2 old=$3
  local at; at=$(grep -o '"left": true, "rank": [0-9]*, "clock": [0-9]*' "$d/m.jsonl" | head -n 1 | grep -o '[0-9]*$')
  [ -n "$at" ] || { echo "no left record in $d/m.jsonl"; exit 1; }
  grep -q '"release_seconds": ' "$d/m.jsonl"
  job_records "$orpheus" "$d/ckpt" epoch | grep -qx "epoch 1 clock $at ranks $ranks" \
    || { echo "membership: $(job_records "$orpheus" "$d/ckpt" epoch)"; exit 1; }
  checkEnd "$d" "$ranks"
  # At the change clock every replica of the new epoch is the average; before it the old ones stay.
  "$orpheus" restore --ckpt-dir "$d/ckpt" --replica 0 --clock "$at" --out "$d/at0.h5" >/dev/null
  "$orpheus" restore --ckpt-dir "$d/ckpt" --replica $((ranks - 1)) --clock "$at" --out "$d/atlast.h5" >/dev/null
  "$compare" "$d/at0.h5" "$d/atlast.h5" 0
  "$orpheus" restore --ckpt-dir "$d/ckpt" --replica "$old" --clock $((at - 1)) --out "$d/old.h5" >/dev/null
  echo "$d: left after clock $at, finished on $ranks ranks"
}
launch() {
  local d=$1; mkdir -p "$d/replicas"
  "$mpiexec" -n 4 --oversubscribe "$orpheus" train "${flags[@]}" --ckpt-dir "$d/ckpt" --metrics "$d/m.jsonl" \
    --save "$d/final.h5" --save-replicas "$d/replicas" >"$d/log" 2>&1 &
  job=$!
}

# 1. SIGTERM to rank 2.
launch "$out/term"
waitClock "$out/term/m.jsonl" 30
victim=$(rankPid "$job" 2)
[ -n "$victim" ] || { echo "no rank 2 under $job"; exit 1; }
kill -TERM "$victim"
noticed=$(date +%s.%N)
for _ in $(seq 1200); do kill -0 "$victim" 2>/dev/null || break; sleep 0.05; done
! kill -0 "$victim" 2>/dev/null || { echo "rank 2 did not exit within 60 s of its notice"; exit 1; }
echo "rank 2 exited $(echo "$(date +%s.%N) - $noticed" | bc -l | cut -c1-5) s after SIGTERM"
rc=0; wait "$job" || rc=$?
job=
[ "$rc" -eq 0 ] || { cat "$out/term/log"; echo "exit $rc"; exit 1; }
grep -q '"left": true, "rank": 2,' "$out/term/m.jsonl"
checkRun "$out/term" 3 3

# 2. orpheus ctl DIR shrink 1 3.
launch "$out/ctl"
waitClock "$out/ctl/m.jsonl" 30
"$orpheus" ctl "$out/ctl/ckpt" shrink 1 3
rc=0; wait "$job" || rc=$?
job=
[ "$rc" -eq 0 ] || { cat "$out/ctl/log"; echo "exit $rc"; exit 1; }
[ "$(grep -c '"left": true' "$out/ctl/m.jsonl")" -eq 2 ]
checkRun "$out/ctl" 2 3

# 3. orpheus ctl DIR grow 2: two spawned processes join (MPI_Comm_spawn), 4 -> 6 ranks.
launch "$out/grow"
waitClock "$out/grow/m.jsonl" 30
"$orpheus" ctl "$out/grow/ckpt" grow 2
rc=0; wait "$job" || rc=$?
job=
[ "$rc" -eq 0 ] || { cat "$out/grow/log"; echo "exit $rc"; exit 1; }
at=$(grep -o '"joined": 2, "clock": [0-9]*' "$out/grow/m.jsonl" | grep -o '[0-9]*$')
job_records "$orpheus" "$out/grow/ckpt" epoch | grep -qx "epoch 1 clock $at ranks 6"
tail -n 1 "$out/grow/m.jsonl" | grep -q "\"ranks\": 6," || { echo "the job did not end on 6 ranks"; exit 1; }
[ "$(ls "$out/grow/replicas" | wc -l)" -eq 6 ]
# The new replicas start from the average at the change clock, as the old ones do.
"$orpheus" restore --ckpt-dir "$out/grow/ckpt" --replica 0 --clock "$at" --out "$out/grow/at0.h5" >/dev/null
"$orpheus" restore --ckpt-dir "$out/grow/ckpt" --replica 5 --clock "$at" --out "$out/grow/at5.h5" >/dev/null
"$compare" "$out/grow/at0.h5" "$out/grow/at5.h5" 0
checkTotals "$out/grow/m.jsonl"
# inspect says the ranks it runs on now, and a joined replica's earlier clocks are not missing.
"$orpheus" inspect "$out/grow/ckpt" >"$out/grow/inspect"
grep -q "6 ranks (started on 4)" "$out/grow/inspect" || { cat "$out/grow/inspect"; echo "inspect: the ranks"; exit 1; }
grep -q "replica 5: .*(joined after clock $at)" "$out/grow/inspect" || { cat "$out/grow/inspect"; echo "inspect: joined"; exit 1; }
! grep -q "missing" "$out/grow/inspect" || { cat "$out/grow/inspect"; echo "inspect: a joined replica's clocks missing"; exit 1; }
# Every replica, old and new, restores after the change to what its rank held, bitwise.
for r in 0 1 2 3 4 5; do
  "$orpheus" restore --ckpt-dir "$out/grow/ckpt" --replica $r --clock "$clocks" --out "$out/grow/restored$r.h5" >/dev/null
  "$compare" "$out/grow/restored$r.h5" "$out/grow/replicas/replica-$r.h5" 0
done
echo "$out/grow: 2 ranks joined after clock $at"

# 4. Bad input: one line, exit 2.
refused() {
  local expect=$1; shift
  set +e; msg=$("$orpheus" ctl "$@" 2>&1); rc=$?; set -e
  [ "$rc" -eq 2 ] && [ "$(echo "$msg" | wc -l)" -eq 1 ] && echo "$msg" | grep -q "$expect" \
    || { echo "ctl $* was not refused as expected (exit $rc): $msg"; exit 1; }
}
refused "holds no job checkpoint" "$out/missing" shrink 1
refused "rank 2 is not a rank of the job (ranks 0..1)" "$out/ctl/ckpt" shrink 2
# A finished job takes no requests: refused, and no request file is left behind.
refused "no job is running in '$out/ctl/ckpt' (it finished" "$out/ctl/ckpt" shrink 1
refused "no job is running in '$out/ctl/ckpt' (it finished" "$out/ctl/ckpt" grow 1
[ ! -e "$out/ctl/ckpt/membership-request" ] || { echo "ctl left a request file in a finished job"; exit 1; }
refused "rank 0 writes the job's outputs" "$out/ctl/ckpt" shrink 0 1
refused "ctl shrink: '99999999999999999999' is not a rank of the job" "$out/ctl/ckpt" shrink 99999999999999999999
refused "ctl grow: expected 1 to 64 new ranks, got x" "$out/ctl/ckpt" grow x
refused "rank 0 writes the job's outputs" "$out/ctl/ckpt" shrink 0
refused "" "$out/ctl/ckpt" shrink
refused "expected 1 to 64 new ranks, got 0" "$out/ctl/ckpt" grow 0
[ ! -e "$out/ctl/ckpt/membership-request" ]
echo "elastic live: ok"
