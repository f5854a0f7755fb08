#!/usr/bin/env bash
# Heavy corruption on one link is repaired and fenced, not fatal (issue #26): with checksums on
# (the default) and every byte on link 0-1 flipped with probability RATE, an allreduce job of
# N ranks over TRANSPORT still ends with every element exact, and the health log shows link 0-1
# fenced by an agreement. Whole chunks never arrive intact at such rates; they are repaired
# piece by piece (src/ring_runner_repair.cpp) until the agreement fences the link.
# Usage: heavy_corruption.sh RINGFENCE_RUN ALL_REDUCE_PERF TRANSPORT RANKS RATE
set -uo pipefail
run=$1 perf=$2 transport=$3 n=$4 rate=$5
log=$(mktemp)
trap 'rm -f "$log"' EXIT
out=$(RINGFENCE_TRANSPORTS=$transport RINGFENCE_HEALTH_LOG=$log RINGFENCE_FAULT="flip:rate=$rate,link=0-1,seed=7" \
  "$run" -n "$n" --timeout 280 "$perf" -b 1M -e 2M -f 2 -n 5 -w 1 -c 1 2>&1)
rc=$?
echo "$out" | grep -v "#  Rank"
[ $rc -eq 0 ] || { echo "FAIL: the job exited $rc"; exit 1; }
echo "$out" | grep -q "Out of bounds values : 0 OK" || { echo "FAIL: wrong elements"; exit 1; }
grep -q '"event":"link_fenced","rank":0,"link":"0-1"' "$log" || { echo "FAIL: link 0-1 was not fenced"; cat "$log"; exit 1; }
errors=$(grep '"event":"checksum_errors"' "$log" | grep -o '"count":[0-9]*' | head -1)
echo "heavy corruption ($transport, $n ranks, flip $rate): exact, link 0-1 fenced ($errors corrupted deliveries counted)"
