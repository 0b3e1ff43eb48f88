#!/usr/bin/env bash
# scripts/chaos.sh [MINUTES]: reliability under faults. For MINUTES (default 10) real
# np-4 jobs train an MLP on Fashion-MNIST (--ckpt sv, averaging and rotation) under
# scripts/elastic_run.sh --replace, one after another, alternating SSP jobs and BSP
# jobs (live membership changes need BSP), while a driver at random intervals
#   kill   SIGKILLs a random rank (the job fails; elastic_run resumes it --elastic),
#   stop   SIGSTOPs a random rank for 2-20 s (shorter than --timeout: survived in
#          place; longer: the job fails and is resumed),
#   full   fills the checkpoint disk (a tmpfs of its own) until the job stops on it,
#          then frees it (the job is resumed),
#   shrink / grow  (BSP jobs) asks the running job for a live change with orpheus ctl.
# Each job must reach its target accuracy. Then, for its checkpoint: every replica
# restores at the first and last clock of each restorable range `inspect` claims, and
# restore(T) at 10 random clocks equals what the live run had at T (the metrics'
# param_crc32c of rank 0's replica, --param-digests; clocks where the membership
# changed are left out: the log holds the average there, as designed). At the end no
# orpheus process and no mount is left. Prints the figures; exits 1 on any violation.
# Environment: ORPHEUS (default build/engine/orpheus), OUT (default a new temp dir),
# SEED (the driver's random seed), FASHION_MNIST.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
minutes=${1:-10}
ORPHEUS=${ORPHEUS:-$ROOT/build/engine/orpheus}
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
out=${OUT:-$(mktemp -d /tmp/orpheus-chaos.XXXXXX)}
RANDOM=${SEED:-$$}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 ORPHEUS
PY=/usr/bin/python3
[ -x "$ORPHEUS" ] || { echo "chaos.sh: $ORPHEUS is missing: build first" >&2; exit 2; }
mkdir -p "$out"
disk=$out/disk
mkdir -p "$disk"
mounted=0
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=10g orpheus-chaos "$disk" 2>/dev/null; then
  mounted=1
else
  echo "chaos.sh: cannot mount a tmpfs (needs root): the 'full' fault is left out" >&2
fi
faults=$out/faults.log
: >"$faults"
job=
cleanup() {
  [ -n "$job" ] && pkill -9 -P "$job" 2>/dev/null
  pkill -9 -f "scripts/elastic_run.sh --np 4 --replace" 2>/dev/null
  pkill -9 -f "$ORPHEUS train" 2>/dev/null
  [ "$mounted" = 1 ] && umount "$disk" 2>/dev/null
}
trap cleanup EXIT

say() { echo "chaos: $*" | tee -a "$out/chaos.log"; }
note() { echo "$(date +%s.%N) $*" >>"$faults"; say "$*"; }

