# Sourced by the end-to-end scripts: the steps several of them share.

# job_records ORPHEUS DIR KIND: the membership epochs (KIND epoch) or the chunk layout
# and moves (KIND chunks) checkpoint DIR records, one a line as `orpheus inspect`
# prints them ("epoch E clock C ranks P"; "layout rows R shards ...", "clock K moves
# ..."). A job writes them into its SV log, not into text files: checks that so.
job_records() {
  local orpheus=$1 dir=$2 kind=$3
  [ ! -e "$dir/membership" ] && [ ! -e "$dir/chunks" ] || { echo "'$dir' holds a text log"; return 1; }
  case $kind in
    epoch) "$orpheus" inspect "$dir" | sed -n 's/^    \(epoch [0-9]* clock [0-9]* ranks [0-9]*\)$/\1/p' ;;
    chunks) "$orpheus" inspect "$dir" | sed -n 's/^    \(layout rows .*\|clock [0-9]* moves .*\)$/\1/p' ;;
  esac
}

# wait_for_segments DIR N [SECONDS]: polls until DIR (a replica's log) holds N or more
# durable log segments (seg-*.h5), for at most SECONDS (default 60); returns 1 if it
# never did. With kill_job, the "kill once the log has reached disk" of the resume,
# adapt, LSTM, elastic and fault scripts.
wait_for_segments() {
  local dir=$1 want=$2 seconds=${3:-60} i
  for ((i = 0; i < seconds * 20; ++i)); do
    [ "$(ls "$dir"/seg-*.h5 2>/dev/null | wc -l)" -ge "$want" ] && return 0
    sleep 0.05
  done
  return 1
}

# kill_job PATTERN PID: SIGKILL to every process whose command line holds PATTERN
# (a job's ranks and its launcher), then reaps PID.
kill_job() {
  pkill -9 -f "$1" || true
  wait "$2" 2>/dev/null || true
}

# whole_and_resumed MPIEXEC ORPHEUS NP DIR FLAGS...: the job of FLAGS (which hold --ckpt
# sv) run whole (DIR/whole.h5, checkpoint DIR/whole), and again killed with kill -9 once
# two log segments are durable, then --resume'd (DIR/resumed.h5, checkpoint DIR/killed).
# Returns 1 when the job finished before it could be killed.
whole_and_resumed() {
  local mpiexec=$1 orpheus=$2 np=$3 dir=$4; shift 4
  "$mpiexec" -n "$np" --oversubscribe "$orpheus" train "$@" --ckpt-dir "$dir/whole" --save "$dir/whole.h5" >/dev/null
  "$mpiexec" -n "$np" --oversubscribe "$orpheus" train "$@" --ckpt-dir "$dir/killed" --save "$dir/resumed.h5" \
    >/dev/null 2>&1 &
  local job=$!
  wait_for_segments "$dir/killed/replica-0" 2 || true
  kill_job "ckpt-dir $dir/killed" "$job"
  if [ -e "$dir/resumed.h5" ]; then
    echo "the job finished before it was killed"
    return 1
  fi
  "$mpiexec" -n "$np" --oversubscribe "$orpheus" train "$@" --ckpt-dir "$dir/killed" --save "$dir/resumed.h5" \
    --resume >/dev/null
}

# json_field FILE KEY [LINE]: KEY of a metrics file's LINE-th JSON line (default: the
# last, the summary), read with a JSON parser; empty when absent.
json_field() {
  /usr/bin/python3 - "$1" "$2" "${3:--1}" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
value = json.loads(lines[int(sys.argv[3])]).get(sys.argv[2], "") if lines else ""
print(str(value).lower() if isinstance(value, bool) else value)
PY
}

# json_value KEY: KEY of the JSON object on standard input (its last line that is
# one, as `orpheus eval` prints), read with a JSON parser; empty when absent.
json_value() {
  /usr/bin/python3 -c '
import json, sys
lines = [l for l in sys.stdin if l.lstrip().startswith("{")]
value = json.loads(lines[-1]).get(sys.argv[1], "") if lines else ""
print(str(value).lower() if isinstance(value, bool) else value)' "$1"
}

# json_rows FILE KEY...: for every JSON line of FILE that has all the KEYs, their
# values on one line, separated by spaces (read with a JSON parser).
json_rows() {
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
keys = sys.argv[2:]
for line in open(sys.argv[1]):
    if not line.strip():
        continue
    record = json.loads(line)
    if all(k in record for k in keys):
        print(" ".join(str(record[k]) for k in keys))
PY
}

# same_state A B: both files hold an /optimizer group with the same entries, bitwise.
same_state() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
def entries(f):
    out = {}
    f["optimizer"].visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out
ea, eb = entries(a), entries(b)
if not ea or sorted(ea) != sorted(eb):
    sys.exit(f"optimizer entries differ: {sorted(ea)} vs {sorted(eb)}")
for n in ea:
    if not np.array_equal(ea[n], eb[n]):
        sys.exit(f"optimizer/{n} differs")
print(f"optimizer state equal: {len(ea)} entries ({', '.join(sorted(ea)[:4])}, ...)")
PY
}

# kill_rank_when_logged PID DIR N: once DIR (a replica's log) holds N segments (or
# after a minute), SIGKILL one rank of the mpiexec PID (its newest child) and reap PID.
kill_rank_when_logged() {
  local launcher=$1 victim
  wait_for_segments "$2" "$3" || true
  victim=$(pgrep -P "$launcher" | tail -n 1)
  [ -n "$victim" ] || { echo "no rank process found under $launcher"; return 1; }
  kill -9 "$victim"
  wait "$launcher" 2>/dev/null || true
}

# adapt_flags BUDGET SELECT: sets `flags` to the --adapt jobs' flags (adapt.sh,
# adapt_bf16.sh): MLR on Fashion-MNIST, batch 50, --select SELECT, random multicast
# to 2 peers, averaging every 10, decisions every 10 clocks with C in 12..24, the
# timing replayed from the recorded trace, at most BUDGET bytes a rank per clock.
adapt_flags() {
  local data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
  local trace=${ORPHEUS_TEST_DATA:-$(dirname "${BASH_SOURCE[0]}")/../data}/adapt/e2e_trace.jsonl
  flags=(--train "$data/train-images-idx3-ubyte.gz" --batch 50 --select "$2" --multicast random --fanout 2
         --average-every 10 --progress off --log-level warn
         --adapt --adapt-every 10 --adapt-select 12:24 --adapt-trace "$trace" --max-bytes-per-clock "$1")
}
