#!/usr/bin/env bash
# Shared-memory segments that neither leak nor get stolen (issue #26):
#  1. a job started in another PID namespace (unshare -p) while job A runs leaves A's segments
#     and results intact (it used to unlink every segment whose pid looked dead to it);
#  2. SIGKILL of one rank: once ringfence-run exits, no segment of the job is left in /dev/shm;
#  3. SIGINT to ringfence-run: the same.
# Usage: shm_segments.sh RINGFENCE_RUN ALL_REDUCE_PERF. Exits 77 (skip) only for case 1 where
# PID namespaces cannot be created; cases 2 and 3 always run.
set -uo pipefail
run=$1 perf=$2
fail() { echo "FAIL: $*"; exit 1; }

# The segments of the processes in $@ (rf-<pid>-…), one name per line.
segments_of() {
  local pid
  for pid in "$@"; do ls /dev/shm 2>/dev/null | grep "^rf-$pid-" || true; done
}
# Rank pids of a launcher: its children.
ranks_of() { pgrep -P "$1" | sort -n; }
# Waits (up to 20 s) until launcher $1 has $2 ranks that all own a segment.
await_segments() {
  local launcher=$1 n=$2 pids i
  for i in $(seq 200); do
    pids=$(ranks_of "$launcher")
    if [ "$(echo "$pids" | grep -c .)" -eq "$n" ]; then
      local all=1 p
      for p in $pids; do [ -n "$(segments_of "$p")" ] || all=0; done
      [ $all = 1 ] && { echo "$pids"; return 0; }
    fi
    sleep 0.1
  done
  return 1
}

# ---- 2 and 3: a killed job leaves nothing ------------------------------------------------------
# Job control on: a non-interactive shell starts background jobs with SIGINT ignored, and an
# ignored signal never reaches the launcher's signalfd.
set -m
for how in kill-rank interrupt-launcher; do
  "$run" -n 4 --timeout 120 "$perf" -b 1M -e 1M -n 1000000 -w 1 -c 0 --memory alloc >/dev/null 2>&1 &
  launcher=$!
  pids=$(await_segments $launcher 4) || { kill -9 $launcher; fail "$how: the job's segments never appeared"; }
  before=$(segments_of $pids | grep -c .)
  if [ $how = kill-rank ]; then kill -KILL "$(echo "$pids" | sed -n 2p)"; else kill -INT $launcher; fi
  wait $launcher
  rc=$?
  left=$(segments_of $pids)
  echo "$how: launcher exit $rc, $before segments while running, $(echo -n "$left" | grep -c .) left: ${left//$'\n'/ }"
  [ $rc -ne 0 ] || fail "$how: the launcher reported success"
  [ $rc -ne 124 ] || fail "$how: the job ran into its timeout instead of stopping"
  [ -z "$left" ] || fail "$how: segments left in /dev/shm"
done

# ---- 1: a neighbour in another PID namespace ---------------------------------------------------
set +m
if ! unshare -p -f --mount-proc true 2>/dev/null; then
  echo "SKIP: cannot create a PID namespace here (unshare -p)"
  exit 77
fi
# Job A checks its results (-c 1) and runs well past the neighbour.
"$run" -n 2 --timeout 120 "$perf" -b 1M -e 1M -n 20000 -w 1 -c 1 --memory alloc >/tmp/rf-shm-seg-a.$$ 2>&1 &
launcher=$!
pids=$(await_segments $launcher 2) || { kill -9 $launcher; fail "job A's segments never appeared"; }
# Job A makes more segments after its first ones (its --memory alloc buffers come after setup):
# compare against a set that stopped changing (two looks 0.5 s apart), not a partial one.
before=$(segments_of $pids | sort)
for _ in $(seq 40); do
  sleep 0.5
  now=$(segments_of $pids | sort)
  [ "$now" = "$before" ] && break
  before=$now
done
kill -0 $launcher 2>/dev/null || { cat /tmp/rf-shm-seg-a.$$; fail "job A ended before the neighbour started (make it longer)"; }
unshare -p -f --mount-proc "$run" -n 2 --timeout 60 "$perf" -b 1K -e 1K -n 2 -w 1 -c 1 >/dev/null 2>&1 ||
  fail "the neighbour job in a new PID namespace failed"
after=$(segments_of $pids | sort)
[ "$before" = "$after" ] || fail "job A's segments changed under the neighbour: before [${before//$'\n'/ }] after [${after//$'\n'/ }]"
echo "neighbour in a new PID namespace: job A kept its $(echo "$before" | grep -c .) segments"
wait $launcher
rc=$?
grep -q "Out of bounds values : 0 OK" /tmp/rf-shm-seg-a.$$ || { cat /tmp/rf-shm-seg-a.$$; rm -f /tmp/rf-shm-seg-a.$$; fail "job A's results"; }
rm -f /tmp/rf-shm-seg-a.$$
[ $rc -eq 0 ] || fail "job A exited $rc"
echo "job A finished exact (exit 0)"
echo "shm segments: all cases passed"
