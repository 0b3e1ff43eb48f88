#!/usr/bin/env bash
# fault_matrix.sh ORPHEUS COMPARE MPIEXEC [CASE...]: failure injection on small real
# jobs (MLR on synthetic data, BSP, averaging and a snapshot every 20 clocks, the SV
# checkpoint, segments of 50 clocks), each case with the outcome it must have:
#   kill_rank       SIGKILL of rank 1 (np 2): the job ends within its timeout, nonzero,
#                   naming rank 1 (the launcher's line) and one orpheus line, rank 0
#                   stopped by the launcher at a clock; no model; every segment
#                   written before is intact; --resume then ends bitwise equal to an
#                   uninterrupted run
#   stop_rank       SIGSTOP of rank 1 (np 3, ring multicast): the others time out after
#                   --timeout; exactly one orpheus line, naming rank 1 stalled and the
#                   clock (the woken rank 1 does not blame the others); exit 4;
#                   nothing left running
#   stop_rank_bcast SIGSTOP of rank 1 (np 2, broadcast): exactly one line, naming the
#                   clock and rank 1 stalled; exit 4
#   term_mpirun     SIGTERM of mpiexec: the job stops (nonzero) within seconds, with one
#                   orpheus line saying so and the clock, nothing left running, no
#                   damage; --resume is bitwise equal
#   segment_*       a middle segment truncated, corrupted or deleted;
#   snapshot_*      a snapshot part damaged or deleted: inspect names it, restore and
#                   inspect agree on every clock tried, a refused clock is exit 2 naming
#                   it, restore --clock latest is the newest restorable clock
#   full_disk       tests/e2e/full_disk.sh (skipped where a tmpfs cannot be mounted)
#   read_only       a read-only checkpoint directory: one line naming it, exit 2 or 3
#   read_only_mid   the file system turns read-only mid-run: one line, exit 2 or 3,
#                   what was written before restores
# No case can hang: every run is under `timeout`, every job
# in its own session, killed (after SIGCONT) when the case ends. Prints one line per case (PASS, FAIL,
# SKIP, or KNOWN for an outcome that differs from the goal in a known, reported way);
# exits 1 if any case failed. Cases by name (default: all).
set -uo pipefail
# Absolute paths: some cases run from other directories.
orpheus=$(realpath "$1"); compare=$(realpath "$2"); mpiexec=$(command -v "$3"); shift 3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
out=$(mktemp -d)
groups=()
mounts=()
# endSession SID: every process of a job's session (ranks get process groups of their own).
endSession() {
  local p
  for p in $(pgrep -s "$1"); do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
}
cleanup() {
  local g m
  for g in "${groups[@]}"; do endSession "$g"; done
  for m in "${mounts[@]}"; do umount "$m" 2>/dev/null; done
  rm -rf "$out"
}
trap cleanup EXIT

data="synthetic:examples=2000,features=20,classes=3"
flags=(--train "$data" --batch 10 --average-every 20 --progress off --log-level warn --ckpt sv)
clocks=300
delay=(--inject-delay 0:10)  # 10 ms a clock: a job of 300 clocks lasts about 3 s
timeoutSeconds=4

results=()
failed=0
note() { echo "    $*"; }
# check DESCRIPTION COMMAND...: one expectation of the current case.
check() {
  local what=$1; shift
  if "$@"; then note "ok: $what"; else note "NOT: $what"; caseOk=0; fi
}
known() {
  local what=$1; shift
  if "$@"; then note "ok: $what"; else note "KNOWN: $what"; caseKnown=1; fi
}

