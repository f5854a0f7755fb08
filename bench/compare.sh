#!/usr/bin/env bash
# compare.sh: ringfence vs MPI bus bandwidth for every collective, side by side in one
# command, next to the single-host memory-bandwidth bound busbw <= B(n-1)/n^2 (design.md §7).
#
#   bench/compare.sh [--build DIR] [--sizes MIN:MAX[:FACTOR]] [--iters N] [--warmup N]
#                    [--ranks "2 4"] [--repeat K] [--dtype T] [--op OP] [--inplace]
#                    [--collectives "all_reduce reduce_scatter ..."] [--metric busbw|time]
#                    [--timeout SEC] [--log-dir DIR]
#                    [--transport shm|tcp] [--ifname NAME] [--gloo | --no-gloo]
#
# For each collective and rank count it runs <collective>_perf under ringfence-run and
# mpi_<collective>_perf under mpirun (shared-memory BTL), alternating K times, and keeps each
# size's best busbw per library (timings on a shared box vary; best-of-K compares capabilities).
# "of-bound" is ringfence's busbw as a share of the bound (meaningful above the L3 cache size).
# Collectives: all_reduce reduce_scatter all_gather broadcast reduce alltoall sendrecv (default all).
# --metric time compares the time column instead (best = lowest; the ratio is MPI time over
# ringfence time, so > 1 still means ringfence is faster): use it for small-message latency.
# --transport tcp (default shm) forces sockets on one host: ringfence with
# RINGFENCE_TRANSPORTS=tcp RINGFENCE_SOCKET_IFNAME=<ifname>, MPI with --mca pml ob1
# --mca btl self,tcp --mca btl_tcp_if_include <ifname>; --ifname picks the interface (default lo).
# --gloo adds Gloo's ring allreduce over its tcp transport (gloo_all_reduce_perf, built when
# libgloo-dev is found; all_reduce only, a fresh FileStore directory per run) as a third column
# with ratio-gloo = ringfence / Gloo (time: Gloo / ringfence). On by default with --transport tcp
# when the program exists; --no-gloo turns it off.
# Exits 1 if any run fails (non-zero exit, timeout or no rows), 2 on a usage error.
set -uo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="$script_dir/../build"
sizes="64K:256M:4"
iters=20
warmup=3
ranks="2 4"
repeat=1
dtype=float
op=sum
column=8   # busbw column of the out-of-place half of the table (12 = in-place)
metric=busbw
placement=out-of-place
timeout_s=900
log_dir=""
collectives="all_reduce reduce_scatter all_gather broadcast reduce alltoall sendrecv"
transport=shm
ifname=lo
gloo=auto   # auto: on with --transport tcp when gloo_all_reduce_perf exists

usage() {
  sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}
die() { echo "compare.sh: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=${2:?}; shift 2 ;;
    --sizes) sizes=${2:?}; shift 2 ;;
    --iters) iters=${2:?}; shift 2 ;;
    --warmup) warmup=${2:?}; shift 2 ;;
    --ranks) ranks=${2:?}; shift 2 ;;
    --repeat) repeat=${2:?}; shift 2 ;;
    --dtype) dtype=${2:?}; shift 2 ;;
    --op) op=${2:?}; shift 2 ;;
    --inplace) column=12; placement=in-place; shift ;;
    --timeout) timeout_s=${2:?}; shift 2 ;;
    --log-dir) log_dir=${2:?}; shift 2 ;;
    --collectives) collectives=${2:?}; shift 2 ;;
    --metric) metric=${2:?}; shift 2 ;;
    --transport) transport=${2:?}; shift 2 ;;
    --ifname) ifname=${2:?}; shift 2 ;;
    --gloo) gloo=1; shift ;;
    --no-gloo) gloo=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

case "$metric" in
  busbw) ;;
  time) column=$((column - 2)) ;;
  *) die "--metric expects busbw or time" ;;
esac
IFS=: read -r min_b max_b factor <<<"$sizes"
[[ -n "$min_b" && -n "$max_b" ]] || die "--sizes expects MIN:MAX[:FACTOR], e.g. 64K:256M:4"
factor=${factor:-4}
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || die "--repeat expects a positive integer"
[[ "$transport" == shm || "$transport" == tcp ]] || die "--transport expects shm or tcp"

rf_run="$build/bin/ringfence-run"
memcpy_bw="$build/bin/memcpy_bw"
[[ -x "$rf_run" ]] || die "$rf_run not found: build first (cmake --build $build)"
for c in $collectives; do
  [[ -x "$build/bin/${c}_perf" ]] || die "$build/bin/${c}_perf not found: build first (cmake --build $build)"
