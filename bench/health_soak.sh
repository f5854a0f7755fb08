#!/usr/bin/env bash
# health_soak.sh: a clean soak for the always-on health layer. 4 ranks (or --ranks) run
# allreduces of every size from 8 B to 64 MiB, job after job, for --seconds (600), all ranks
# appending their health events to one log; prints the number of health events and re-plans
# (a clean machine must show none). Run it beside a build to load the cores the way a busy
# node would.
#   bench/health_soak.sh [--build build] [--ranks 4] [--seconds 600] [--log FILE]
set -uo pipefail
build=build ranks=4 seconds=600 log=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    *) echo "health_soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$log" ] || log=$(mktemp)
: >"$log"
end=$(($(date +%s) + seconds)) jobs=0 failed=0
while [ "$(date +%s)" -lt "$end" ]; do
  RINGFENCE_HEALTH_LOG=$log "$build/bin/ringfence-run" -n "$ranks" "$build/bin/all_reduce_perf" -b 8 -e 64M -f 4 -n 20 -w 2 \
    >/dev/null 2>&1 || failed=$((failed + 1))
  jobs=$((jobs + 1))
done
events=$(wc -l <"$log")
replans=$(grep -c '"replanned"' "$log")
echo "soak: $jobs jobs of $ranks ranks in ${seconds} s, $failed failed; health events: $events, re-plans: $replans (log $log)"
[ "$events" -eq 0 ] && [ "$failed" -eq 0 ]