# The orpheus rank processes of the running job, as "pid rank" lines.
ranks() {
  for p in $(pgrep -f "$ORPHEUS train" 2>/dev/null); do
    r=$({ tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -m1 '^OMPI_COMM_WORLD_RANK=' | cut -d= -f2)
    [ -n "$r" ] && echo "$p $r"
  done
}
# The running job's ranks now: its newest membership epoch (4 before any change).
members() {
  if [ -e "$1/membership" ]; then awk '$1 == "epoch" { r = $6 } END { print r ? r : 4 }' "$1/membership"; else echo 4; fi
}
pickRank() {
  local all; mapfile -t all < <(ranks)
  [ ${#all[@]} -gt 0 ] && echo "${all[$((RANDOM % ${#all[@]}))]}"
}

# One fault against the running job in $1 (its ckpt dir) of mode $2; fails when none
# could be made (no rank up, or no live change that the job could take).
inject() {
  local ck=$1 mode=$2 kinds=(kill kill stop stop) pick
  [ "$mounted" = 1 ] && kinds+=(full)
  [ "$mode" = bsp ] && kinds+=(shrink grow)
  local kind=${kinds[$((RANDOM % ${#kinds[@]}))]}
  pick=$(pickRank)
  [ -n "$pick" ] || return 1
  set -- $pick
  local pid=$1 rank=$2
  case $kind in
    kill) note "kill rank $rank (pid $pid)"; kill -9 "$pid" 2>/dev/null ;;
    stop)
      local secs=$((2 + RANDOM % 19))
      note "stop rank $rank (pid $pid) for $secs s"
      kill -STOP "$pid" 2>/dev/null; sleep "$secs"; kill -CONT "$pid" 2>/dev/null ;;
    full)
      note "fill the checkpoint disk"
      dd if=/dev/zero of="$disk/filler" bs=1M 2>/dev/null
      # The job stops on the full disk (or is between attempts): free it after a while.
      sleep 8; rm -f "$disk/filler"; note "free the checkpoint disk" ;;
    shrink)
      # Rank 0 writes the job's outputs and never leaves: the last rank of the group does.
      local n; n=$(members "$ck")
      [ "$n" -gt 2 ] || return 1
      note "ctl-shrink rank $((n - 1))"
      "$ORPHEUS" ctl "$ck" shrink $((n - 1)) >>"$out/chaos.log" 2>&1 ;;
    grow)
      [ "$(members "$ck")" -lt 6 ] || return 1
      note "ctl-grow 1"
      "$ORPHEUS" ctl "$ck" grow 1 >>"$out/chaos.log" 2>&1 ;;
  esac
}

# Checks job $1's checkpoint against its live metrics; prints "restores N digests M".
verify() {
  local d=$1 ck=$2
  local inv; inv=$("$ORPHEUS" inspect "$ck") || { say "$d: inspect failed"; return 1; }
  echo "$inv" >"$d/inspect.txt"
  local restores=0 bad=0
  # The clocks inspect claims restorable, per replica: "replica first last" lines.
  echo "$inv" | $PY -c '
import re, sys
for line in sys.stdin:
    m = re.match(r"\s+replica (\d+): clocks (.*) restorable", line)
    if not m: continue
    for part in m.group(2).split(", "):
        r = re.match(r"(\d+)(?:\.\.(\d+))?", part)
        if r: print(m.group(1), r.group(1), r.group(2) or r.group(1))' >"$d/restorable.txt"
  # Every replica at both ends of each restorable range.
  while read -r replica first last; do
    for c in $first $last; do
      "$ORPHEUS" restore --ckpt-dir "$ck" --replica "$replica" --clock "$c" --out "$d/r.h5" >/dev/null 2>>"$d/restore.err" \
        || { say "$d: replica $replica clock $c is claimed restorable but does not restore"; bad=1; }
      restores=$((restores + 1))
    done
  done <"$d/restorable.txt"
  # restore(T) at 10 random restorable clocks against the live digests (the last
  # record of each clock wins: a resumed job redid the clocks after its durable end).
  local checked=0
  while read -r clock replica digest; do
    got=$("$ORPHEUS" restore --ckpt-dir "$ck" --replica "$replica" --clock "$clock" --out "$d/t.h5" 2>>"$d/restore.err" |
          sed -n 's/^parameters crc32c //p')
    checked=$((checked + 1))
    [ "$got" = "$digest" ] || { say "$d: restore(clock $clock, replica $replica) crc32c $got, live $digest"; bad=1; }
  done < <($PY - "$d/all.jsonl" "$ck/membership" "$d/restorable.txt" "$RANDOM" <<'EOF'
import json, random, sys
live = {}
for line in open(sys.argv[1]):
    try:
        d = json.loads(line)
    except ValueError:
        continue  # a line cut by a kill
    if "param_crc32c" in d:
        live[d["clock"]] = (d["replica"], d["param_crc32c"])
changed = set()
try:
    for line in open(sys.argv[2]):
        f = line.split()
        if len(f) >= 4 and f[0] == "epoch": changed.add(int(f[3]))
except OSError:
    pass
restorable = set()
for line in open(sys.argv[3]):
    replica, first, last = map(int, line.split())
    restorable.update((replica, c) for c in range(first, last + 1))
clocks = sorted(c for c in live if c not in changed and (live[c][0], c) in restorable)
random.seed(int(sys.argv[4]))
for c in sorted(random.sample(clocks, min(10, len(clocks)))):
    print(c, *live[c])
EOF
)
  echo "restores $restores digests $checked"
  return $bad
}

# examples/mlp.loss with hidden layers of 512 and 256: a clock takes milliseconds,
# a job to the target a minute or two.
sed 's/^dim hidden1 = .*/dim hidden1 = 512/; s/^dim hidden2 = .*/dim hidden2 = 256/' "$ROOT/examples/mlp.loss" >"$out/mlp.loss"
deadline=$(($(date +%s) + minutes * 60))
round=0 failedChecks=0
say "out $out, $minutes minutes, seed ${SEED:-$$}"
while [ "$(date +%s)" -lt "$deadline" ]; do
  mode=ssp; [ $((round % 2)) = 1 ] && mode=bsp
  d=$out/job$round; ck=$disk/ck$round
  mkdir -p "$d"
  consistency=(--consistency ssp --staleness 2); [ $mode = bsp ] && consistency=(--consistency bsp)
  start=$(date +%s.%N)
  # The metrics file starts afresh with each attempt: keep every line in all.jsonl.
  (tail -F -n +1 "$d/m.jsonl" 2>/dev/null >"$d/all.jsonl") &
  keeper=$!
  ("$ROOT/scripts/elastic_run.sh" --np 4 --replace --retries 1000 -- \
     --train "$data/train-images-idx3-ubyte.gz" --test "$data/t10k-images-idx3-ubyte.gz" \
     --model "$out/mlp.loss" --batch 64 --select 8 "${consistency[@]}" \
     --average-every 50 --rotate-every 30 --snapshot-every 1 --ckpt sv --ckpt-dir "$ck" \
     --clocks 20000 --eval-every 50 --target-accuracy 0.84 --lr 0.05 --timeout 10 --progress off \
     --metrics "$d/m.jsonl" --param-digests >"$d/job.log" 2>&1) &
  job=$!
  injected=0
  # Jobs 0 and 1 run without faults: the reference for the seconds a fault costs.
  while kill -0 "$job" 2>/dev/null; do
    sleep $((2 + RANDOM % 5))
    kill -0 "$job" 2>/dev/null || break
    if [ "$(date +%s)" -gt $((deadline + 300)) ]; then
      say "job $round: still running 5 minutes past the deadline: stopped"; cleanup; break
    fi
    [ "$round" -ge 2 ] && [ -e "$ck/job.h5" ] || continue
    inject "$ck" "$mode" && injected=$((injected + 1))
  done
  wait "$job"; rc=$?
  job=
  end=$(date +%s.%N)
  sleep 0.5; kill "$keeper" 2>/dev/null; wait "$keeper" 2>/dev/null
  attempts=$(grep -c '^elastic_run.sh: attempt' "$d/job.log")
  reached=$($PY -c '
import json, sys
acc = None
for line in open(sys.argv[1]):
    try: d = json.loads(line)
    except ValueError: continue
    if d.get("summary"): acc = d
print(acc.get("reached_target"), acc.get("clocks"), acc.get("test_accuracy")) if acc else print("none")' "$d/all.jsonl")
  # Clocks redone: for each restart, the clocks the killed attempt had reported past
  # the point the next attempt resumed from.
  redone=$($PY -c '
import json, sys
prev, redone = 0, 0
for line in open(sys.argv[1]):
    try: d = json.loads(line)
    except ValueError: continue
    c = d.get("clock")
    if not isinstance(c, int) or "train_loss" not in d: continue
    if c <= prev: redone += prev - c + 1
    prev = c
print(redone)' "$d/all.jsonl")
  if ! checks=$(verify "$d" "$ck"); then failedChecks=$((failedChecks + 1)); fi
  secs=$($PY -c "print(round($end - $start, 1))")
  say "job $round ($mode): exit $rc, $attempts attempts, $injected faults, target/clocks/accuracy $reached, $redone clocks redone, $secs s, $checks"
  echo "$round $mode $rc $attempts $injected $redone $secs $reached $checks" >>"$out/jobs.txt"
  [ "$rc" = 0 ] || failedChecks=$((failedChecks + 1))
  case "$reached" in True*) ;; *) say "job $round did not reach its target"; failedChecks=$((failedChecks + 1)) ;; esac
  rm -rf "$ck"
  round=$((round + 1))
done
sleep 1
left=$(pgrep -f "$ORPHEUS train" | wc -l)
[ "$left" = 0 ] || { say "$left orpheus processes left behind"; failedChecks=$((failedChecks + 1)); }
cleanup; trap - EXIT
mountLeft=$(grep -c " $disk " /proc/mounts)
[ "$mountLeft" = 0 ] || { say "the tmpfs is still mounted"; failedChecks=$((failedChecks + 1)); }
say "faults by kind: $(cut -d' ' -f2 "$faults" | grep -v free | sort | uniq -c | awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2 }')"
# Seconds lost per fault: a job's wall time beyond what the fault-free job of its
# mode (jobs 0 and 1) took per clock, divided by its faults.
$PY - "$out/jobs.txt" <<'EOF' | tee -a "$out/chaos.log"
import sys
rows = [l.split() for l in open(sys.argv[1])]
rate = {r[1]: float(r[6]) / max(1, int(r[8])) for r in rows if r[0] in ("0", "1") and r[8].isdigit()}
faults = sum(int(r[4]) for r in rows)
attempts = sum(int(r[3]) - 1 for r in rows)
redone = sum(int(r[5]) for r in rows)
restores = sum(int(r[11]) for r in rows if len(r) > 13)
digests = sum(int(r[13]) for r in rows if len(r) > 13)
lost = [(float(r[6]) - rate[r[1]] * int(r[8])) / int(r[4]) for r in rows
        if int(r[4]) > 0 and r[1] in rate and r[8].isdigit()]
lost.sort()
print(f"chaos: {len(rows)} jobs, {faults} faults injected, {attempts} relaunches, {redone} clocks redone, "
      f"{restores} restores of claimed clocks, {digests} restore(T) digests checked")
if lost:
    print(f"chaos: seconds lost per fault, per job: median {lost[len(lost) // 2]:.1f} (range {lost[0]:.1f}..{lost[-1]:.1f})")
EOF
say "jobs: $round, violations: $failedChecks; per job: $out/jobs.txt, faults: $faults"
[ "$failedChecks" = 0 ]
