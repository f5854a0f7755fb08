#!/usr/bin/env bash
# Multi-host test on one box: network namespaces play the hosts. Creates HOSTS namespaces, each
# joined by a veth pair to a router namespace (IPv4 forwarding on there only), starts the
# ranks inside them (rank r on host PLACEMENT[r]) with distinct RINGFENCE_HOST_IDs, and runs
# multihost_test: exact collectives, shm within a host, tcp between hosts, host-contiguous ring.
# Cleans up its namespaces on any exit. Exits 77 (skipped) where namespaces cannot be made.
#
# usage: netns_multihost.sh PROGRAM HOST_OF      e.g. netns_multihost.sh build/bin/multihost_test 0,1,0,1
set -uo pipefail
prog=${1:?usage: netns_multihost.sh PROGRAM HOST_OF}
host_of=${2:?usage: netns_multihost.sh PROGRAM HOST_OF}
IFS=, read -r -a place <<<"$host_of"
n=${#place[@]}
hosts=0
for h in "${place[@]}"; do ((h + 1 > hosts)) && hosts=$((h + 1)); done

skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "network namespaces need root"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"

id=$$
router="rf${id}r"
ns_of() { echo "rf${id}h$1"; }
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for ((h = 0; h < hosts; ++h)); do ip netns del "$(ns_of $h)" 2>/dev/null; done
  ip netns del "$router" 2>/dev/null
  rm -rf "$logs"
}
logs=$(mktemp -d)
trap cleanup EXIT

ip netns add "$router" 2>/dev/null || skip "cannot create a network namespace (ip netns add failed)"
ip -n "$router" link set lo up
ip netns exec "$router" sysctl -qw net.ipv4.ip_forward=1 || skip "cannot enable forwarding in the router namespace"
for ((h = 0; h < hosts; ++h)); do
  ns=$(ns_of $h)
  ip netns add "$ns" || skip "cannot create namespace $ns"
  ip link add "v${id}a$h" type veth peer name "v${id}b$h" || skip "cannot create a veth pair"
  ip link set "v${id}a$h" netns "$ns"
  ip link set "v${id}b$h" netns "$router"
  ip -n "$ns" addr add "10.77.$h.2/24" dev "v${id}a$h"
  ip -n "$router" addr add "10.77.$h.1/24" dev "v${id}b$h"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "v${id}a$h" up
  ip -n "$router" link set "v${id}b$h" up
  ip -n "$ns" route add default via "10.77.$h.1"
done

token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
port=$((20000 + RANDOM % 20000))
store="10.77.${place[0]}.2:$port"
echo "# $n ranks on $hosts hosts (host of each rank: $host_of), store at $store"
for ((r = 0; r < n; ++r)); do
  h=${place[$r]}
  local_rank=0
  for ((q = 0; q < r; ++q)); do [[ ${place[$q]} == "$h" ]] && local_rank=$((local_rank + 1)); done
  ip netns exec "$(ns_of "$h")" env RINGFENCE_RANK=$r RINGFENCE_WORLD_SIZE=$n RINGFENCE_LOCAL_RANK=$local_rank \
    RINGFENCE_STORE_ADDR="$store" RINGFENCE_STORE_HOST=$([[ $r == 0 ]] && echo 1 || echo 0) RINGFENCE_JOB_TOKEN="$token" \
    RINGFENCE_HOST_ID="netns-host-$h" RINGFENCE_TRANSPORTS=shm,tcp RINGFENCE_TIMEOUT_MS=${RINGFENCE_TIMEOUT_MS:-30000} \
    MULTIHOST_HOST_OF="$host_of" timeout 120 "$prog" >"$logs/$r.log" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < n; ++r)); do
  wait "${pids[$r]}" || status=1
done
pids=()
for ((r = 0; r < n; ++r)); do sed "s/^/[$r] /" "$logs/$r.log"; done
exit $status
