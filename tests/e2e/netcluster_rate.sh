#!/usr/bin/env bash
# The emulated cluster's links change rate while it runs: `rate R` replaces the tbf on both
# directions of every link and keeps the cluster up; a bad rate is exit 2 and changes nothing.
# Skipped (77) without root or network namespaces, or while a cluster is already up (the
# test must not take down someone's benchmark).
set -uo pipefail
NETCLUSTER=$1
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root"; exit 77; }
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || { echo "skip: needs iproute2"; exit 77; }
if ls /run/netns 2>/dev/null | grep -q '^orph-h'; then echo "skip: a cluster is already up"; exit 77; fi
probe="orph-test-probe$$"
ip netns add "$probe" 2>/dev/null || { echo "skip: ip netns add is not permitted"; exit 77; }
ip netns del "$probe"

fail() { echo "FAIL: $1"; "$NETCLUSTER" down >/dev/null 2>&1; exit 1; }
trap '"$NETCLUSTER" down >/dev/null 2>&1' EXIT

"$NETCLUSTER" up 2 --rate 1gbit >/dev/null || fail "up 2 --rate 1gbit"
qdiscs() { "$NETCLUSTER" status | grep -c "tbf 10: .*rate $1"; }
# Two hosts, two directions each.
[ "$(qdiscs 1Gbit)" -eq 4 ] || fail "up did not give four 1Gbit links: $("$NETCLUSTER" status)"

[[ $("$NETCLUSTER" rate 100mbit) == *"links now at rate 100mbit"* ]] || fail "rate 100mbit"
[ "$(qdiscs 100Mbit)" -eq 4 ] || fail "rate 100mbit did not reach every link: $("$NETCLUSTER" status)"
[[ $("$NETCLUSTER" status) == *"rate=100mbit"* ]] || fail "the recorded config still has the old rate"
[ -n "$("$NETCLUSTER" hosts)" ] || fail "the cluster went down"

out=$("$NETCLUSTER" rate fast 2>&1); rc=$?
[ "$rc" -eq 2 ] || fail "rate fast: exit $rc, expected 2"
echo "$out" | grep -q "rate: bad rate 'fast'" || fail "rate fast: '$out'"
[ "$(qdiscs 100Mbit)" -eq 4 ] || fail "a bad rate changed the links"

"$NETCLUSTER" rate 10gbit >/dev/null || fail "rate 10gbit"
[ "$(qdiscs 10Gbit)" -eq 4 ] || fail "rate 10gbit did not reach every link"
"$NETCLUSTER" down >/dev/null
out=$("$NETCLUSTER" rate 1gbit 2>&1); rc=$?
[ "$rc" -ne 0 ] && echo "$out" | grep -q "no cluster is up" || fail "rate without a cluster: exit $rc, '$out'"
echo "ok"
