#!/usr/bin/env bash
# sv_log_once.sh ORPHEUS COMPARE MPIEXEC: the SV log of format 3, where each SV batch
# is written once (by the replica that computed it) and receivers log references
# that restore recomputes (selection included). np 4, MLR on synthetic data, --select.
# The same BSP job is logged in format 2 (every replica keeps copies) and format 3:
#  - format 3 writes fewer bytes than format 2;
#  - restore of every replica at clocks before, at and after snapshots and after
#    rotations is bitwise the same from both logs (format 2 holds what was applied),
#    and the last clock is bitwise the replica each rank ended with;
#  - SSP (not repeatable run to run): restore of the last clock equals the replicas;
#  - a damaged segment of replica 1 stops the restores of the replicas that applied
#    its batches: exit 2, one line naming the segment file and the clock; inspect
#    agrees, and the clocks before it still restore.
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
base=(--train synthetic:examples=2000,features=30,classes=4 --batch 12 --select 4 --progress off --log-level warn
      --timeout 30)

# job NAME CLOCKS FLAGS...: trains with the SV log into $out/NAME, replicas in $out/NAME-rep.
job() {
  local name=$1 clocks=$2; shift 2
  mkdir -p "$out/$name-rep"
  timeout 120 "$mpiexec" -n 4 --oversubscribe "$orpheus" train "${base[@]}" --clocks "$clocks" "$@" --ckpt sv \
    --ckpt-dir "$out/$name" --save-replicas "$out/$name-rep" >/dev/null
}
# same A B CLOCK...: every replica restores bitwise equal from logs A and B at each clock.
same() {
  local a=$1 b=$2; shift 2
  local t r
  for t in "$@"; do
    for r in 0 1 2 3; do
      "$orpheus" restore --ckpt-dir "$out/$a" --replica "$r" --clock "$t" --out "$out/a.h5" >/dev/null
      "$orpheus" restore --ckpt-dir "$out/$b" --replica "$r" --clock "$t" --out "$out/b.h5" >/dev/null
      "$compare" "$out/a.h5" "$out/b.h5" 0 >/dev/null || fail "replica $r at clock $t differs between $a and $b"
      rm -f "$out/a.h5" "$out/b.h5"
    done
  done
}
# live NAME CLOCK: every replica restores at CLOCK bitwise equal to the one its rank ended with.
live() {
  local r
  for r in 0 1 2 3; do
    "$orpheus" restore --ckpt-dir "$out/$1" --replica "$r" --clock "$2" --out "$out/l.h5" >/dev/null
    "$compare" "$out/l.h5" "$out/$1-rep/replica-$r.h5" 0 >/dev/null || fail "$1: replica $r at clock $2 is not live"
    rm -f "$out/l.h5"
  done
}
bytes() { du -sb "$1" | cut -f1; }

# Broadcast, averaging with a snapshot at every barrier.
avg=(--average-every 15)
job avg2 60 "${avg[@]}" --ckpt-format 2
job avg3 60 "${avg[@]}"
echo "bytes: format 2 $(bytes "$out/avg2"), format 3 $(bytes "$out/avg3")"
[ "$(bytes "$out/avg3")" -lt "$(bytes "$out/avg2")" ] || fail "format 3 is not smaller than format 2"
same avg2 avg3 1 14 15 16 29 30 31 46 60
live avg3 60

# Random multicast with rotation.
rot=(--multicast random --fanout 2 --rotate-every 10)
job rot2 45 "${rot[@]}" --ckpt-format 2
job rot3 45 "${rot[@]}"
same rot2 rot3 9 10 11 20 21 33 45
live rot3 45

# SSP, with a slow rank so that batches arrive late.
job ssp 40 --multicast random --fanout 2 --consistency ssp --staleness 2 --inject-delay 1:3
live ssp 40

# A damaged segment of replica 1 (clocks 51..60 of a job with segments of 50 clocks).
job dmg 60 --multicast random --fanout 3
f=$(ls "$out"/dmg/replica-1/seg-000000000051-*.h5)
printf '\xff\xff\xff\xff\xff\xff\xff\xff' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") / 2 )) conv=notrunc status=none
"$orpheus" inspect "$out/dmg" | tee "$out/dmg.inspect"
grep -q "replica 0: clocks 1..50 restorable" "$out/dmg.inspect" || fail "inspect does not stop replica 0 at clock 50"
"$orpheus" restore --ckpt-dir "$out/dmg" --replica 0 --clock 50 --out "$out/r50.h5" >/dev/null
set +e
msg=$("$orpheus" restore --ckpt-dir "$out/dmg" --replica 0 --clock 55 --out "$out/r55.h5" 2>&1); rc=$?
set -e
echo "$msg"
[ "$rc" -eq 2 ] || fail "restore past the damaged sender segment exits $rc"
[ "$(echo "$msg" | wc -l)" -eq 1 ] || fail "more than one line"
echo "$msg" | grep -qF "$(basename "$f")" || fail "the refusal does not name the sender's segment"
echo "$msg" | grep -q "at clock 51" || fail "the refusal does not name the clock"
[ ! -e "$out/r55.h5" ] || fail "a refused restore wrote its output"
msg=$("$orpheus" restore --ckpt-dir "$out/dmg" --replica 0 --clock latest --out "$out/rl.h5")
echo "$msg" | grep -q "at clock 50, the newest restorable clock" || fail "latest is not clock 50: $msg"
echo "sv log checks passed"
