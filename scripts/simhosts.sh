#!/usr/bin/env bash
# Simulated hosts on this machine, for running and testing tfsift across hosts.
#
# Each host is a Linux network namespace, tfsift-h1 .. tfsift-hN, with its own loopback and
# one interface, tfsift0, at 10.251.0.K/24 (host K); a bridge in a namespace of its own,
# tfsift-sw, joins them. Nothing is created or changed outside these namespaces: the links
# are made inside them, and the subnet exists only there. Needs root and iproute2.
#
#   scripts/simhosts.sh up N         makes hosts 1..N (an existing set is removed first)
#   scripts/simhosts.sh down         removes them, ending any process still in them
#   scripts/simhosts.sh check        exits 0 if this machine can make them, else says why
#   scripts/simhosts.sh addr K       prints host K's address
#   scripts/simhosts.sh exec CMD...  runs CMD on host 1 (run mpirun or horovodrun there),
#                                    with the stand-in ssh first on PATH (it runs a command
#                                    "on" a host by entering that host's namespace) and Open
#                                    MPI's TCP traffic kept to the simulated hosts' subnet
#                                    (OMPI_MCA_btl_tcp_if_include and _oob_tcp_if_include set
#                                    to 10.251.0.0/24, as a cluster names its interface:
#                                    docs/cluster.md)
#
# TFSIFT_SIMHOSTS_PRIVATE=DIR: every host sees its own empty DIR (a tmpfs mounted there
# for that host's processes only): a directory that is not shared between hosts.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PREFIX=tfsift-h
SWITCH=tfsift-sw
NET=10.251.0
IFACE=tfsift0

hosts() { ip netns list | awk '{print $1}' | grep -E "^($PREFIX[0-9]+|$SWITCH)$" || true; }

down() {
  local ns
  for ns in $(hosts); do
    ip netns pids "$ns" | xargs -r kill -9 2>/dev/null || true
    ip netns delete "$ns"
  done
}

up() {
  local n="$1" k
  [[ "$n" =~ ^[1-9][0-9]?$ ]] || { echo "simhosts: up needs a number of hosts 1-99. Received: '$n'" >&2; exit 2; }
  down
  trap 'down' ERR  # a half-made set is removed
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link add br0 type bridge
  ip -n "$SWITCH" link set br0 up
  for k in $(seq 1 "$n"); do
    ip netns add "$PREFIX$k"
    ip -n "$SWITCH" link add "p$k" type veth peer name "$IFACE" netns "$PREFIX$k"
    ip -n "$SWITCH" link set "p$k" master br0 up
    ip -n "$PREFIX$k" addr add "$NET.$k/24" dev "$IFACE"
    ip -n "$PREFIX$k" link set "$IFACE" up
    ip -n "$PREFIX$k" link set lo up
  done
  trap - ERR
}

check() {
  local probe="tfsift-probe-$$"
  if [ "$(id -u)" != 0 ]; then echo "simulated hosts need root (network namespaces); running as uid $(id -u)"; exit 1; fi
  command -v ip >/dev/null || { echo "simulated hosts need iproute2 (the ip command)"; exit 1; }
  command -v unshare >/dev/null || { echo "simulated hosts need unshare (util-linux)"; exit 1; }
  if ! err=$(ip netns add "$probe" 2>&1); then echo "this machine does not allow network namespaces: $err"; exit 1; fi
  ip netns delete "$probe"
}

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down ;;
  check) check ;;
  addr) echo "$NET.${2:?host number}" ;;
  exec)
    shift
    ip netns list | awk '{print $1}' | grep -qx "${PREFIX}1" || { echo "simhosts: no simulated hosts; run: $0 up N" >&2; exit 2; }
    exec "$HERE/simhosts-bin/on-host" "${PREFIX}1" env PATH="$HERE/simhosts-bin:$PATH" \
      OMPI_MCA_btl_tcp_if_include="$NET.0/24" OMPI_MCA_oob_tcp_if_include="$NET.0/24" "$@"
    ;;
  *) sed -n '2,22p' "$0" >&2; exit 2 ;;
esac
