#!/usr/bin/env bash
# Cost of call fingerprints (RINGFENCE_CHECK_CALLS): allreduce latency with the check on and
# off, side by side in one run (alternating, best of --reps), over shm at 2 and 4 ranks (or
# --ranks), small messages where a neighbour exchange per call is visible at all (up to --max
# bytes, default 1M). With --transport tcp the ranks talk over --ifname (default lo).
#   bench/fingerprint_cost.sh [--build build] [--ranks "2 4"] [--reps 3] [--transport shm] [--max 1M] [--ifname lo]
set -euo pipefail
build=build ranks="2 4" reps=3 transport=shm max=1M ifname=lo
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --max) max=$2; shift 2 ;;
    --ifname) ifname=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
run=$build/bin/ringfence-run perf=$build/bin/all_reduce_perf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| ranks | bytes | off (us) | on (us) | on / off |"
echo "|---|---|---|---|---|"
for n in $ranks; do
  for rep in $(seq "$reps"); do
    for mode in off on; do
      RINGFENCE_TRANSPORTS=$transport RINGFENCE_SOCKET_IFNAME=$ifname RINGFENCE_CHECK_CALLS=$mode "$run" --tag-output -n "$n" "$perf" -b 8 -e "$max" -f 8 -d float -o sum \
        -n 300 -w 30 2>/dev/null | awk '/^\[0\] +[0-9]/ {print $2, $7}' >"$tmp/$n-$mode-$rep"
    done
  done
  for size in $(awk '{print $1}' "$tmp/$n-off-1"); do
    best() { cat "$tmp/$n-$1-"* | awk -v s="$size" '$1 == s {if (m == "" || $2 < m) m = $2} END {print m}'; }
    off=$(best off) on=$(best on)
    printf '| %s | %s | %s | %s | %s |\n' "$n" "$size" "$off" "$on" "$(awk -v a="$on" -v b="$off" 'BEGIN {printf "%.2f", a / b}')"
  done
done
