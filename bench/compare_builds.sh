#!/usr/bin/env bash
# compare_builds.sh: two ringfence builds side by side (a refactor or an optimisation against
# the commit before it), every collective, alternating runs, best busbw per size of K runs.
#
#   bench/compare_builds.sh --base DIR --new DIR [--sizes MIN:MAX[:FACTOR]] [--ranks "2 4"]
#                           [--repeat K] [--iters N] [--warmup N] [--collectives "..."]
#                           [--inplace] [--metric busbw|time] [--max-loss PCT] [--timeout SEC]
#
# DIR is a build directory (or a copy of its bin/) holding ringfence-run and the *_perf
# programs. Each size's best busbw (or lowest time) over K alternating runs per build is compared:
# ratio = new / base (time: base / new), so > 1 means the new build is faster. A row whose ratio
# is below 1 - PCT/100 (default 10 %) is marked SLOWER and the script exits 1; run it on an idle
# machine (timings swing 2-3x with load). Exits 2 on a usage error.
set -uo pipefail

base="" new="" sizes="64K:64M:4" ranks="2 4" repeat=3 iters=20 warmup=3 timeout_s=900
collectives="all_reduce reduce_scatter all_gather broadcast reduce alltoall sendrecv"
column=8 metric=busbw placement=out-of-place max_loss=10

die() { echo "compare_builds.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --base) base=${2:?}; shift 2 ;;
    --new) new=${2:?}; shift 2 ;;
    --sizes) sizes=${2:?}; shift 2 ;;
    --ranks) ranks=${2:?}; shift 2 ;;
    --repeat) repeat=${2:?}; shift 2 ;;
    --iters) iters=${2:?}; shift 2 ;;
    --warmup) warmup=${2:?}; shift 2 ;;
    --collectives) collectives=${2:?}; shift 2 ;;
    --inplace) column=12; placement=in-place; shift ;;
    --metric) metric=${2:?}; shift 2 ;;
    --max-loss) max_loss=${2:?}; shift 2 ;;
    --timeout) timeout_s=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[[ -n "$base" && -n "$new" ]] || die "--base and --new are required"
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || die "--repeat expects a positive integer"
case "$metric" in busbw) ;; time) column=$((column - 2)) ;; *) die "--metric expects busbw or time" ;; esac
bin_of() { if [[ -x "$1/bin/ringfence-run" ]]; then echo "$1/bin"; elif [[ -x "$1/ringfence-run" ]]; then echo "$1"; else return 1; fi; }
base_bin=$(bin_of "$base") || die "no ringfence-run under $base or $base/bin"
new_bin=$(bin_of "$new") || die "no ringfence-run under $new or $new/bin"
IFS=: read -r min_b max_b factor <<<"$sizes"
factor=${factor:-4}
logs=$(mktemp -d "${TMPDIR:-/tmp}/ringfence-builds.XXXXXX")
trap 'rm -rf "$logs"' EXIT
perf_flags=(-b "$min_b" -e "$max_b" -f "$factor" -n "$iters" -w "$warmup" -c 0)
status=0

run() {  # run LOG BIN PERF N
  timeout "$timeout_s" "$2/ringfence-run" -n "$4" "$2/$3" "${perf_flags[@]}" >"$1" 2>&1
  local rc=$?
  if [[ $rc -ne 0 ]] || ! grep -qE '^(\[[0-9]+\])? +[0-9]' "$1"; then
    echo "compare_builds.sh: $2/$3 n=$4 failed (exit $rc)" >&2
    tail -n 10 "$1" | sed 's/^/    /' >&2
    echo "$2/$3 n=$4" >>"$logs/failed"  # the loop runs in a pipeline's subshell: tell the parent by file
  fi
}
# best LOGS...: "size value" per size, best over the runs (strips ringfence-run's "[rank] ").
best() {
  cat "$@" 2>/dev/null | sed -E 's/^\[[0-9]+\] //' | awk -v c="$column" -v m="$metric" '!/^#/ && NF >= 13 && $1 ~ /^[0-9]+$/ {
      if (!($1 in v)) v[$1] = $c + 0
      else if (m == "time" ? ($c + 0 < v[$1]) : ($c + 0 > v[$1])) v[$1] = $c + 0 } END { for (s in v) printf "%s %.3f\n", s, v[s] }' | sort -n
}

echo "# base $base_bin vs new $new_bin: $placement $metric, sizes $min_b..$max_b x$factor, iters $iters, warmup $warmup," \
     "best of $repeat alternating runs; ratio = $([[ $metric == time ]] && echo "base/new" || echo "new/base") (> 1: new faster)"
printf '%-15s %6s %12s %10s %10s %7s\n' collective ranks "size(B)" base new ratio
for c in $collectives; do
  for n in $ranks; do
    b_logs=() n_logs=()
    for ((k = 1; k <= repeat; k++)); do
      # Alternate which build goes first, so neither always runs on a warmer (or busier) machine.
      if (( k % 2 )); then
        run "$logs/b.$c.$n.$k" "$base_bin" "${c}_perf" "$n"; run "$logs/n.$c.$n.$k" "$new_bin" "${c}_perf" "$n"
      else
        run "$logs/n.$c.$n.$k" "$new_bin" "${c}_perf" "$n"; run "$logs/b.$c.$n.$k" "$base_bin" "${c}_perf" "$n"
      fi
      b_logs+=("$logs/b.$c.$n.$k") n_logs+=("$logs/n.$c.$n.$k")
    done
    # Sizes both builds reported, in size order.
    awk 'NR == FNR { b[$1] = $2; next } ($1 in b) { print $1, b[$1], $2 }' <(best "${b_logs[@]}") <(best "${n_logs[@]}") |
      while read -r size bv nv; do
      ratio=$(awk -v b="$bv" -v n="$nv" -v m="$metric" 'BEGIN { if (b <= 0 || n <= 0) print "-"; else printf "%.2f", (m == "time" ? b / n : n / b) }')
      mark=""
      awk -v r="$ratio" -v l="$max_loss" 'BEGIN { exit !(r != "-" && r < 1 - l / 100) }' && mark="  SLOWER"
      printf '%-15s %6s %12s %10s %10s %7s%s\n' "$c" "$n" "$size" "$bv" "$nv" "$ratio" "$mark"
      done
  done
done | tee "$logs/table"
grep -q SLOWER "$logs/table" && status=1
[[ -s "$logs/failed" ]] && status=1
exit $status
