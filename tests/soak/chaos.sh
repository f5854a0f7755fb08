#!/usr/bin/env bash
# Chaos soak (issue #26): for DURATION seconds, start allreduce jobs of 4-8 ranks over shm or
# tcp, each with one random fault, and check how each ends:
#   exact   - exit 0, every element checked exact;
#   error   - a clear ringfence error (exit != 0, an "ringfence error (...)" line), in time;
#   WRONG   - wrong elements (reported or not): a failure of the library;
#   HANG    - the launcher's timeout (bound: the job's RINGFENCE_TIMEOUT_MS plus setup) had to
#             kill it: a failure of the library;
#   UNCLEAR - it failed without a ringfence error line: a failure too.
# Faults: flip (1e-6..1e-3 per byte) and drop (1e-4..1e-2 per write) on one link; delay and
# stall and throttle on one link; a link closed; SIGSTOP or SIGKILL of one rank; a job in another
# PID namespace started beside it (needs unshare -p; skipped where that fails).
#
#   tests/soak/chaos.sh DURATION [--build build] [--seed N] [--max-ranks 8] [--log FILE]
#
# Prints one line per run and a table of counts; exits 1 when any run was WRONG, HANG or UNCLEAR.
# A 60-second form runs in CI (ctest soak_chaos_60s); the 10-minute table is in
# docs/failure-semantics.md.
set -uo pipefail
duration=${1:?usage: chaos.sh DURATION [--build DIR] [--seed N] [--max-ranks N] [--log FILE]}
shift
build=build seed=$$ max_ranks=8 log=/dev/null
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --max-ranks) max_ranks=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    *) echo "chaos.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
run=$build/bin/ringfence-run perf=$build/bin/all_reduce_perf
[ -x "$run" ] && [ -x "$perf" ] || { echo "chaos.sh: build $build first (needs ringfence-run, all_reduce_perf)" >&2; exit 2; }
RANDOM=$seed
can_unshare=0
unshare -p -f --mount-proc true 2>/dev/null && can_unshare=1
pick() { local a=("$@"); echo "${a[RANDOM % ${#a[@]}]}"; }
declare -A count
bad=0 runs=0
timeout_ms=8000
end=$((SECONDS + duration))
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "chaos soak: ${duration} s, seed $seed, up to $max_ranks ranks, job timeout ${timeout_ms} ms" | tee -a "$log"
while [ $SECONDS -lt $end ]; do
  n=$((4 + RANDOM % (max_ranks - 3)))
  transport=$(pick shm tcp)
  a=$((RANDOM % n)) b=$(((a + 1 + RANDOM % (n - 1)) % n))
  link="$a-$b"
  kind=$(pick flip flip drop delay stall throttle close sigstop sigkill neighbour)
  fault="" signal="" neighbour=0
  case $kind in
    flip) fault="flip:rate=$(pick 1e-6 1e-5 1e-4 1e-3),link=$link,seed=$RANDOM" ;;
    drop) fault="drop:rate=$(pick 1e-4 1e-3 1e-2),link=$link,seed=$RANDOM" ;;
    delay) fault="delay:us=$(pick 10 100 1000),link=$link" ;;
    stall) fault="stall:after=$((RANDOM % 200)),ms=$(pick 500 3000 20000),link=$link" ;;
    throttle) fault="throttle:mbps=$(pick 50 300 1000),link=$link" ;;
    close) fault="close:after=$((RANDOM % 200)),link=$link" ;;
    sigstop) signal=STOP ;;
    sigkill) signal=KILL ;;
    neighbour) [ $can_unshare = 1 ] && neighbour=1 || kind=flip fault="flip:rate=1e-5,link=$link,seed=$RANDOM" ;;
  esac
  desc="$n ranks $transport $kind${fault:+ $fault}"
  started=$SECONDS
  set -m  # the job gets its own process group; a non-interactive shell would start it ignoring SIGINT
  iters=8
  [ -n "$signal" ] || [ $neighbour = 1 ] && iters=300  # long enough to be running when it comes
  RINGFENCE_TRANSPORTS=$transport RINGFENCE_TIMEOUT_MS=$timeout_ms RINGFENCE_FAULT=$fault \
    "$run" -n "$n" --timeout 120 "$perf" -b 64K -e 1M -f 4 -n $iters -w 1 -c 1 >"$out" 2>&1 &
  job=$!
  set +m
  victim=""
  if [ -n "$signal" ] || [ $neighbour = 1 ]; then
    for _ in $(seq 50); do [ "$(pgrep -P $job | wc -l)" -ge "$n" ] && break; sleep 0.05; done
    sleep "0.$((1 + RANDOM % 9))"
    if [ -n "$signal" ]; then
      victim=$(pgrep -P $job | sort -n | sed -n "$((1 + RANDOM % n))p")
      [ -n "$victim" ] && kill -$signal "$victim" 2>/dev/null
    else
      unshare -p -f --mount-proc "$run" -n 2 --timeout 60 "$perf" -b 1K -e 1K -n 2 -w 1 -c 1 >/dev/null 2>&1
    fi
  fi
  wait $job
  rc=$?
  [ "$signal" = STOP ] && [ -n "$victim" ] && kill -CONT "$victim" 2>/dev/null
  took=$((SECONDS - started))
  if grep -q "Out of bounds values : [1-9]" "$out" || grep -q "Out of bounds values : .*FAILED" "$out"; then
    verdict=WRONG
  elif [ $rc -eq 124 ]; then
    verdict=HANG
  elif [ $rc -eq 0 ] && grep -q "Out of bounds values : 0 OK" "$out"; then
    verdict=exact
  elif [ $rc -ne 0 ] && grep -q "ringfence error (\|ringfence-run: rank [0-9]* killed by signal" "$out"; then
    verdict=error  # a named error, or (SIGKILL) the launcher naming the rank that died
  else
    verdict=UNCLEAR
  fi
  case $verdict in WRONG|HANG|UNCLEAR) bad=$((bad + 1)); { echo "---- $desc"; tail -20 "$out"; } >>"$log" ;; esac
  why=$(grep -o "ringfence error ([a-z-]*)" "$out" | head -1)
  echo "$verdict  ${took}s  $desc${why:+  [$why]}" | tee -a "$log"
  count["$kind $verdict"]=$((${count["$kind $verdict"]:-0} + 1))
  runs=$((runs + 1))
done
echo
echo "| fault | exact | error | WRONG | HANG | UNCLEAR |"
echo "|---|---|---|---|---|---|"
for kind in flip drop delay stall throttle close sigstop sigkill neighbour; do
  row="| $kind"
  for v in exact error WRONG HANG UNCLEAR; do row="$row | ${count["$kind $v"]:-0}"; done
  echo "$row |"
done
echo
echo "chaos soak: $runs runs in $duration s (seed $seed): $bad failed (WRONG, HANG or UNCLEAR)"
[ $bad -eq 0 ]
