#!/usr/bin/env bash
# compare.sh: ringfence vs MPI bus bandwidth for every collective, side by side in one
# command, next to the single-host memory-bandwidth bound busbw <= B(n-1)/n^2 (design.md §7).
#
#   bench/compare.sh [--build DIR] [--sizes MIN:MAX[:FACTOR]] [--iters N] [--warmup N]
#                    [--ranks "2 4"] [--repeat K] [--dtype T] [--op OP] [--inplace]
#                    [--collectives "all_reduce reduce_scatter ..."] [--metric busbw|time]
#                    [--timeout SEC] [--log-dir DIR]
#                    [--transport shm|tcp] [--ifname NAME] [--gloo | --no-gloo]
#                    [--bind core|none] [--plot OUT.png] [--fresh-send]
#
# For each collective and rank count it runs <collective>_perf under ringfence-run and
# mpi_<collective>_perf under mpirun (shared-memory BTL), alternating K times, and keeps each
# size's best busbw per library (timings on a shared box vary; best-of-K compares capabilities).
# "of-bound" is ringfence's busbw as a share of the bound (meaningful above the L3 cache size).
# --warmup (3) counts for every size: on the 2-core VMs a process's first write to each page of
# a staging slot costs ~4 us, and a 256 KiB call needs four calls to have written its quarter of
# the slot ring once, so with 3 ringfence's 64 KiB-1 MiB figures include first calls (2-rank
# allgather 256 KiB 0.37x against 1.29x with --warmup 30; docs/tuning.md "First writes to fresh
# slots"). Use --warmup 30 for the steady state up to 16 MiB (Open MPI's collapse at >= 64 MiB
# makes 30 warm-up calls there slow).
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
# --bind core (the default) pins each rank of every library to a core of its own where the ranks
# fit the cores (ringfence-run --bind-to core, mpirun --bind-to core: Open MPI's own default for
# 2 ranks), and pins none where they do not; --bind none never pins. Bound ringfence ranks spin
# longer in their waits (RINGFENCE_SPIN=auto, docs/tuning.md "Spinning on dedicated cores").
# Gloo is never pinned: its progress thread needs a core beside the caller's.
# --fresh-send passes --fresh-send 1 to every program: each rank stores its send buffer again
# before each timed call (untimed), as a producer of the data leaves it (modified in its own
# core's cache), and each call is timed alone. Without it the send buffer is
# written once, so a receiver that reads it across (Open MPI's single copy) finds it in its own
# cache from the call before (bench/README.md "Fresh send buffers").
# --plot OUT.png also draws the results with gnuplot (needed: exit 2 without it), one panel per
# collective: busbw (or time) against size on a log axis, one line per library measured and
# rank count, and the memory bound B(n-1)/n^2 as a horizontal line where memcpy_bw measured B.
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
plot=""     # --plot OUT.png
bind=core   # --bind: core where the ranks fit the cores, else none
fresh_send=0

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
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
    --plot) plot=${2:?}; shift 2 ;;
    --bind) bind=${2:?}; shift 2 ;;
    --fresh-send) fresh_send=1; shift ;;
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
[[ "$bind" == core || "$bind" == none ]] || die "--bind expects core or none"
# Checked before any run: a long sweep should not end in "cannot draw".
if [[ -n "$plot" ]]; then
  command -v gnuplot >/dev/null || die "--plot needs gnuplot (Debian: apt-get install gnuplot-nox)"
  [[ -d "$(dirname -- "$plot")" ]] || die "--plot: the directory of '$plot' does not exist"
fi

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
  mpirun_cmd=(mpirun --oversubscribe --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include "$ifname")
  rf_env=(env RINGFENCE_TRANSPORTS=tcp RINGFENCE_SOCKET_IFNAME="$ifname")
else
  mpirun_cmd=(mpirun --oversubscribe --mca pml ob1 --mca btl self,vader)
  rf_env=()
fi
[[ "$(id -u)" == 0 ]] && mpirun_cmd+=(--allow-run-as-root)

cleanup=()   # temporary directories, removed on exit
trap 'rm -rf ${cleanup[@]+"${cleanup[@]}"}' EXIT
if [[ -n "$log_dir" ]]; then
  mkdir -p "$log_dir" || die "cannot create $log_dir"
  logs=$log_dir
else
  logs=$(mktemp -d "${TMPDIR:-/tmp}/ringfence-compare.XXXXXX")
  cleanup+=("$logs")
fi
plot_blocks=()   # per gnuplot data block, in file order: "collective ranks has", has = 0/1 per library
if [[ -n "$plot" ]]; then
  # Apart from --log-dir, which keeps only the programs' own output.
  plot_tmp=$(mktemp -d "${TMPDIR:-/tmp}/ringfence-compare-plot.XXXXXX") || die "mktemp failed"
  cleanup+=("$plot_tmp")
  plot_data="$plot_tmp/data.txt"
  : >"$plot_data"
