#!/usr/bin/env bash
# The pictures of issue #28, drawn with gnuplot:
#  - `ringfence-health --plot LOG OUT.png` on the log of a 4-rank job whose link 1-2 corrupts
#    (flip, fenced within the job) writes a PNG; a log with no event exits 3 and writes none;
#  - `bench/compare.sh --plot OUT.png` with the smallest sweep that still measures ringfence and
#    one peer (Open MPI, else Gloo over tcp) writes a PNG next to its unchanged table.
# A PNG passes when it exists, is larger than 10 KB and starts with the PNG signature.
# Exits 77 (skipped) without gnuplot.
# Usage: plots.sh RINGFENCE_RUN ALL_REDUCE_PERF RINGFENCE_HEALTH REPO_ROOT
set -uo pipefail
[[ $# -eq 4 ]] || { echo "usage: plots.sh RINGFENCE_RUN ALL_REDUCE_PERF RINGFENCE_HEALTH REPO_ROOT" >&2; exit 2; }
run=$1 perf=$2 health=$3 repo=$4
command -v gnuplot >/dev/null || { echo "gnuplot missing (Debian: gnuplot-nox)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# check_png FILE WHAT: FILE is a PNG (signature) of more than 10 KB.
check_png() {
  local file=$1 what=$2 size signature
  [[ -f "$file" ]] || fail "$what: $file was not written"
  size=$(stat -c %s "$file")
  [[ $size -gt 10240 ]] || fail "$what: $file is only $size bytes (want > 10 KB)"
  signature=$(head -c 8 "$file" | od -An -tx1 | tr -d ' \n')
  [[ $signature == 89504e470d0a1a0a ]] || fail "$what: $file does not start with the PNG signature ($signature)"
  echo "$what: $file, $size bytes, PNG"
}

# --- ringfence-health --plot -------------------------------------------------------------
RINGFENCE_HEALTH_LOG="$work/health.jsonl" RINGFENCE_FAULT='flip:rate=1e-5,link=1-2,seed=3' \
  "$run" -n 4 --timeout 120 "$perf" -b 1M -e 1M -n 20 -w 1 >"$work/flip.out" 2>&1 ||
  fail "the corrupting job failed: $(tail -n 20 "$work/flip.out")"
grep -q '"link":"1-2"' "$work/health.jsonl" 2>/dev/null || fail "no event about link 1-2 in the health log"
"$health" --plot "$work/health.jsonl" "$work/health.png" || fail "ringfence-health --plot: exit $?"
check_png "$work/health.png" "health plot"
: >"$work/empty.jsonl"
"$health" --plot "$work/empty.jsonl" "$work/empty.png" 2>"$work/empty.err"
status=$?
[[ $status == 3 ]] || fail "ringfence-health --plot on an empty log: exit $status (want 3)"
[[ ! -e "$work/empty.png" ]] || fail "ringfence-health --plot wrote a PNG for an empty log"

# --- bench/compare.sh --plot --------------------------------------------------------------
# compare.sh takes the build directory: the one above the perf program's bin/.
build=$(cd "$(dirname "$perf")/.." && pwd)
peer_flags=() peer=""
if command -v mpirun >/dev/null && [[ -x "$build/bin/mpi_all_reduce_perf" ]]; then
  peer="Open MPI" peer_flags=(--no-gloo)
elif [[ -x "$build/bin/gloo_all_reduce_perf" ]]; then
  peer="Gloo" peer_flags=(--transport tcp --gloo)
fi
"$repo/bench/compare.sh" --build "$build" --collectives all_reduce --sizes 64K:256K:4 --iters 3 --warmup 1 \
  --ranks 2 --repeat 1 --timeout 120 ${peer_flags[@]+"${peer_flags[@]}"} --plot "$work/busbw.png" \
  >"$work/compare.out" 2>"$work/compare.err" || fail "compare.sh --plot: $(cat "$work/compare.out" "$work/compare.err")"
cat "$work/compare.out"
# The table is unchanged by --plot: two sizes, each with a ringfence figure (and the peer's).
rows=$(grep -cE '^all_reduce +2 +[0-9]+ +[0-9.]+ ' "$work/compare.out")
[[ $rows == 2 ]] || fail "compare.sh table: $rows rows with a ringfence figure (want 2)"
if [[ $peer == "Open MPI" ]]; then
  rows=$(grep -cE '^all_reduce +2 +[0-9]+ +[0-9.]+ +[0-9.]+ ' "$work/compare.out")
elif [[ $peer == Gloo ]]; then
  rows=$(grep -cE '^all_reduce +2 +[0-9]+ +[0-9.]+ +[-0-9.]+ +[-0-9.]+ +[0-9.]+ ' "$work/compare.out")
else
  echo "compare.sh: no peer here (no mpirun + mpi_all_reduce_perf, no gloo_all_reduce_perf): ringfence only"
fi
[[ $rows == 2 ]] || fail "compare.sh table: $rows rows with a $peer figure (want 2)"
grep -q "# plot: $work/busbw.png" "$work/compare.err" || fail "compare.sh did not report the plot: $(cat "$work/compare.err")"
check_png "$work/busbw.png" "compare.sh plot${peer:+ (ringfence and $peer)}"

echo "plots: all cases passed"
