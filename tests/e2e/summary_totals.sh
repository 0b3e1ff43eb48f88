# Sourced by the live-membership tests.
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