fi

perf_flags=(-b "$min_b" -e "$max_b" -f "$factor" -d "$dtype" -o "$op" -n "$iters" -w "$warmup" -c 0)
[[ $fresh_send == 1 ]] && perf_flags+=(--fresh-send 1)
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

# size_label BYTES: the size as the -b/-e flags write it (8B, 64K, 1M, 1.5M, 256M).
size_label() {
  awk -v s="$1" 'BEGIN { u = "B"; split("K M G T", us, " ")
    for (i = 1; i <= 4 && s >= 1024; i++) { s /= 1024; u = us[i] }
    printf (s == int(s) ? "%d%s" : "%.1f%s"), s, u }'
}

# gp_str TEXT: TEXT as a gnuplot single-quoted string (a quote inside is doubled).
gp_str() { printf "'%s'" "${1//\'/\'\'}"; }

# draw_plot: draws $plot_data (blocks described by plot_blocks) into $plot with gnuplot; 1 when
# there is nothing to draw or gnuplot fails.
draw_plot() {
  if [[ ${#plot_blocks[@]} -eq 0 ]] || ! grep -q '^[0-9]' "$plot_data"; then
    echo "compare.sh: --plot: no results to draw, $plot not written" >&2
    return 1
  fi
  local script="$plot_tmp/plot.gp" term=png font=""
  # pngcairo (anti-aliased, scalable fonts) where this gnuplot has it; libgd's png otherwise.
  if gnuplot -e 'set terminal' 2>&1 | grep -qw pngcairo; then term=pngcairo; font=' font "Sans,11"'; fi
  local -a names=("" "" ringfence "Open MPI" Gloo) colors=("" "" "#1f6fd1" "#e07b00" "#2a9d3a")
  local -a collectives_seen=() ranks_seen=()
  local b c n has
  for b in "${plot_blocks[@]}"; do
    read -r c n has <<<"$b"
    [[ " ${collectives_seen[*]} " == *" $c "* ]] || collectives_seen+=("$c")
    [[ " ${ranks_seen[*]} " == *" $n "* ]] || ranks_seen+=("$n")
  done
  local panels=${#collectives_seen[@]} ncol=1
  ((panels > 1)) && ncol=2
  local nrow=$(((panels + ncol - 1) / ncol))

  # Size labels at measured sizes, at most ~10, counted from the largest (the sizes that
  # matter most for bandwidth). Sizes within 25% of a larger one (allgather's 60 next to 64:
  # counts rounded to the rank count) share its label; 0 has no place on a log axis.
  local -a sizes
  mapfile -t sizes < <(awk '/^[0-9]/ && $1 > 0 { print $1 }' "$plot_data" | sort -n -r -u |
    awk 'NR == 1 || $1 * 1.25 <= last { print; last = $1 }' | sort -n)
  local step=$(((${#sizes[@]} + 9) / 10)) tics="" i
  for ((i = ${#sizes[@]} - 1; i >= 0; i -= step)); do
    tics+="${tics:+, }\"$(size_label "${sizes[i]}")\" ${sizes[i]}"
  done
  local ylabel="busbw (GB/s)" yscale="set yrange [0:*]; set offsets 0, 0, graph 0.05, 0"
  if [[ $metric == time ]]; then
    ylabel="time per call (us, lower is better)"
    yscale="set logscale y"
  fi
  {
    # noenhanced: names such as all_reduce are text, not subscripts.
    echo "set terminal $term noenhanced size $((ncol * 960)),$((nrow * 560))$font"
    echo "set output $(gp_str "$plot")"
    echo "set datafile missing '-'"
    echo "set logscale x 2"
    echo "set xrange [${sizes[0]} / 1.4 : ${sizes[-1]} * 1.4]"
    echo "set xtics ($tics)"
    echo "set xlabel 'message size (bytes)'"
    echo "set ylabel '$ylabel'"
    echo "$yscale"
    echo "set grid xtics ytics lc rgb '#c0c0c0' lw 1 dt 3"
    # Outside: inside, the key would hide the bound line or a curve.
    echo "set key outside right top vertical Left reverse box samplen 3"
    ((panels > 1)) && echo "set multiplot layout $nrow,$ncol"
    local k idx col dt plots
    for c in "${collectives_seen[@]}"; do
      echo "set title $(gp_str "$c: $dtype $op, $placement, $transport, best of $repeat")"
      plots=() idx=0
      for b in "${plot_blocks[@]}"; do
        read -r k n has <<<"$b"
        if [[ $k == "$c" ]]; then
          # Rank counts differ by dash and point type, libraries by colour.
          dt=1
          for ((i = 0; i < ${#ranks_seen[@]}; i++)); do [[ ${ranks_seen[i]} == "$n" ]] && dt=$((i + 1)); done
          for col in 2 3 4; do
            [[ ${has:col-2:1} == 1 ]] || continue
            plots+=("$(gp_str "$plot_data") index $idx using 1:$col with linespoints lw 2 dt $dt pt $((dt * 2 + 5)) ps 1.2 lc rgb '${colors[col]}' title '${names[col]}, n=$n'")
          done
          if [[ $metric == busbw && ${bounds[$n]:--} != - ]]; then
            plots+=("${bounds[$n]} with lines lw 1.5 dt $dt lc rgb '#606060' title 'bound B(n-1)/n^2, n=$n'")
          fi
        fi
        idx=$((idx + 1))
      done
      ((${#plots[@]} > 0)) || plots=("NaN title 'no results'")
      printf 'plot %s' "${plots[0]}"
      for ((i = 1; i < ${#plots[@]}; i++)); do printf ', \\\n     %s' "${plots[i]}"; done
      printf '\n'
    done
    ((panels > 1)) && echo "unset multiplot"
  } >"$script"
  if ! gnuplot "$script" >/dev/null; then
    echo "compare.sh: gnuplot failed (messages above), $plot not written" >&2
    return 1
  fi
  echo "# plot: $plot" >&2
}

cores=$(nproc)
llc=$(getconf LEVEL3_CACHE_SIZE 2>/dev/null || echo 0)
echo "# ringfence vs MPI, collectives: $collectives; dtype $dtype op $op, sizes $min_b..$max_b x$factor, iters $iters," \
     "warmup $warmup, best of $repeat, $placement busbw in GB/s, $cores cores, --bind $bind (ranks <= cores bound to a core each)"
[[ $fresh_send == 1 ]] &&
  echo "# --fresh-send: each rank writes its send buffer again before each call (untimed); each call timed alone"
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
    pin=none  # every library alike (--bind)
    [[ $bind == core && $n -le $cores ]] && pin=core
    rf_logs=()
    mpi_logs=()
    gloo_logs=()
    for ((k = 1; k <= repeat; k++)); do
      rf_log="$logs/ringfence.$c.n$n.$k.txt"
      run "ringfence $c n=$n" "$rf_log" "${rf_env[@]}" "$rf_run" --bind-to "$pin" -n "$n" "$rf_perf" "${perf_flags[@]}"
      rf_logs+=("$rf_log")
      if [[ $have_mpi == 1 && -x "$mpi_perf" ]]; then
        mpi_log="$logs/mpi.$c.n$n.$k.txt"
        run "mpi $c n=$n" "$mpi_log" "${mpirun_cmd[@]}" --bind-to "$pin" -np "$n" "$mpi_perf" "${perf_flags[@]}"
        mpi_logs+=("$mpi_log")
      fi
      if [[ $gloo == 1 && $c == all_reduce ]]; then
        # Gloo's FileStore must start empty: a fresh directory per run.
        gloo_log="$logs/gloo.$c.n$n.$k.txt"
        store=$(mktemp -d "${TMPDIR:-/tmp}/ringfence-gloo-store.XXXXXX") || die "mktemp failed"
        # Gloo unbound always: its transport's progress thread needs a core beside the caller's
        # (bound to one core per rank it moved 0.26 GB/s at 1 MiB; unbound 0.61-2.11 in two runs of the
        # same evening).
        run "gloo $c n=$n" "$gloo_log" "$rf_run" --bind-to none -n "$n" "$gloo_perf" --store "$store" --iface "$ifname" "${perf_flags[@]}"
        rm -rf "$store"
        gloo_logs+=("$gloo_log")
      fi
    done

    table=$(join -a 1 -a 2 -e - -o 0,1.2,2.2 <(best "${rf_logs[@]}" | sort -k1,1) \
        <( ( [[ ${#mpi_logs[@]} -gt 0 ]] && best "${mpi_logs[@]}" ) | sort -k1,1))
    if [[ $gloo == 1 ]]; then
      table=$(join -a 1 -a 2 -e - -o 0,1.2,1.3,2.2 <(lines "$table" | sort -k1,1) \
          <( ( [[ ${#gloo_logs[@]} -gt 0 ]] && best "${gloo_logs[@]}" ) | sort -k1,1))
    fi
    if [[ -n "$plot" ]]; then
      # One gnuplot data block per (collective, ranks), "size ringfence MPI Gloo" with '-' where
      # a library has no value; two blank lines end a block (gnuplot's `index`).
      { lines "$table" | sort -n | awk 'NF > 0 { print $1, $2, $3, (NF >= 4 ? $4 : "-") }'; printf '\n\n'; } >>"$plot_data"
      plot_blocks+=("$c $n $(lines "$table" | awk '{ for (i = 2; i <= NF; i++) if ($i != "-") has[i] = 1 }
          END { printf "%d%d%d", has[2], has[3], has[4] }')")
    fi
    if [[ $gloo == 1 ]]; then
      lines "$table" | sort -n |
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
[[ -n "$plot" ]] && { draw_plot || status=1; }
[[ $status -ne 0 ]] && echo "# some runs failed (see above)" >&2
exit $status
