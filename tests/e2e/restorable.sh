#!/usr/bin/env bash
# restorable.sh ORPHEUS COMPARE MPIEXEC: restore and inspect agree on what a damaged
# checkpoint can restore (np 2, BSP, MLR on synthetic data, 170 clocks, segments of
# 50 clocks, averaging and a snapshot every 20 clocks). For a corrupted middle
# segment, the same segment deleted, a damaged and a deleted snapshot part:
#  - every clock inspect lists as restorable restores (exit 0), every other is exit 2
#    with one line naming the segment or snapshot part and listing the ranges;
#  - restore --clock latest is the newest restorable clock, says so, and equals the
#    uninterrupted run bitwise;
#  - inspect of a file or of / is one line and exit 2.
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

timeout 120 "$mpiexec" -n 2 --oversubscribe "$orpheus" train --train synthetic:examples=2000,features=20,classes=3 \
  --batch 10 --clocks 170 --average-every 20 --progress off --log-level warn --timeout 20 \
  --ckpt sv --ckpt-dir "$out/ckpt" --save "$out/full.h5" >/dev/null
seg=seg-000000000051-000000000100.h5

# restorable DIR CLOCK: 0 when inspect lists CLOCK of replica 0 as restorable.
restorable() {
  local ranges
  ranges=$("$orpheus" inspect "$1" | sed -n 's/^  replica 0: clocks \(.*\) restorable,.*/\1/p' |
           sed 's/ (via snapshot [0-9]*)//g; s/, / /g')
  local r
  for r in $ranges; do
    local a=${r%..*} b=${r#*..}
    [ "$2" -ge "$a" ] && [ "$2" -le "$b" ] && return 0
  done
  return 1
}

# agree DIR WHAT CLOCKS...: restore and inspect agree on every clock; a refusal is
# exit 2, one line, naming WHAT and listing the restorable clocks.
agree() {
  local dir=$1 what=$2; shift 2
  "$orpheus" inspect "$dir"
  local t
  for t in "$@"; do
    set +e
    msg=$(timeout 60 "$orpheus" restore --ckpt-dir "$dir" --clock "$t" --out "$out/t.h5" 2>&1); rc=$?
    set -e
    if restorable "$dir" "$t"; then
      [ "$rc" -eq 0 ] || fail "clock $t is listed restorable but restore says ($rc): $msg"
    else
      [ "$rc" -eq 2 ] || fail "clock $t is not listed restorable but restore exits $rc: $msg"
      [ "$(echo "$msg" | wc -l)" -eq 1 ] || fail "more than one line: $msg"
      if [ "$t" -gt 170 ]; then
        echo "$msg" | grep -q "past the log of replica 0 (latest: 170)" || fail "clock $t is past the log: $msg"
      else
        echo "$msg" | grep -qF -- "$what" || fail "the refusal of clock $t does not name '$what': $msg"
      fi
      echo "$msg" | grep -q "restorable: clocks " || fail "the refusal of clock $t lists no ranges: $msg"
    fi
    rm -f "$out/t.h5"
  done
  msg=$(timeout 60 "$orpheus" restore --ckpt-dir "$dir" --clock latest --out "$out/latest.h5")
  echo "$msg"
  echo "$msg" | grep -q "at clock 170, the newest restorable clock" || fail "latest is not clock 170: $msg"
  "$compare" "$out/latest.h5" "$out/full.h5" 0
}

clocks=(1 40 50 51 59 60 61 70 80 99 100 101 110 119 120 165 170 171)

# A corrupted middle segment of replica 0: a gap the snapshots after it bridge.
cp -r "$out/ckpt" "$out/corrupt"
f="$out/corrupt/replica-0/$seg"
printf '\xff\xff\xff\xff\xff\xff\xff\xff' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") / 2 )) conv=notrunc status=none
"$orpheus" inspect "$out/corrupt" | grep -q "replica 0: clocks 1..50, 60 (via snapshot 60), 80 (via snapshot 80), 100..170 (via snapshot 100) restorable" ||
  fail "inspect does not list the ranges around the corrupted segment"
"$orpheus" inspect "$out/corrupt" | grep -q "damaged: .*$seg" || fail "inspect does not name the damaged segment"
agree "$out/corrupt" "$seg" "${clocks[@]}"

# The same segment deleted: the same gap.
cp -r "$out/ckpt" "$out/deleted"
rm "$out/deleted/replica-0/$seg"
"$orpheus" inspect "$out/deleted" | grep -q "replica 0: clocks 1..50, 60 (via snapshot 60), 80 (via snapshot 80), 100..170 (via snapshot 100) restorable" ||
  fail "a deleted segment is not the same gap as a corrupted one"
"$orpheus" inspect "$out/deleted" | grep -q "missing: clocks 51..100" || fail "inspect does not name the missing clocks"
agree "$out/deleted" "(missing)" "${clocks[@]}"

# A damaged snapshot part: the averaging at 100 cannot be replayed, so 100..119 go.
cp -r "$out/ckpt" "$out/snap"
part="$out/snap/snapshot-000000000100/part-1.h5"
truncate -s $(( $(stat -c %s "$part") / 2 )) "$part"
"$orpheus" inspect "$out/snap" | grep -q "replica 0: clocks 1..99, 120..170 (via snapshot 120) restorable" ||
  fail "inspect counts a damaged snapshot as usable"
"$orpheus" inspect "$out/snap" | grep -q "unusable snapshot of clock 100: part 1" || fail "inspect does not name the part"
agree "$out/snap" "snapshot of clock 100 is unusable: part 1" "${clocks[@]}"

# A deleted snapshot part: the same.
cp -r "$out/ckpt" "$out/snapgone"
rm "$out/snapgone/snapshot-000000000100/part-0.h5"
agree "$out/snapgone" "part 0" "${clocks[@]}"

# Not a checkpoint directory: one line, exit 2.
touch "$out/afile"
for bad in "$out/afile" / "$out/nope"; do
  set +e
  msg=$("$orpheus" inspect "$bad" 2>&1); rc=$?
  set -e
  echo "$msg"
  [ "$rc" -eq 2 ] || fail "inspect $bad exits $rc"
  [ "$(echo "$msg" | wc -l)" -eq 1 ] || fail "inspect $bad says more than one line"
  echo "$msg" | grep -qF "'$bad' is not a checkpoint directory (no job.h5)" || fail "inspect $bad: $msg"
done
echo "restorable checks passed"
