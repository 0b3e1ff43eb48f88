#!/usr/bin/env bash
# An emulated cluster on one machine: N hosts, each a network namespace with its own
# address, joined to one switch (a Linux bridge) by a rate-limited full-duplex link.
# MPI ranks and other processes started in the hosts talk over these links only, so
# traffic sees the link rate and delay instead of shared memory. Needs root.
#
# Usage: scripts/netcluster.sh COMMAND [ARGS]
#   up N [--rate R] [--delay D]  create hosts orph-h0 .. orph-h{N-1} (1 <= N <= 250) with
#                                eth0 = 198.18.0.(i+1)/24, joined to bridge orph-br0
#                                (198.18.0.254/24) by veth pairs. Each link is limited to
#                                rate R (tbf; default 1gbit) in both directions: host eth0
#                                egress (upload) and bridge-side veth egress (download).
#                                D (default 0.1ms) is a netem delay on each host's eth0
#                                egress, so host to host one way is D and a round trip 2D;
#                                0 leaves netem out. R: NUMBER[bit|kbit|mbit|gbit|tbit|bps|
#                                kbps|mbps|gbps] (tc units, bps = bytes/s); D: NUMBER[us|ms|s].
#                                An existing cluster is removed first.
#   rate R                       change every link's rate on the running cluster (both
#                                directions, delay kept): a job that is running sees its
#                                network get slower or faster from the next packets on
#   down                         remove namespaces, veths, bridge and the agent (idempotent)
#   status                       hosts, addresses and qdiscs
#   hosts                        comma-separated host addresses, for mpirun --host
#   mpirun-args                  the extra mpirun options, on one line, space separated:
#                                  mpirun -np 4 $(scripts/netcluster.sh mpirun-args) prog ...
#                                (--host with one slot per host, the launch agent, TCP
#                                transport restricted to 198.18.0.0/24, --oversubscribe, and
#                                a launch that has not started within $NETCLUSTER_STARTUP_TIMEOUT
#                                seconds, default 60, fails instead of hanging)
#   exec I COMMAND...            run COMMAND inside host I's namespace
#   tx-bytes                     total bytes sent so far by every host's eth0
#   agent [OPTIONS] HOST CMD...  the remote-shell agent mpirun calls in place of ssh: skips
#                                ssh-style options, maps HOST (an address or a namespace name)
#                                to its namespace and runs CMD there under /bin/sh -c.
#                                `up` writes /tmp/orph-netcluster/agent, a wrapper for this.
#   -h, --help                   this text
#
# mpirun as root also needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# (scripts/common.sh exports them). Example:
#   scripts/netcluster.sh up 4 --rate 1gbit
#   mpirun -np 4 $(scripts/netcluster.sh mpirun-args) build-release/engine/orpheus train ...
#   scripts/netcluster.sh exec 0 env GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 ...
#   scripts/netcluster.sh down
# Open MPI may print "plm:rsh: Warning: setpgid(...) failed in parent": a harmless race between
# mpirun and the agent it started (as with ssh). Kernels without the netem qdisc get the rate
# limit only (one warning line at up).
# Exit codes: 0 success, 2 bad arguments or not permitted, 1 other failures.
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
PREFIX=orph
BRIDGE=orph-br0
NET=198.18.0
SUBNET=198.18.0.0/24
BRIDGE_ADDR=$NET.254/24
STATE=/tmp/orph-netcluster
AGENT=$STATE/agent
MAX_HOSTS=250

die() { echo "netcluster: $1" >&2; exit "${2:-1}"; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$SELF"; }

ns_name() { echo "$PREFIX-h$1"; }
# The root-namespace end of host i's link (enslaved to the bridge).
veth_name() { echo "$PREFIX-v$1"; }
host_addr() { echo "$NET.$(($1 + 1))"; }

# Indices of the hosts that exist, in order.
existing_hosts() {
  local ns
  { ip netns list 2>/dev/null || true; } | awk '{print $1}' | while read -r ns; do
    case $ns in "$PREFIX"-h[0-9]*) echo "${ns#"$PREFIX"-h}" ;; esac
  done | sort -n
}

require_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, veths and tc need CAP_NET_ADMIN)" 2
}

ensure_iproute2() {
  if command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1; then return; fi
  echo "netcluster: installing iproute2" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null; } ||
    die "could not install iproute2"
  command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || die "iproute2 installed but ip/tc not found"
}