done
gloo_perf="$build/bin/gloo_all_reduce_perf"
if [[ $gloo == auto ]]; then
  gloo=0
  [[ $transport == tcp && -x "$gloo_perf" ]] && gloo=1
elif [[ $gloo == 1 && ! -x "$gloo_perf" ]]; then
  die "$gloo_perf not found: install libgloo-dev, reconfigure and build it (cmake --build $build --target gloo_all_reduce_perf)"
fi

have_mpi=1
if ! command -v mpirun >/dev/null; then
  have_mpi=0
  echo "# MPI baseline unavailable (no mpirun): MPI columns show '-'" >&2
fi
if [[ $transport == tcp ]]; then
  mpirun_cmd=(mpirun --oversubscribe --bind-to none --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include "$ifname")
  rf_env=(env RINGFENCE_TRANSPORTS=tcp RINGFENCE_SOCKET_IFNAME="$ifname")
else
  mpirun_cmd=(mpirun --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader)
  rf_env=()
fi
[[ "$(id -u)" == 0 ]] && mpirun_cmd+=(--allow-run-as-root)

if [[ -n "$log_dir" ]]; then
  mkdir -p "$log_dir" || die "cannot create $log_dir"
  logs=$log_dir
else
  logs=$(mktemp -d "${TMPDIR:-/tmp}/ringfence-compare.XXXXXX")
  trap 'rm -rf "$logs"' EXIT
fi

perf_flags=(-b "$min_b" -e "$max_b" -f "$factor" -d "$dtype" -o "$op" -n "$iters" -w "$warmup" -c 0)
status=0

# run NAME LOGFILE CMD...: runs one benchmark, records failures, keeps its output in LOGFILE.
run() {
  local name=$1 log=$2
  shift 2
  timeout "$timeout_s" "$@" >"$log" 2>&1
  local rc=$?
  if [[ $rc -ne 0 ]] || ! grep -qE '^(\[[0-9]+\])? +[0-9]' "$log"; then
    echo "compare.sh: $name failed (exit $rc): $*" >&2
    tail -n 20 "$log" | sed 's/^/    /' >&2
    status=1
  fi
}

# lines TEXT: TEXT as lines, nothing at all when it is empty.
lines() { [[ -z "$1" ]] || printf '%s\n' "$1"; }

# best LOGFILES...: "size busbw" per size, the best busbw over the given runs. Strips the
# "[rank] " prefix ringfence-run puts on every line.
best() {
  cat "$@" 2>/dev/null | sed -E 's/^\[[0-9]+\] //' | awk -v c="$column" -v m="$metric" '!/^#/ && NF >= 13 && $1 ~ /^[0-9]+$/ {
      if (!($1 in bw)) bw[$1] = $c + 0
      else if (m == "time" ? ($c + 0 < bw[$1]) : ($c + 0 > bw[$1])) bw[$1] = $c + 0 } END { for (s in bw) printf "%s %.2f\n", s, bw[s] }' | sort -n
}

cores=$(nproc)
llc=$(getconf LEVEL3_CACHE_SIZE 2>/dev/null || echo 0)
echo "# ringfence vs MPI, collectives: $collectives; dtype $dtype op $op, sizes $min_b..$max_b x$factor, iters $iters," \
     "warmup $warmup, best of $repeat, $placement busbw in GB/s, $cores cores"
# The bound counts DRAM traffic: it holds once the buffers are well beyond the last-level
# cache; smaller messages run from cache and may exceed it.
[[ "${llc:-0}" -gt 0 ]] 2>/dev/null &&
  echo "# bound = B(n-1)/n^2 applies to messages well above the L3 cache ($((llc >> 20)) MiB); smaller ones run from cache"
if [[ $transport == tcp ]]; then
  echo "# transport tcp on $ifname: ringfence RINGFENCE_TRANSPORTS=tcp RINGFENCE_SOCKET_IFNAME=$ifname;" \
       "MPI --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include $ifname"
fi
if [[ $gloo == 1 ]]; then
  echo "# Gloo: gloo_all_reduce_perf (gloo::allreduce, ring, tcp transport on $ifname) for all_reduce;" \
       "$([[ $metric == time ]] && echo "ratio-gloo = Gloo time / ringfence time" || echo "ratio-gloo = ringfence / Gloo")"
  printf '%-15s %6s %12s %12s %12s %8s %12s %10s %12s %8s\n' "collective" "ranks" "size(B)" "ringfence" "MPI" "ratio" \
    "Gloo" "ratio-gloo" "bound" "of-bound"
else
  printf '%-15s %6s %12s %12s %12s %8s %12s %8s\n' "collective" "ranks" "size(B)" "ringfence" "MPI" "ratio" "bound" "of-bound"