# start NAME ARGS...: launches mpiexec ARGS in a session of its own, in the
# background, under timeout; stdout and stderr to $out/NAME.{out,err}.
start() {
  local name=$1; shift
  setsid timeout -s KILL 120 "$mpiexec" --oversubscribe "$@" >"$out/$name.out" 2>"$out/$name.err" &
  job=$!
  groups+=("$job")
  startedAt=$(date +%s.%N)
}
# finish: waits for the job; sets rc and took (seconds since the fault).
finish() {
  wait "$job"; rc=$?
  took=$(echo "$(date +%s.%N) - $faultAt" | bc)
}
# rankPid NAME RANK: the pid of MPI rank RANK of the job started as NAME.
rankPid() {
  local p
  for p in $(pgrep -s "$job" orpheus); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$p"; return; fi
  done
}
# waitFor COUNT DIR: until replica 0 of DIR has COUNT segments (at most 20 s).
waitFor() { wait_for_segments "$2/replica-0" "$1" 20; }
# noneLeft: no process of the job's session is alive (zombies, left for init to
# reap, do not count), after at most 3 s.
noneLeft() {
  local i alive
  for i in $(seq 30); do
    alive=$(ps -s "$job" -o pid=,stat=,args= 2>/dev/null | awk '$2 !~ /^Z/')
    [ -z "$alive" ] && return 0
    sleep 0.1
  done
  echo "$alive"
  return 1
}
orpheusLines() { grep -c '^orpheus:' "$out/$1.err"; }
within() { [ "$(echo "$took < $1" | bc)" -eq 1 ]; }
noDamage() { ! "$orpheus" inspect "$1" | grep -qE "damaged|missing"; }

# The uninterrupted run every resumed one must equal.
reference() {
  [ -e "$out/reference.h5" ] && return 0
  timeout 120 "$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --clocks $clocks --timeout 20 \
    --ckpt-dir "$out/reference" --save "$out/reference.h5" >/dev/null
}
# resumeEquals NAME: --resume of the job NAME (same flags) ends bitwise equal to the reference.
resumeEquals() {
  reference || return 1
  timeout 120 "$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" "${delay[@]}" --clocks $clocks \
    --timeout 20 --ckpt-dir "$out/$1" --save "$out/$1.h5" --resume >"$out/$1.resume" 2>&1 || {
    cat "$out/$1.resume"; return 1; }
  "$compare" "$out/$1.h5" "$out/reference.h5" 0
}
# segmentsIntact NAME: every segment there before the fault is there and intact.
segmentsIntact() {
  local s
  for s in $(cat "$out/$1.before"); do
    [ -e "$s" ] || { echo "gone: $s"; return 1; }
  done
  noDamage "$out/$1"
}

case_kill_rank() {
  start kill_rank -n 2 "$orpheus" train "${flags[@]}" "${delay[@]}" --clocks $clocks --timeout $timeoutSeconds \
    --ckpt-dir "$out/kill_rank" --save "$out/kill_rank.model.h5"
  waitFor 2 "$out/kill_rank" || { note "no segment appeared"; caseOk=0; return; }
  ls "$out"/kill_rank/replica-*/seg-*.h5 >"$out/kill_rank.before"
  local pid; pid=$(rankPid kill_rank 1)
  faultAt=$(date +%s.%N); kill -KILL "$pid"; finish
  cat "$out/kill_rank.err" | grep -v '^\s*$' | sed 's/^/      /' | head -8
  check "ends within the timeout ($timeoutSeconds s) and a margin: ${took}s" within $((timeoutSeconds + 5))
  check "exit code nonzero ($rc)" [ "$rc" -ne 0 ]
  check "a line names rank 1" grep -qE "rank 1\b" "$out/kill_rank.err"
  check "one line from orpheus ($(orpheusLines kill_rank)): rank 0 stopped by the launcher at a clock" \
    bash -c '[ "$(grep -c "^orpheus:" "$1")" -eq 1 ] &&
      grep -qE "^orpheus: rank 0 stopped by the launcher at clock [0-9]+ \(a peer died or the job was cancelled\)$" "$1"' \
    _ "$out/kill_rank.err"
  check "no model saved" [ ! -e "$out/kill_rank.model.h5" ]
  check "nothing left running" noneLeft
  check "segments written before are intact" segmentsIntact kill_rank
  check "--resume equals an uninterrupted run bitwise" resumeEquals kill_rank
}

# namesStalled ERR: a line of another rank names the clock and rank 1 as the one
# it waited for (a point-to-point wait, a collective or a control agreement).
namesStalled() {
  grep -E "^orpheus: rank [02]\b" "$1" | grep -E "clock [0-9]+" |
    grep -qE "(from ranks?|stalled or gone: ranks?) 1( \(at clock [0-9]+\))?$"
}

