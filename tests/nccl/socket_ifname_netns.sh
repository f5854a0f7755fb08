#!/usr/bin/env bash
# NCCL_SOCKET_IFNAME under the shim picks the interface of the tcp data sockets and of the
# bootstrap store, not only the bootstrap (issue #27). A network namespace with two interfaces,
# d0 (10.78.0.1) and d1 (10.78.1.1), each one end of a veth pair whose other end sits unused in
# the same namespace (the dummy module is missing on some kernels); nccl_api_test runs on 2 ranks with NCCL_SHM_DISABLE=1
# (so ranks talk tcp) and NCCL_DEBUG=INFO, once per interface; every "tcp: listening on" line
# must name that interface's address, never the other's, and the test must pass.
# Exits 77 (skipped) where namespaces cannot be made.
#
# usage: socket_ifname_netns.sh RINGFENCE_RUN NCCL_API_TEST
set -uo pipefail
run=${1:?usage: socket_ifname_netns.sh RINGFENCE_RUN NCCL_API_TEST}
prog=${2:?usage: socket_ifname_netns.sh RINGFENCE_RUN NCCL_API_TEST}
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[[ $(id -u) == 0 ]] || skip "network namespaces need root"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
ns="rf$$ifname"
out=$(mktemp)
trap 'ip netns del "$ns" 2>/dev/null; rm -f "$out"' EXIT
ip netns add "$ns" 2>/dev/null || skip "cannot create a network namespace"
ip -n "$ns" link set lo up
for i in 0 1; do
  ip -n "$ns" link add "d$i" type veth peer name "p$i" 2>/dev/null || skip "cannot create a veth pair"
  ip -n "$ns" addr add "10.78.$i.1/24" dev "d$i"
  ip -n "$ns" link set "p$i" up
  ip -n "$ns" link set "d$i" up
done
for pick in 0 1; do
  other=$((1 - pick))
  ip netns exec "$ns" env NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME="=d$pick" NCCL_SHM_DISABLE=1 \
    "$run" -n 2 --timeout 120 "$prog" >"$out" 2>&1
  rc=$?
  [[ $rc == 0 ]] || { cat "$out"; fail "nccl_api_test exited $rc with NCCL_SOCKET_IFNAME==d$pick"; }
  listening=$(grep -c "tcp: listening on 10.78.$pick.1:" "$out")
  wrong=$(grep -c "tcp: listening on 10.78.$other.1:" "$out")
  applied=$(grep -c "NCCL_SOCKET_IFNAME==d$pick: bootstrap and tcp data sockets" "$out")
  store=$(grep -c "hosting the bootstrap store at 10.78.$pick.1:" "$out")
  echo "NCCL_SOCKET_IFNAME==d$pick: $listening tcp listeners on 10.78.$pick.1, $wrong on 10.78.$other.1, store on d$pick: $store, reported: $applied"
  [[ $listening -ge 2 && $wrong == 0 && $applied -ge 1 && $store -ge 1 ]] || { cat "$out"; fail "data sockets did not follow NCCL_SOCKET_IFNAME==d$pick"; }
done
echo "socket ifname: data sockets follow NCCL_SOCKET_IFNAME"
