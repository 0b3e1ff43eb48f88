# Sourced by the live-membership tests (elastic_live.sh, elastic_live_changes.sh).
# checkTotals METRICS: the summary counts the traffic of the whole run, over its
# membership epochs: the sum of every clock's line.
checkTotals() {
  local k want got
  for k in bytes_sent messages; do
    want=$(grep '^{"clock"' "$1" | grep -o "\"$k\": [0-9]*" | awk '{s += $2} END {printf "%d", s}')
    got=$(grep '"summary": true' "$1" | grep -o "\"$k\": [0-9]*" | awk '{print $2}')
    [ -n "$got" ] && [ "$got" = "$want" ] || { echo "$1: the summary's $k is $got, the clocks' sum $want"; exit 1; }
  done
}
# checkEnd DIR RANKS (uses $orpheus, $compare, $clocks): the job ended on RANKS ranks
# after its clocks, its summary covers every epoch, and every replica restores, at the
# last clock, to what its rank held.
checkEnd() {
  local d=$1 ranks=$2
  tail -n 1 "$d/m.jsonl" | grep -q "\"clocks\": $clocks," || { echo "$d: the job did not finish its clocks"; exit 1; }
  tail -n 1 "$d/m.jsonl" | grep -q "\"ranks\": $ranks," || { echo "$d: the job did not end on $ranks ranks"; exit 1; }
  [ "$(ls "$d/replicas" | wc -l)" -eq "$ranks" ]
  checkTotals "$d/m.jsonl"
  for r in $(seq 0 $((ranks - 1))); do
    "$orpheus" restore --ckpt-dir "$d/ckpt" --replica "$r" --clock "$clocks" --out "$d/restored$r.h5" >/dev/null
    "$compare" "$d/restored$r.h5" "$d/replicas/replica-$r.h5" 0
  done
  "$compare" "$d/restored0.h5" "$d/final.h5" 0
}