case_stop_rank() {
  start stop_rank -n 3 "$orpheus" train "${flags[@]}" "${delay[@]}" --clocks $clocks --timeout $timeoutSeconds \
    --multicast ring --fanout 1 --ckpt-dir "$out/stop_rank" --save "$out/stop_rank.model.h5"
  waitFor 1 "$out/stop_rank" || { note "no segment appeared"; caseOk=0; return; }
  local pid; pid=$(rankPid stop_rank 1)
  faultAt=$(date +%s.%N); kill -STOP "$pid"; finish
  kill -CONT "$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null
  grep '^orpheus:' "$out/stop_rank.err" | sed 's/^/      /'
  check "times out after --timeout $timeoutSeconds s, within a margin: ${took}s" within $((timeoutSeconds + 6))
  check "exit code 4, a peer stalled ($rc)" [ "$rc" -eq 4 ]
  check "another rank's line names the stopped rank and the clock" \
    namesStalled "$out/stop_rank.err"
  check "one line from orpheus ($(orpheusLines stop_rank)): one rank reports, the woken one blames nobody" \
    [ "$(orpheusLines stop_rank)" -eq 1 ]
  check "no model saved" [ ! -e "$out/stop_rank.model.h5" ]
  check "nothing left running" noneLeft
}

case_stop_rank_bcast() {
  start stop_rank_bcast -n 2 "$orpheus" train "${flags[@]}" "${delay[@]}" --clocks $clocks \
    --timeout $timeoutSeconds --ckpt-dir "$out/stop_rank_bcast" --save "$out/stop_rank_bcast.model.h5"
  waitFor 1 "$out/stop_rank_bcast" || { note "no segment appeared"; caseOk=0; return; }
  local pid; pid=$(rankPid stop_rank_bcast 1)
  faultAt=$(date +%s.%N); kill -STOP "$pid"; finish
  kill -CONT "$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null
  grep '^orpheus:' "$out/stop_rank_bcast.err" | sed 's/^/      /'
  local first; first=$(grep -m1 '^orpheus:' "$out/stop_rank_bcast.err")
  check "times out after --timeout $timeoutSeconds s, within a margin: ${took}s" within $((timeoutSeconds + 6))
  check "exit code 4, a peer stalled ($rc)" [ "$rc" -eq 4 ]
  check "the first line names the clock" bash -c '[[ "$1" =~ at\ clock\ [0-9]+ ]]' _ "$first"
  check "the first line names the stopped rank" \
    bash -c '[[ "$1" =~ ^orpheus:\ rank\ 0[:\ ].*stalled\ or\ gone:\ rank\ 1(\ \(at\ clock\ [0-9]+\))?$ ]]' _ "$first"
  check "one line from orpheus ($(orpheusLines stop_rank_bcast))" [ "$(orpheusLines stop_rank_bcast)" -eq 1 ]
  check "nothing left running" noneLeft
}

case_term_mpirun() {
  start term_mpirun -n 2 "$orpheus" train "${flags[@]}" "${delay[@]}" --clocks $clocks --timeout $timeoutSeconds \
    --ckpt-dir "$out/term_mpirun" --save "$out/term_mpirun.model.h5"
  waitFor 1 "$out/term_mpirun" || { note "no segment appeared"; caseOk=0; return; }
  ls "$out"/term_mpirun/replica-*/seg-*.h5 >"$out/term_mpirun.before"
  local mp; mp=$(pgrep -s "$job" -x "$(basename "$mpiexec")" | head -1)
  faultAt=$(date +%s.%N); kill -TERM "$mp"; finish
  grep -v '^\s*$' "$out/term_mpirun.err" | sed 's/^/      /' | head -5
  check "stops within 5 s: ${took}s" within 5
  check "exit code nonzero ($rc)" [ "$rc" -ne 0 ]
  check "no core dump or crash" bash -c '! grep -qiE "core dumped|segmentation fault|terminate called" "$1"' _ \
    "$out/term_mpirun.err"
  check "one line from orpheus ($(orpheusLines term_mpirun)): stopped by the launcher at a clock" \
    bash -c '[ "$(grep -c "^orpheus:" "$1")" -eq 1 ] &&
      grep -qE "^orpheus: rank 0 stopped by the launcher at clock [0-9]+ \(a peer died or the job was cancelled\)$" "$1"' \
    _ "$out/term_mpirun.err"
  check "nothing left running" noneLeft
  check "no model saved" [ ! -e "$out/term_mpirun.model.h5" ]
  check "segments written before are intact" segmentsIntact term_mpirun
  check "--resume equals an uninterrupted run bitwise" resumeEquals term_mpirun
}

