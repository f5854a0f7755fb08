#!/usr/bin/env bash
# The ddp_train story in one command: the same 4-rank data-parallel training three times.
#   (a) fault-free                                   -> clean.csv
#   (b) link 0-1 flips bits, checksums off           -> faulty.csv    (loss diverges / NaN)
#   (c) the same fault, the defaults (checksums and health on) -> protected.csv (bit-identical to (a))
# Prints the fence events of (c), checks (a) == (c) byte for byte (exit 1 if not) and renders
# loss.png with gnuplot when it is installed.
#
# usage: examples/02_ddp_train/run.sh [--out DIR] [--steps N] [--fault SPEC]
#   --out DIR     output folder (default build/ddp_train)
#   --steps N     training steps per run (default: ddp_train's, 300)
#   --fault SPEC  RINGFENCE_FAULT for runs (b) and (c) (default flip:rate=1e-5,link=0-1,seed=7)
# Environment: BUILD_DIR (default build), RANKS (default 4).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD_DIR:-build}
ranks=${RANKS:-4}
out=$build/ddp_train
steps=()
fault="flip:rate=1e-5,link=0-1,seed=7"
while (($#)); do
  case $1 in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --steps) steps=(--steps "${2:?--steps needs a number}"); shift 2 ;;
    --fault) fault=${2:?--fault needs a spec}; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done

if [[ ! -x $build/bin/ddp_train || ! -x $build/bin/ringfence-run ]]; then
  echo "run.sh: $build/bin/ddp_train or ringfence-run missing; build first: scripts/build.sh" >&2
  exit 2
fi
mkdir -p "$out"

# run NAME [VAR=VALUE...]: one training run; stdout -> NAME.log, stderr -> NAME.err.
run() {
  local name=$1; shift
  local rc=0
  echo "== $name: ${*:-no fault}"
  env "$@" "$build/bin/ringfence-run" --tag-output -n "$ranks" "$build/bin/ddp_train" "${steps[@]}" \
    --csv "$out/$name.csv" --label "$name" >"$out/$name.log" 2>"$out/$name.err" || rc=$?
  grep -E '^\[0\] (summary|step +[0-9]+: epoch)' "$out/$name.log" | sed 's/^\[0\] /   /' || true
  if ((rc != 0)); then
    echo "run.sh: run $name failed (exit $rc); last lines of $out/$name.err:" >&2
    tail -n 20 "$out/$name.err" >&2
    return "$rc"
  fi
}

run clean RINGFENCE_CHECKSUM=off
run faulty RINGFENCE_FAULT="$fault" RINGFENCE_CHECKSUM=off
run protected RINGFENCE_FAULT="$fault"

echo "== fence events of the protected run (stderr):"
grep -E 'fenced link|proposing to fence' "$out/protected.err" || echo "   (none: no link was fenced)"

final() { tail -n 1 "$1" | cut -d, -f2; }
echo "== final loss: clean $(final "$out/clean.csv"), faulty $(final "$out/faulty.csv"), protected $(final "$out/protected.csv")"
if awk -F, -v c="$(final "$out/clean.csv")" 'NR > 1 { v = tolower($2); if (v ~ /nan|inf/) bad = 1 } END { if (v + 0 > 10 * c) bad = 1; exit !bad }' "$out/faulty.csv"; then
  echo "   faulty run diverged (non-finite loss or more than 10x the clean final loss)"
else
  echo "   note: the faulty run did not diverge with this fault spec (try another seed or a higher rate)"
fi

bad_step=$(awk -F, 'NR > 1 && tolower($2) ~ /nan|inf/ { print $1; exit }' "$out/faulty.csv")
if [[ -n "$(command -v gnuplot || true)" ]]; then
  # Non-finite losses are not drawn; a dotted line marks the step where the faulty run's
  # loss stops being a number.
  marker=""
  if [[ -n $bad_step ]]; then
    last_step=$(tail -n 1 "$out/faulty.csv" | cut -d, -f1)
    side="left offset 1,0"
    ((bad_step * 10 > last_step * 6)) && side="right offset -1,0"
    marker="set arrow from $bad_step, graph 0 to $bad_step, graph 1 nohead lw 2 dt 3 lc rgb '#d62728'
set label 'health off: loss is inf/NaN from step $bad_step on' at $bad_step, graph 0.93 $side tc rgb '#d62728'"
  fi
  fence_step=$(grep -m1 -oE 'step +[0-9]+: epoch' "$out/protected.log" | grep -oE '[0-9]+' || true)
  if [[ -n $fence_step ]]; then
    marker+="
set arrow from $fence_step, graph 0 to $fence_step, graph 1 nohead lw 1 dt 3 lc rgb '#08306b'
set label 'health on: link fenced at step $fence_step' at $fence_step, graph 0.86 left offset 1,0 tc rgb '#08306b'"
  fi
  gnuplot <<EOF
set datafile separator ','
set terminal pngcairo size 960,600 font ',11'
set output '$out/loss.png'
set title "ddp\\\\_train, $ranks ranks, link 0-1 flips bits ($fault)"
set xlabel 'step'
set ylabel 'global training loss (MSE, log scale)'
set logscale y
set format y '10^{%L}'
set grid
set key bottom left
$marker
ok(y) = (y == y && y > 0 && y < 1e300) ? y : NaN
plot '$out/clean.csv'     skip 1 using 1:(ok(\$2)) with lines lw 6 lc rgb '#9ecae1' title 'fault-free', \
     '$out/protected.csv' skip 1 using 1:(ok(\$2)) with lines lw 2 dt 2 lc rgb '#08306b' title 'link fault, health on (checksums, link fenced, ring re-planned)', \
     '$out/faulty.csv'    skip 1 using 1:(ok(\$2)) with lines lw 1.5 lc rgb '#d62728' title 'link fault, health off'
EOF
  echo "== plot: $out/loss.png"
else
  echo "== note: gnuplot is not installed (apt-get install gnuplot-nox); skipped $out/loss.png"
fi

if cmp "$out/clean.csv" "$out/protected.csv"; then
  echo "protected run is bit-identical to the fault-free run"
else
  echo "run.sh: FAILED: protected.csv differs from clean.csv" >&2
  exit 1
fi
