#!/usr/bin/env bash
# The fault matrix (issue "Failure semantics"): {kill, stop, close, corrupt, drop} x {2, 4, 8
# ranks} x {shm, tcp} x {during a collective, between collectives}. Every cell runs fault_cell
# under ringfence-run and passes when every surviving rank ends in an exact result or a clear
# error naming the cause within 2 x RINGFENCE_TIMEOUT_MS. Prints the matrix as a Markdown table
# and exits 1 when any cell fails.
#
#   fault_matrix.sh RINGFENCE_RUN FAULT_CELL [--timeout-ms MS] [--faults "kill stop"]
#                   [--ranks "2 4"] [--transports "shm"] [--when "during"]
set -uo pipefail

run=$1 cell=$2
shift 2
timeout_ms=1000
faults="kill stop close corrupt drop"
ranks="2 4 8"
transports="shm tcp"
whens="during between"
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout-ms) timeout_ms=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --transports) transports=$2; shift 2 ;;
    --when) whens=$2; shift 2 ;;
    *) echo "fault_matrix.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
failed=0 cells=0
printf '| fault | ranks | transport | when | outcome (every reporting rank) | slowest error | slowest destroy | bound | verdict |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for fault in $faults; do
  for n in $ranks; do
    for transport in $transports; do
      for when in $whens; do
        cells=$((cells + 1))
        a=$((n - 2)) b=$((n - 1))
        env=(RINGFENCE_TIMEOUT_MS=$timeout_ms RINGFENCE_TRANSPORTS=$transport RINGFENCE_LOG=error)
        case "$fault" in
          close) [ "$when" = during ] && env+=(RINGFENCE_FAULT="close:after=40,link=$a-$b") ;;
          corrupt) env+=(RINGFENCE_CHECKSUM=on RINGFENCE_FAULT="flip:rate=1e-6,link=$a-$b,seed=11$( [ "$when" = between ] && echo ",at_ms=$timeout_ms")") ;;
          drop) env+=(RINGFENCE_CHECKSUM=on RINGFENCE_FAULT="drop:rate=0.02,link=$a-$b,seed=11$( [ "$when" = between ] && echo ",at_ms=$timeout_ms")") ;;
        esac
        out="$log/$fault-$n-$transport-$when.txt"
        start=$(date +%s%N)
        env "${env[@]}" timeout 120 "$run" -n "$n" --timeout 90 "$cell" "$fault" "$when" >"$out" 2>&1
        rc=$?
        wall=$(( ($(date +%s%N) - start) / 1000000 ))
        lines=$(grep -c "cell rank [0-9]*: " "$out")
        bad=$(grep -c "cell rank [0-9]*: .* FAIL" "$out")
        # Outcomes of the ranks that report (the victim of kill/stop cannot), e.g. "3x timeout".
        outcome=$(grep -o "cell rank [0-9]*: [a-zA-Z -]*after" "$out" | sed 's/cell rank [0-9]*: //; s/ after$//' | sort | uniq -c |
                  awk '{c=$1; $1=""; sub(/^ /,""); printf "%s%dx %s", (NR>1?", ":""), c, $0}')
        # The slowest destruction of a failed communicator (bounded too).
        destroy=$(grep -o "destroyed in [0-9]* ms" "$out" | awk 'BEGIN {m=0} {if ($3>m) m=$3} END {if (NR) print m " ms"; else print "-"}')
        # The slowest rank to end in an error (exact outcomes have no bound: they finished).
        slowest=$(grep "cell rank [0-9]*: " "$out" | grep -v ": exact after" | grep -o "after [0-9]* ms" |
                  awk 'BEGIN {m=0} {if ($2>m) m=$2} END {if (NR) print m " ms"; else print "-"}')
        expected=$n
        case "$fault" in kill|stop) expected=$((n - 1)) ;; esac
        verdict=PASS
        if [ "$rc" -ne 0 ] || [ "$bad" -ne 0 ] || [ "$lines" -lt "$expected" ]; then
          verdict="FAIL (rc $rc, $bad failing, $lines/$expected reported)"
          failed=$((failed + 1))
          { echo "---- $fault $n ranks $transport $when (wall ${wall} ms):"; cat "$out"; } >&2
        fi
        printf '| %s | %s | %s | %s | %s | %s | %s | %s ms | %s |\n' "$fault" "$n" "$transport" "$when" "${outcome:-none}" \
          "$slowest" "$destroy" "$((2 * timeout_ms))" "$verdict"
      done
    done
  done
done
echo
echo "fault matrix: $((cells - failed)) of $cells cells passed (RINGFENCE_TIMEOUT_MS=$timeout_ms, bound $((2 * timeout_ms)) ms)"
[ "$failed" -eq 0 ]
