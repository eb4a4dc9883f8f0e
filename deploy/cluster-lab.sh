#!/usr/bin/env bash
# cluster-lab.sh: turns this machine into a small emulated cluster, so that
# the coordinator and worker daemons run on separate "hosts" joined by
# links of known speed, as in a real cluster.
#
#   deploy/cluster-lab.sh up [--hosts=N] [--racks=R] [--rack-rate=RATE]
#                            [--cross-rate=RATE] [--prefix=P]
#   deploy/cluster-lab.sh exec [--prefix=P] HOST COMMAND...  # run on host HOST (1..N)
#   deploy/cluster-lab.sh cut [--prefix=P] HOST   # HOST's link goes dead (a pulled
#                                                # cable: no FIN, no RST, nothing)
#   deploy/cluster-lab.sh mend [--prefix=P] HOST  # ... and comes back
#   deploy/cluster-lab.sh status [--prefix=P]
#   deploy/cluster-lab.sh burst RATE             # the token bucket a link of RATE gets, bytes
#   deploy/cluster-lab.sh down [--prefix=P]      # kills what runs there, removes all
#
# Each host is a network namespace P-hI with one interface, eth0, holding
# 198.18.0.I/24 (RFC 2544's benchmarking range: nothing outside this machine
# is ever addressed). Hosts are spread over R racks, contiguously: a rack is
# a bridge, each host's link to it is shaped to --rack-rate in both
# directions; racks are joined through a spine bridge by uplinks shaped to
# --cross-rate in both directions. So a transfer within a rack runs at
# rack-rate, one between racks at cross-rate. Shaping is tc's tbf (this
# kernel has no netem): rate, not delay. Its token bucket holds 2 ms of the
# rate, within 100 KB to 256 KB (`burst RATE` prints it): what a full bucket
# holds crosses at veth speed after an idle spell, which no wire does (with
# 256 KB at 100mbit, 512 KB arrived in 23 ms, not the 42 ms the rate allows);
# below ~100 KB tbf cuts every 64 KB GSO packet into MTU-sized ones, which
# at 100mbit both ways cost more than a core here.
#
# Defaults: 2 hosts, 2 racks, 10gbit within a rack, 1gbit between racks,
# prefix "apl". Needs root (CAP_NET_ADMIN) and iproute2. Exit codes: 0 done,
# 2 usage, 3 not allowed here (no root, or namespaces refused), 1 failed.
set -euo pipefail

PREFIX=apl
HOSTS=2
RACKS=2
RACK_RATE=10gbit
CROSS_RATE=1gbit

usage() {
  sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

die() {
  echo "cluster-lab: $*" >&2
  exit 1
}

cmd=${1:-}
[ -n "$cmd" ] || usage
shift

if [ "$cmd" = exec ]; then
  case "${1:-}" in --prefix=*) PREFIX=${1#*=}; shift ;; esac
  host=${1:-}
  [[ "$host" =~ ^[0-9]+$ ]] && [ $# -ge 2 ] || usage
  shift
  exec ip netns exec "${PREFIX}-h${host}" "$@"
fi

# burst RATE: 2 ms of RATE in bytes, within [100 KB, 256 KB]. Small enough
# that a transfer takes about what the rate says (at 100mbit the first 100 KB,
# 8 ms of the wire, go at once); big enough that tbf passes whole GSO packets
# (a bidirectional 100mbit transfer took 3.0 s of CPU a 2.7 s with a 25 KB
# bucket, 0.6 s with 100 KB or more) and reaches the rate (at 1gbit a 32 KB
# bucket fell well short of it).
burst() {
  local rate=$1 n unit bits
  [[ "$rate" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] ||
    { echo "cluster-lab: rate \"$rate\" is not like 100mbit or 10gbit" >&2; return 2; }
  n=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case "$unit" in
    bit) bits=$n ;;
    kbit) bits=$((n * 1000)) ;;
    mbit) bits=$((n * 1000000)) ;;
    gbit) bits=$((n * 1000000000)) ;;
  esac
  local bytes=$((bits / 8 / 500))
  ((bytes < 100000)) && bytes=100000
  ((bytes > 262144)) && bytes=262144
  echo "$bytes"
}

