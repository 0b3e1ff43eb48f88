#!/usr/bin/env bash
# scripts/elastic_run.sh [--np N] [--min-np M] [--retries K] [--replace] [--hostfile F] -- TRAIN FLAGS...
# Runs `mpirun -n N orpheus train TRAIN FLAGS` and, when the job fails (a rank was
# killed or lost), relaunches it on the ranks that are left with --resume --elastic:
# the job continues from its --ckpt-dir (the flags must include --ckpt sv and
# --ckpt-dir DIR) on N minus the ranks mpirun reported dead, every replica starting
# from the average of the killed job's (engine/README.md: elastic runs). At most K relaunches
# (default 3), never below M ranks (default 1). --replace relaunches on N ranks every
# time, as a scheduler that replaces lost nodes would. Bad input (exit 2) is not retried.
# Environment: ORPHEUS (the binary; default build/engine/orpheus), MPIRUN (mpirun).
# Exit: the last attempt's status.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/common.sh"
ORPHEUS=${ORPHEUS:-$ROOT/build/engine/orpheus}
MPIRUN=${MPIRUN:-mpirun}
np=4; minNp=1; retries=3; replace=0; hosts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --np) np=$2; shift 2 ;;
    --min-np) minNp=$2; shift 2 ;;
    --retries) retries=$2; shift 2 ;;
    --replace) replace=1; shift ;;
    --hostfile) hosts=(--hostfile "$2"); shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "elastic_run.sh: unknown option '$1' (train flags go after --)" >&2; exit 2 ;;
  esac
done
ckptDir=
for ((i = 1; i <= $#; i++)); do
  [ "${!i}" = --ckpt-dir ] && { j=$((i + 1)); ckptDir=${!j}; }
done
[ -n "$ckptDir" ] || { echo "elastic_run.sh: the train flags need --ckpt sv --ckpt-dir DIR" >&2; exit 2; }

log=$(mktemp); trap 'rm -f "$log"' EXIT
attempt=0; resume=()
while :; do
  echo "elastic_run.sh: attempt $attempt on $np ranks ${resume[*]}" >&2
  "$MPIRUN" -n "$np" --oversubscribe "${hosts[@]}" "$ORPHEUS" train "$@" "${resume[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] && exit 0
  [ "$rc" -eq 2 ] && { echo "elastic_run.sh: bad input: not retried" >&2; exit 2; }
  # mpirun names each rank it saw die ("process rank R with PID ... exited on signal").
  lost=$(grep -oE 'process rank [0-9]+ with PID' "$log" | sort -u | wc -l)
  [ "$lost" -ge 1 ] || lost=1
  attempt=$((attempt + 1))
  [ "$replace" = 1 ] || np=$((np - lost))
  if [ "$attempt" -gt "$retries" ] || [ "$np" -lt "$minNp" ]; then
    echo "elastic_run.sh: giving up after $attempt attempts (exit $rc; $np ranks left, at least $minNp needed)" >&2
    exit "$rc"
  fi
  # Before its first checkpoint the job simply starts again.
  if [ -e "$ckptDir/job.h5" ]; then resume=(--resume --elastic); else resume=(); fi
done