require_cluster() {
  [ -n "$(existing_hosts)" ] || die "no cluster is up (run: scripts/netcluster.sh up N)"
}

# --- down -----------------------------------------------------------------------------------
cmd_down() {
  local i ns
  for i in $(existing_hosts); do
    ip link del "$(veth_name "$i")" 2>/dev/null || true   # deletes the pair
    ip netns del "$(ns_name "$i")" 2>/dev/null || true
  done
  # a permission probe left by an interrupted up
  for ns in $({ ip netns list 2>/dev/null || true; } | awk '{print $1}'); do
    case $ns in "$PREFIX"-probe[0-9]*) ip netns del "$ns" 2>/dev/null || true ;; esac
  done
  # veths whose namespace is already gone (an interrupted up)
  { ip -o link show 2>/dev/null || true; } | awk -F': ' '{print $2}' | sed 's/@.*//' |
    { grep -E "^$PREFIX-[vp][0-9]+$" || true; } | while read -r dev; do ip link del "$dev" 2>/dev/null || true; done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
  rm -rf "$STATE"
}

# --- up -------------------------------------------------------------------------------------
# Rate in bits per second from tc syntax (integer arithmetic in awk, for burst sizing).
rate_bits() {
  awk -v r="$1" 'BEGIN {
    match(r, /^[0-9]+(\.[0-9]+)?/); n = substr(r, 1, RLENGTH); u = substr(r, RLENGTH + 1)
    m["bit"]=1; m["kbit"]=1e3; m["mbit"]=1e6; m["gbit"]=1e9; m["tbit"]=1e12
    m["bps"]=8; m["kbps"]=8e3; m["mbps"]=8e6; m["gbps"]=8e9; m["tbps"]=8e12
    printf "%.0f\n", n * m[u] }'
}

# The rate R in tc syntax, lowercased, or exit 2 naming the command that was given it.
check_rate() {
  local cmd=$1 rate=${2,,}
  [[ $rate =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$ ]] ||
    die "$cmd: bad rate '$2' (expected e.g. 100mbit, 1gbit, 10gbit, 125mbps)" 2
  [ "$(rate_bits "$rate")" -ge 8000 ] || die "$cmd: rate '$2' is below 8kbit" 2
  echo "$rate"
}

# The tbf qdisc's arguments for rate R. The bucket must hold a few packets (and the largest
# GSO super-packet) at any rate; 256 KiB as measured to give ~0.94 Gbit/s at 1gbit, more
# above 1gbit (2 ms worth of the rate).
tbf_args() {
  local bits; bits=$(rate_bits "$1")
  local burst=$((bits / 8 / 500)); [ "$burst" -ge 262144 ] || burst=262144
  echo "tbf rate $1 burst $burst latency 50ms"
}

BUILDING=0
up_exit() {
  local rc=$?
  if [ "$BUILDING" -eq 1 ]; then
    BUILDING=0
    echo "netcluster: up did not finish (exit $rc), removing what was created" >&2
    cmd_down || true
  fi
}