fi
[[ $metric == time ]] && echo "# values are times in us (lower is better); ratio = MPI / ringfence"
declare -A bounds
for n in $ranks; do
  # Memory bandwidth with as many copying threads as ranks can run at once.
  threads=$(( n < cores ? n : cores ))
  B=""
  if [[ -x "$memcpy_bw" ]]; then
    B=$("$memcpy_bw" -q -t "$threads" -s 256M -n 5 2>/dev/null) || B=""
  fi
  bound="-"
  [[ -n "$B" ]] && bound=$(awk -v b="$B" -v n="$n" 'BEGIN { printf "%.2f", b * (n - 1) / (n * n) }')
  echo "# n=$n: memcpy B = ${B:-?} GB/s ($threads threads, read+write) -> busbw bound B(n-1)/n^2 = $bound GB/s"
  bounds[$n]=$bound
done

for c in $collectives; do
  rf_perf="$build/bin/${c}_perf"
  mpi_perf="$build/bin/mpi_${c}_perf"
  for n in $ranks; do
    rf_logs=()
    mpi_logs=()
    gloo_logs=()
    for ((k = 1; k <= repeat; k++)); do
      rf_log="$logs/ringfence.$c.n$n.$k.txt"
      run "ringfence $c n=$n" "$rf_log" "${rf_env[@]}" "$rf_run" -n "$n" "$rf_perf" "${perf_flags[@]}"
      rf_logs+=("$rf_log")
      if [[ $have_mpi == 1 && -x "$mpi_perf" ]]; then
        mpi_log="$logs/mpi.$c.n$n.$k.txt"
        run "mpi $c n=$n" "$mpi_log" "${mpirun_cmd[@]}" -np "$n" "$mpi_perf" "${perf_flags[@]}"
        mpi_logs+=("$mpi_log")
      fi
      if [[ $gloo == 1 && $c == all_reduce ]]; then
        # Gloo's FileStore must start empty: a fresh directory per run.
        gloo_log="$logs/gloo.$c.n$n.$k.txt"
        store=$(mktemp -d "${TMPDIR:-/tmp}/ringfence-gloo-store.XXXXXX") || die "mktemp failed"
        run "gloo $c n=$n" "$gloo_log" "$rf_run" -n "$n" "$gloo_perf" --store "$store" --iface "$ifname" "${perf_flags[@]}"
        rm -rf "$store"
        gloo_logs+=("$gloo_log")
      fi
    done

    table=$(join -a 1 -a 2 -e - -o 0,1.2,2.2 <(best "${rf_logs[@]}" | sort -k1,1) \
        <( ( [[ ${#mpi_logs[@]} -gt 0 ]] && best "${mpi_logs[@]}" ) | sort -k1,1))
    if [[ $gloo == 1 ]]; then
      join -a 1 -a 2 -e - -o 0,1.2,1.3,2.2 <(lines "$table" | sort -k1,1) \
          <( ( [[ ${#gloo_logs[@]} -gt 0 ]] && best "${gloo_logs[@]}" ) | sort -k1,1) | sort -n |
        awk -v c="$c" -v n="$n" -v m="$metric" -v bound="${bounds[$n]}" 'NF > 0 {
          ratio = ($2 != "-" && $3 != "-" && $3 > 0 && $2 > 0) ? sprintf("%.2f", m == "time" ? $3 / $2 : $2 / $3) : "-"
          rg = ($2 != "-" && $4 != "-" && $4 > 0 && $2 > 0) ? sprintf("%.2f", m == "time" ? $4 / $2 : $2 / $4) : "-"
          of = (m != "time" && $2 != "-" && bound != "-" && bound > 0) ? sprintf("%.0f%%", 100 * $2 / bound) : "-"
          printf "%-15s %6d %12d %12s %12s %8s %12s %10s %12s %8s\n", c, n, $1, $2, $3, ratio, $4, rg, bound, of }'
    else
      lines "$table" | sort -n |
        awk -v c="$c" -v n="$n" -v m="$metric" -v bound="${bounds[$n]}" 'NF > 0 {
          ratio = ($2 != "-" && $3 != "-" && $3 > 0 && $2 > 0) ? sprintf("%.2f", m == "time" ? $3 / $2 : $2 / $3) : "-"
          of = (m != "time" && $2 != "-" && bound != "-" && bound > 0) ? sprintf("%.0f%%", 100 * $2 / bound) : "-"
          printf "%-15s %6d %12d %12s %12s %8s %12s %8s\n", c, n, $1, $2, $3, ratio, bound, of }'
    fi
  done
done
[[ $status -ne 0 ]] && echo "# some runs failed (see above)" >&2
exit $status