# A checkpoint of 170 clocks to damage: segments 1..50, 51..100, 101..150, 151..170.
damageBase() {
  [ -d "$out/base" ] && return 0
  timeout 120 "$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --clocks 170 --timeout 20 \
    --ckpt-dir "$out/base" --save "$out/base.h5" >/dev/null
}
# inspectRanges DIR: replica 0's restorable ranges as "a..b c..d".
inspectRanges() {
  "$orpheus" inspect "$1" | sed -n 's/^  replica 0: clocks \(.*\) restorable,.*/\1/p' |
    sed 's/ (via snapshot [0-9]*)//g; s/, / /g'
}
listed() {
  local r
  for r in $1; do
    local a=${r%..*} b=${r#*..}
    [ "$2" -ge "$a" ] && [ "$2" -le "$b" ] && return 0
  done
  return 1
}
# agrees DIR WHAT: restore and inspect agree on a set of clocks; refusals name WHAT.
agrees() {
  local ranges t msg rc bad=0
  ranges=$(inspectRanges "$1")
  note "inspect: replica 0 clocks ${ranges:-none} restorable"
  for t in 1 50 51 60 61 75 99 100 101 120 150 151 170; do
    msg=$(timeout 60 "$orpheus" restore --ckpt-dir "$1" --clock $t --out "$out/t.h5" 2>&1); rc=$?
    rm -f "$out/t.h5"
    if listed "$ranges" $t; then
      [ "$rc" -eq 0 ] || { note "clock $t listed, restore exits $rc: $msg"; bad=1; }
    else
      [ "$rc" -eq 2 ] && [ "$(echo "$msg" | wc -l)" -eq 1 ] && echo "$msg" | grep -qF -- "$2" ||
        { note "clock $t not listed, restore exits $rc: $msg"; bad=1; }
    fi
  done
  return $bad
}
latestIsNewest() {
  local msg
  msg=$(timeout 60 "$orpheus" restore --ckpt-dir "$1" --clock latest --out "$out/latest.h5") || return 1
  echo "$msg" | grep -q "at clock 170, the newest restorable clock" && "$compare" "$out/latest.h5" "$out/base.h5" 0 >/dev/null
}
# damageCase NAME WHAT INSPECT-PATTERN DAMAGE...: copies the base, damages it, checks.
damageCase() {
  local name=$1 what=$2 pattern=$3; shift 3
  damageBase || { note "training failed"; caseOk=0; return; }
  rm -rf "$out/$name"; cp -r "$out/base" "$out/$name"
  (cd "$out/$name" && "$@")
  check "inspect names it ($pattern)" bash -c '"$1" inspect "$2" | grep -qE -- "$3"' _ "$orpheus" "$out/$name" "$pattern"
  check "restore and inspect agree; refusals are exit 2 naming it" agrees "$out/$name" "$what"
  check "restore --clock latest is clock 170, the newest restorable, bitwise" latestIsNewest "$out/$name"
}
seg=replica-0/seg-000000000051-000000000100.h5
case_segment_truncated() {
  damageCase segment_truncated "$seg" "damaged: .*$seg" truncate -s 1000 "$seg"
}
case_segment_corrupted() {
  damageCase segment_corrupted "$seg" "damaged: .*$seg" bash -c \
    'printf "\xff\xff\xff\xff\xff\xff\xff\xff" | dd of="$1" bs=1 seek=$(( $(stat -c %s "$1") / 2 )) conv=notrunc status=none' _ "$seg"
}
case_segment_deleted() { damageCase segment_deleted "(missing)" "missing: clocks 51..100" rm "$seg"; }
part=snapshot-000000000100/part-1.h5
case_snapshot_damaged() {
  damageCase snapshot_damaged "snapshot of clock 100 is unusable: part 1" "unusable snapshot of clock 100: part 1" \
    truncate -s 2000 "$part"
}
case_snapshot_deleted() {
  damageCase snapshot_deleted "snapshot of clock 100 is unusable: part 1" "unusable snapshot of clock 100: part 1.*missing" \
    rm "$part"
}

case_full_disk() {
  timeout 300 "$here/full_disk.sh" "$orpheus" "$mpiexec" >"$out/full_disk.log" 2>&1; rc=$?
  grep -E '^orpheus:|exit code|passed|skipped' "$out/full_disk.log" | sed 's/^/      /'
  if [ "$rc" -eq 77 ]; then caseSkip=1; return; fi
  check "full_disk.sh passes: exit 2, one line naming the directory and ENOSPC, earlier segments intact" [ "$rc" -eq 0 ]
}

# A read-only directory to put a checkpoint directory in: a read-only tmpfs as root
# (who writes through permissions), else mode 0555.
case_read_only() {
  local d=$out/ro
  mkdir -p "$d"
  if [ "$(id -u)" -eq 0 ]; then
    mount -t tmpfs -o ro,size=1m orpheus-fault-ro "$d" 2>/dev/null || { note "cannot mount a tmpfs"; caseSkip=1; return; }
    mounts+=("$d")
  else
    chmod 0555 "$d"
  fi
  timeout 60 "$mpiexec" -n 2 --oversubscribe "$orpheus" train "${flags[@]}" --clocks 20 --timeout $timeoutSeconds \
    --ckpt-dir "$d/ckpt" --save "$out/read_only.model.h5" >"$out/read_only.out" 2>"$out/read_only.err"; rc=$?
  grep '^orpheus:' "$out/read_only.err" | sed 's/^/      /'
  check "exit code 2 or 3 ($rc)" bash -c '[ "$1" -eq 2 ] || [ "$1" -eq 3 ]' _ "$rc"
  check "one line from orpheus, naming the directory" \
    bash -c '[ "$(grep -c "^orpheus:" "$1")" -eq 1 ] && grep "^orpheus:" "$1" | grep -qF "$2"' _ "$out/read_only.err" "$d/ckpt"
  check "no model saved" [ ! -e "$out/read_only.model.h5" ]
  chmod 0755 "$d" 2>/dev/null
}
case_read_only_mid() {
  [ "$(id -u)" -eq 0 ] || { note "needs root to remount"; caseSkip=1; return; }
  local d=$out/rw
  mkdir -p "$d"
  mount -t tmpfs -o size=16m orpheus-fault-rw "$d" 2>/dev/null || { note "cannot mount a tmpfs"; caseSkip=1; return; }
  mounts+=("$d")
  start read_only_mid -n 2 "$orpheus" train "${flags[@]}" "${delay[@]}" --clocks $clocks --timeout $timeoutSeconds \
    --ckpt-dir "$d/ckpt" --save "$out/read_only_mid.model.h5"
  waitFor 1 "$d/ckpt" || { note "no segment appeared"; caseOk=0; return; }
  faultAt=$(date +%s.%N); mount -o remount,ro "$d"; finish
  grep '^orpheus:' "$out/read_only_mid.err" | sed 's/^/      /'
  check "exit code 2 or 3 ($rc)" bash -c '[ "$1" -eq 2 ] || [ "$1" -eq 3 ]' _ "$rc"
  check "one line from orpheus, naming a path in the directory and the error" \
    bash -c '[ "$(grep -c "^orpheus:" "$1")" -eq 1 ] && grep "^orpheus:" "$1" | grep -F "$2" | grep -q "Read-only file system"' \
    _ "$out/read_only_mid.err" "$d/ckpt"
  check "no model saved" [ ! -e "$out/read_only_mid.model.h5" ]
  check "what was written restores (latest)" \
    bash -c '"$1" restore --ckpt-dir "$2" --clock latest --out "$3" >/dev/null' _ "$orpheus" "$d/ckpt" "$out/rom.h5"
}

all=(kill_rank stop_rank stop_rank_bcast term_mpirun segment_truncated segment_corrupted segment_deleted
     snapshot_damaged snapshot_deleted full_disk read_only read_only_mid)
[ $# -gt 0 ] && all=("$@")
for c in "${all[@]}"; do
  declare -F "case_$c" >/dev/null || { echo "unknown case '$c' (cases: ${all[*]})"; exit 2; }
  echo "== $c"
  caseOk=1; caseKnown=0; caseSkip=0
  begin=$(date +%s)
  "case_$c"
  # Whatever a case started ends with it.
  for g in "${groups[@]}"; do endSession "$g"; done
  groups=()
  if [ "$caseSkip" -eq 1 ]; then verdict=SKIP
  elif [ "$caseOk" -eq 0 ]; then verdict=FAIL; failed=1
  elif [ "$caseKnown" -eq 1 ]; then verdict=KNOWN
  else verdict=PASS; fi
  results+=("$(printf '%-18s %-5s %3ss' "$c" "$verdict" $(( $(date +%s) - begin )))")
done
echo "== fault matrix"
printf '%s\n' "${results[@]}"
exit $failed