if [ "$cmd" = burst ]; then
  case "${1:-}" in --prefix=*) shift ;; esac  # the same for every lab
  [ $# -eq 1 ] || usage
  burst "$1"
  exit $?
fi

if [ "$cmd" = cut ] || [ "$cmd" = mend ]; then
  case "${1:-}" in --prefix=*) PREFIX=${1#*=}; shift ;; esac
  host=${1:-}
  [[ "$host" =~ ^[0-9]+$ ]] && [ $# -eq 1 ] || usage
  ip netns list 2>/dev/null | grep -qE "^${PREFIX}-h${host}( |$)" ||
    die "no host ${host} in the lab with prefix ${PREFIX}"
  # The host's end of its link goes down: frames to it are dropped at the
  # rack bridge, so its peers see silence, not a reset.
  ip -n "${PREFIX}-h${host}" link set eth0 "$([ "$cmd" = cut ] && echo down || echo up)"
  echo "cluster-lab: host ${host}'s link is $([ "$cmd" = cut ] && echo cut || echo back)"
  exit 0
fi

for arg in "$@"; do
  case "$arg" in
    --hosts=*) HOSTS=${arg#*=} ;;
    --racks=*) RACKS=${arg#*=} ;;
    --rack-rate=*) RACK_RATE=${arg#*=} ;;
    --cross-rate=*) CROSS_RATE=${arg#*=} ;;
    --prefix=*) PREFIX=${arg#*=} ;;
    *) echo "cluster-lab: unknown argument $arg" >&2; usage ;;
  esac
done

[[ "$PREFIX" =~ ^[a-z][a-z0-9]{0,7}$ ]] ||
  { echo "cluster-lab: --prefix must be 1-8 of [a-z0-9], starting with a letter" >&2; exit 2; }
[[ "$HOSTS" =~ ^[0-9]+$ ]] && [ "$HOSTS" -ge 1 ] && [ "$HOSTS" -le 200 ] ||
  { echo "cluster-lab: --hosts must be 1..200" >&2; exit 2; }
[[ "$RACKS" =~ ^[0-9]+$ ]] && [ "$RACKS" -ge 1 ] && [ "$RACKS" -le "$HOSTS" ] ||
  { echo "cluster-lab: --racks must be 1..hosts" >&2; exit 2; }
for rate in "$RACK_RATE" "$CROSS_RATE"; do
  [[ "$rate" =~ ^[0-9]+(bit|kbit|mbit|gbit)$ ]] ||
    { echo "cluster-lab: rate \"$rate\" is not like 100mbit or 10gbit" >&2; exit 2; }
done

ns() { echo "${PREFIX}-h$1"; }
rack_of() { echo $(( ($1 - 1) * RACKS / HOSTS )); }

shape() {  # shape DEV RATE [NETNS]
  local run=()
  [ -n "${3:-}" ] && run=(ip netns exec "$3")
  "${run[@]}" tc qdisc replace dev "$1" root tbf rate "$2" burst "$(burst "$2")" latency 50ms
}

down() {
  local n
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}-h[0-9]+$" || true); do
    # Whatever still runs on the host goes with it.
    local pids
    pids=$(ip netns pids "$n" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      kill -9 $pids 2>/dev/null || true
    fi
    ip netns delete "$n" 2>/dev/null || true
  done
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
             grep -E "^${PREFIX}(v[0-9]+|r[0-9]+|u[0-9]+|d[0-9]+|s)$" || true); do
    ip link delete "$l" 2>/dev/null || true
  done
}

case "$cmd" in
  up)
    [ "$(id -u)" -eq 0 ] || { echo "cluster-lab: needs root (network namespaces, tc)" >&2; exit 3; }
    command -v ip >/dev/null && command -v tc >/dev/null ||
      die "ip and tc (iproute2) are needed: deploy/install-deps.sh installs them"
    if ip netns list 2>/dev/null | grep -qE "^${PREFIX}-h[0-9]+"; then
      die "a lab with prefix ${PREFIX} is up already: '$0 down --prefix=${PREFIX}' first"
    fi
    if ! ip netns add "${PREFIX}-probe" 2>/dev/null; then
      echo "cluster-lab: this machine refuses network namespaces" >&2
      exit 3
    fi
    ip netns delete "${PREFIX}-probe"
    trap 'echo "cluster-lab: up failed; removing what was made" >&2; down' ERR
    ip link add "${PREFIX}s" type bridge
    ip link set "${PREFIX}s" up
    for ((r = 0; r < RACKS; r++)); do
      ip link add "${PREFIX}r$r" type bridge
      ip link set "${PREFIX}r$r" up
      if [ "$RACKS" -gt 1 ]; then
        ip link add "${PREFIX}u$r" type veth peer name "${PREFIX}d$r"
        ip link set "${PREFIX}u$r" master "${PREFIX}r$r" up
        ip link set "${PREFIX}d$r" master "${PREFIX}s" up
        shape "${PREFIX}u$r" "$CROSS_RATE"
        shape "${PREFIX}d$r" "$CROSS_RATE"
      fi
    done
    for ((i = 1; i <= HOSTS; i++)); do
      n=$(ns "$i")
      ip netns add "$n"
      ip -n "$n" link set lo up
      ip link add "${PREFIX}v$i" type veth peer name "${PREFIX}e$i"
      ip link set "${PREFIX}e$i" netns "$n"
      ip -n "$n" link set "${PREFIX}e$i" name eth0
      ip -n "$n" addr add "198.18.0.$i/24" dev eth0
      ip -n "$n" link set eth0 up
      ip link set "${PREFIX}v$i" master "${PREFIX}r$(rack_of "$i")" up
      shape "${PREFIX}v$i" "$RACK_RATE"
      shape eth0 "$RACK_RATE" "$n"
    done
    trap - ERR
    echo "cluster-lab: up: $HOSTS host(s) in $RACKS rack(s), $RACK_RATE within a rack, $CROSS_RATE between racks"
    for ((i = 1; i <= HOSTS; i++)); do
      echo "  host $i: netns $(ns "$i"), 198.18.0.$i, rack $(rack_of "$i")"
    done
    ;;
  status)
    found=0
    for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}-h[0-9]+$" | sort -V || true); do
      found=1
      addr=$(ip -n "$n" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}')
      rate=$(ip netns exec "$n" tc qdisc show dev eth0 2>/dev/null | grep -o 'rate [^ ]*' || true)
      echo "$n $addr ${rate:-unshaped} pids: $(ip netns pids "$n" 2>/dev/null | tr '\n' ' ')"
    done
    [ "$found" -eq 1 ] || echo "cluster-lab: no lab with prefix ${PREFIX}"
    ;;
  down)
    [ "$(id -u)" -eq 0 ] || { echo "cluster-lab: needs root" >&2; exit 3; }
    down
    echo "cluster-lab: down (prefix ${PREFIX})"
    ;;
  *)
    usage
    ;;
esac