cmd_up() {
  local n="" rate=1gbit delay=0.1ms
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) [ $# -ge 2 ] || die "--rate needs a value, e.g. --rate 1gbit" 2; rate=$2; shift 2 ;;
      --rate=*) rate=${1#--rate=}; shift ;;
      --delay) [ $# -ge 2 ] || die "--delay needs a value, e.g. --delay 0.1ms" 2; delay=$2; shift 2 ;;
      --delay=*) delay=${1#--delay=}; shift ;;
      -*) die "up: unknown option '$1' (options: --rate R, --delay D)" 2 ;;
      *) [ -z "$n" ] || die "up: more than one host count given ('$n', '$1')" 2; n=$1; shift ;;
    esac
  done
  [ -n "$n" ] || die "up: give the number of hosts, e.g. up 4" 2
  [[ $n =~ ^[0-9]+$ ]] && [ "$((10#$n))" -ge 1 ] && [ "$((10#$n))" -le $MAX_HOSTS ] ||
    die "up: the number of hosts must be an integer from 1 to $MAX_HOSTS, got '$n'" 2
  n=$((10#$n))
  rate=$(check_rate up "$rate")
  delay=${delay,,}
  [[ $delay =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || die "up: bad --delay '$delay' (expected e.g. 0.1ms, 50us, 0ms)" 2
  local use_netem=1
  [[ $delay =~ ^0+(\.0+)?(us|ms|s)$ ]] && use_netem=0

  require_root
  ensure_iproute2
  local probe="$PREFIX-probe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    die "'ip netns add' is not permitted here (needs CAP_SYS_ADMIN and a writable /run/netns)" 2
  fi
  ip netns del "$probe"

  [ -z "$(existing_hosts)" ] && ! ip link show "$BRIDGE" >/dev/null 2>&1 || {
    echo "netcluster: removing the existing cluster" >&2; cmd_down; }

  # From here on an interrupt or a failure (set -e, die) removes what was built.
  BUILDING=1
  trap 'exit 130' INT; trap 'exit 143' TERM; trap up_exit EXIT

  local tbf; read -ra tbf <<< "$(tbf_args "$rate")"

  ip link add "$BRIDGE" type bridge
  ip addr add "$BRIDGE_ADDR" dev "$BRIDGE"
  ip link set "$BRIDGE" up

  local i ns veth peer warned=0
  for ((i = 0; i < n; i++)); do
    ns=$(ns_name "$i"); veth=$(veth_name "$i"); peer="$PREFIX-p$i"
    ip netns add "$ns"
    ip link add "$veth" type veth peer name "$peer"
    ip link set "$peer" netns "$ns"
    ip -n "$ns" link set "$peer" name eth0
    ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip link set "$veth" master "$BRIDGE"
    ip link set "$veth" up
    # Upload: delay, then the rate limit, on the host's eth0.
    if [ "$use_netem" -eq 1 ] &&
       ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: netem delay "$delay" limit 10000 2>/dev/null; then
      ip netns exec "$ns" tc qdisc add dev eth0 parent 1:1 handle 10: "${tbf[@]}" ||
        die "tc: cannot add the tbf qdisc under netem in $ns"
    else
      if [ "$use_netem" -eq 1 ] && [ "$warned" -eq 0 ]; then
        echo "netcluster: warning: the netem qdisc is not available in this kernel; links get the rate limit only, no delay" >&2
        warned=1
      fi
      use_netem=0
      ip netns exec "$ns" tc qdisc add dev eth0 root handle 10: "${tbf[@]}" ||
        die "tc: cannot add the tbf qdisc (is sch_tbf available in this kernel?)"
    fi
    # Download: the rate limit on the bridge side of the link.
    tc qdisc add dev "$veth" root handle 10: "${tbf[@]}" || die "tc: cannot add the tbf qdisc on $veth"
  done

  mkdir -p "$STATE"
  printf '#!/bin/sh\nexec %q agent "$@"\n' "$SELF" > "$AGENT"
  chmod 755 "$AGENT"
  local desc="rate $rate"; [ "$use_netem" -eq 1 ] && desc+=", delay $delay one way"
  printf 'n=%s\nrate=%s\ndelay=%s\n' "$n" "$rate" "$([ "$use_netem" -eq 1 ] && echo "$delay" || echo 0)" > "$STATE/config"
  BUILDING=0
  trap - INT TERM EXIT
  echo "netcluster: $n hosts up ($desc): $(cmd_hosts)"
}

# --- rate: change the links of a running cluster -------------------------------------------
cmd_rate() {
  [ $# -eq 1 ] || die "rate: usage: rate R (e.g. rate 1gbit)" 2
  local rate; rate=$(check_rate rate "$1")
  require_root
  require_cluster
  local tbf; read -ra tbf <<< "$(tbf_args "$rate")"
  local i ns parent
  for i in $(existing_hosts); do
    ns=$(ns_name "$i")
    # Under netem the tbf is its child 10: at 1:1; without netem it is the root 10:.
    parent=root
    ip netns exec "$ns" tc qdisc show dev eth0 | grep -q '^qdisc netem 1:' && parent="parent 1:1"
    # shellcheck disable=SC2086
    ip netns exec "$ns" tc qdisc change dev eth0 $parent handle 10: "${tbf[@]}" ||
      die "rate: tc cannot change the upload qdisc in $ns"
    tc qdisc change dev "$(veth_name "$i")" root handle 10: "${tbf[@]}" ||
      die "rate: tc cannot change the download qdisc on $(veth_name "$i")"
  done
  [ -f "$STATE/config" ] && sed -i "s/^rate=.*/rate=$rate/" "$STATE/config"
  echo "netcluster: links now at rate $rate"
}

# --- queries --------------------------------------------------------------------------------
cmd_hosts() {
  require_cluster
  local i out=""
  for i in $(existing_hosts); do out+="${out:+,}$(host_addr "$i")"; done
  echo "$out"
}

cmd_mpirun_args() {
  require_cluster
  [ -x "$AGENT" ] || die "the launch agent $AGENT is missing (run up again)"
  local i hosts=""
  for i in $(existing_hosts); do hosts+="${hosts:+,}$(host_addr "$i"):1"; done
  # A launch can stall with one host's daemon missing (seen about once in 40 launches):
  # orte_startup_timeout makes mpirun fail then instead of waiting forever.
  echo "--host $hosts --oversubscribe --mca plm_rsh_agent $AGENT --mca plm_rsh_no_tree_spawn 1" \
       "--mca btl tcp,self --mca btl_tcp_if_include $SUBNET --mca oob_tcp_if_include $SUBNET" \
       "--mca orte_startup_timeout ${NETCLUSTER_STARTUP_TIMEOUT:-60}"
}

cmd_status() {
  local hosts; hosts=$(existing_hosts)
  if [ -z "$hosts" ]; then echo "netcluster: no cluster is up"; return 0; fi
  [ -f "$STATE/config" ] && echo "config: $(tr '\n' ' ' < "$STATE/config")"
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    echo "bridge $BRIDGE $(ip -o -4 addr show dev "$BRIDGE" | awk '{print $4}')"
  else
    echo "bridge $BRIDGE missing"
  fi
  local i ns
  for i in $hosts; do
    ns=$(ns_name "$i")
    echo "host $i: namespace $ns, eth0 $(ip -n "$ns" -o -4 addr show dev eth0 2>/dev/null | awk '{print $4}')," \
         "link $(veth_name "$i")"
    ip netns exec "$ns" tc qdisc show dev eth0 | sed 's/^/  eth0 (upload):   /'
    tc qdisc show dev "$(veth_name "$i")" | sed 's/^/  bridge side (download): /'
  done
}

cmd_tx_bytes() {
  require_cluster
  local i total=0 b
  for i in $(existing_hosts); do
    b=$(ip netns exec "$(ns_name "$i")" cat /sys/class/net/eth0/statistics/tx_bytes)
    total=$((total + b))
  done
  echo "$total"
}

cmd_exec() {
  [ $# -ge 2 ] || die "exec: usage: exec I COMMAND..." 2
  local i=$1; shift
  [[ $i =~ ^[0-9]+$ ]] || die "exec: host index must be a number, got '$i'" 2
  local ns; ns=$(ns_name "$((10#$i))")
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$ns" || die "exec: host $i does not exist" 2
  exec ip netns exec "$ns" "$@"
}

# Called by mpirun like ssh: AGENT [ssh options] HOST COMMAND...
cmd_agent() {
  while [ $# -gt 0 ]; do
    case $1 in
      --) shift; break ;;
      -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;   # ssh options that take a value
      -*) shift ;;
      *) break ;;
    esac
  done
  [ $# -ge 1 ] || { echo "netcluster agent: no host given" >&2; exit 255; }
  local host=${1%%:*} ns=""; shift
  host=${host#*@}
  if [[ $host =~ ^${NET//./\\.}\.([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 1 ] && [ "${BASH_REMATCH[1]}" -le $MAX_HOSTS ]; then
    ns=$(ns_name "$((BASH_REMATCH[1] - 1))")
  elif [[ $host =~ ^$PREFIX-h[0-9]+$ ]]; then
    ns=$host
  fi
  [ -n "$ns" ] && [ -e "/run/netns/$ns" ] || { echo "netcluster agent: unknown host '$host'" >&2; exit 255; }
  [ $# -ge 1 ] || { echo "netcluster agent: no command for $host" >&2; exit 255; }
  # Like ssh: the words are joined with spaces and the remote shell interprets them.
  exec ip netns exec "$ns" /bin/sh -c "$*"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  rate) shift; cmd_rate "$@" ;;
  down) require_root; command -v ip >/dev/null 2>&1 || exit 0; cmd_down; echo "netcluster: down" ;;
  status) require_root; cmd_status ;;
  hosts) cmd_hosts ;;
  mpirun-args) cmd_mpirun_args ;;
  exec) shift; require_root; cmd_exec "$@" ;;
  tx-bytes) require_root; cmd_tx_bytes ;;
  agent) shift; cmd_agent "$@" ;;
  -h|--help|help) usage ;;
  "") usage >&2; exit 2 ;;
  *) die "unknown command '$1' (run with -h for usage)" 2 ;;
esac
