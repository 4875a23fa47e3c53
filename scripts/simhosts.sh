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
#   scripts/simhosts.sh delay K MS   delays host K's link by MS ms each way (0 or off: no
#                                    delay): its veth is replaced by two TAP devices, tfsift0
#                                    in the host and pK on the bridge, between which a
#                                    userspace delay line (simhosts-bin/delayline.py) copies
#                                    the frames, for kernels without netem. A frame between
#                                    two delayed hosts is delayed twice. While a delay is on,
#                                    every link's MTU is 65521 (few frames to copy per MB).
#                                    A rate still goes on tfsift0 inside the host, after the
#                                    delay (each delay makes new devices): ip netns exec
#                                    tfsift-hK tc qdisc replace dev tfsift0 root tbf ... (a
#                                    burst of at least the MTU). Ending a delay line prints
#                                    the frames and bytes it copied and its CPU time
#
# TFSIFT_SIMHOSTS_PRIVATE=DIR: every host sees its own empty DIR (a tmpfs mounted there
# for that host's processes only): a directory that is not shared between hosts.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PREFIX=tfsift-h
SWITCH=tfsift-sw
NET=10.251.0
IFACE=tfsift0
MTU=1500
DELAY_MTU=65521  # a TAP's largest: a 64 KiB TCP segment is one frame to copy, not 45

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
    ip -n "$PREFIX$k" link set lo up
    veth "$k" "$MTU"
  done
  trap - ERR
}

attach() {  # host K's two ends, which exist: the host's addressed, the switch's on the bridge
  local k="$1" mtu="$2"
  ip -n "$SWITCH" link set "p$k" mtu "$mtu" master br0 up
  ip -n "$PREFIX$k" link set "$IFACE" mtu "$mtu"
  ip -n "$PREFIX$k" addr add "$NET.$k/24" dev "$IFACE"
  ip -n "$PREFIX$k" link set "$IFACE" up
}

veth() {  # host K's link as a veth pair
  ip -n "$SWITCH" link add "p$1" type veth peer name "$IFACE" netns "$PREFIX$1"
  attach "$1" "$2"
}

delayline_pid() {  # host K's delay line (any host's without K), if it runs: in the switch's namespace
  local pid
  for pid in $(ip netns pids "$SWITCH"); do
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "delayline.py $PREFIX${1:-}"; then
      echo "$pid"
    fi
  done
}

link_mtu() { if [ -n "$(delayline_pid)" ]; then echo "$DELAY_MTU"; else echo "$MTU"; fi; }

set_mtu() {  # every host's link, both ends
  local ns
  for ns in $(hosts); do
    [ "$ns" = "$SWITCH" ] && continue
    ip -n "$SWITCH" link set "p${ns#"$PREFIX"}" mtu "$1" 2>/dev/null || true
    ip -n "$ns" link set "$IFACE" mtu "$1" 2>/dev/null || true
  done
}

wait_for() {  # polls CMD... for up to 5 s, until it exits 0 (then 0) or 2 (then 1)
  local i rc
  for i in $(seq 50); do
    rc=0
    "$@" || rc=$?
    [ "$rc" = 0 ] && return 0
    [ "$rc" = 2 ] && return 1
    sleep 0.1
  done
  return 1
}

delayline_log() { echo "${TMPDIR:-/tmp}/tfsift-delayline-$1.log"; }

stop_delayline() {  # host K's, if it runs; its TAP devices go with it (its fds close)
  local pid
  pid="$(delayline_pid "$1 ")"
  [ -n "$pid" ] || return 0
  kill "$pid"
  # both ends: the host's may outlive the switch's a moment, and delay off would then find
  # it, give the host no veth, and leave it without a link once it went
  wait_for sh -c "! ip -n $SWITCH link show p$1 >/dev/null 2>&1 &&
    ! ip -n $PREFIX$1 link show $IFACE >/dev/null 2>&1"
  tail -n 1 "$(delayline_log "$1")"  # what it copied and the CPU it took
}

delay() {
  local k="$1" ms="$2" log
  log="$(delayline_log "$1")"
  ip netns list | awk '{print $1}' | grep -qx "$PREFIX$k" || { echo "simhosts: delay needs an existing host number. Received: '$k'" >&2; exit 2; }
  [ "$ms" = off ] && ms=0
  [[ "$ms" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "simhosts: delay needs a delay in ms (a number >= 0, or off). Received: '$2'" >&2; exit 2; }
  stop_delayline "$k"
  if awk "BEGIN { exit !($ms == 0) }"; then
    [ "$(link_mtu)" = "$DELAY_MTU" ] || set_mtu "$MTU"
    ip -n "$PREFIX$k" link show "$IFACE" >/dev/null 2>&1 || veth "$k" "$(link_mtu)"
    return
  fi
  ip -n "$SWITCH" link del "p$k" 2>/dev/null || true  # the veth, both ends
  # a failed start leaves the host its veth
  trap 'stop_delayline "$k" >/dev/null; veth "$k" "$(link_mtu)"' ERR
  setsid python3 "$HERE/simhosts-bin/delayline.py" "$PREFIX$k" "$IFACE" "$SWITCH" "p$k" "$ms" \
    </dev/null >"$log" 2>&1 &
  # until both devices exist, or it ended (gone, or a zombie, which kill -0 does not tell)
  if ! wait_for sh -c "{ ! [ -e /proc/$!/stat ] || grep -q '^[^)]*) Z' /proc/$!/stat; } && exit 2
    ip -n $SWITCH link show p$k && ip -n $PREFIX$k link show $IFACE" >/dev/null 2>&1; then
    echo "simhosts: host $k's delay line did not start: $(cat "$log")" >&2
    false
  fi
  set_mtu "$DELAY_MTU"
  attach "$k" "$DELAY_MTU"
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
  delay) delay "${2:-}" "${3:-}" ;;
  exec)
    shift
    ip netns list | awk '{print $1}' | grep -qx "${PREFIX}1" || { echo "simhosts: no simulated hosts; run: $0 up N" >&2; exit 2; }
    exec "$HERE/simhosts-bin/on-host" "${PREFIX}1" env PATH="$HERE/simhosts-bin:$PATH" \
      OMPI_MCA_btl_tcp_if_include="$NET.0/24" OMPI_MCA_oob_tcp_if_include="$NET.0/24" "$@"
    ;;
  *) sed -n '2,34p' "$0" >&2; exit 2 ;;
esac
