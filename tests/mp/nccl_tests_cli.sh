#!/usr/bin/env bash
# nccl-tests command lines against every <collective>_perf (issue #27): the canonical line of the
# nccl-tests README for one GPU per process (`-b 8 -e 128M -f 2 -g 1`) at 2 and 4 ranks must run
# unchanged and print what nccl-tests parsers read (the "# nThread 1 nGpus 1" header, 13-column
# rows, the out-of-bounds and average-bandwidth footer); the single-process multi-GPU line
# (`-g 8`) must be refused in one line with exit 2; -m (aggregated iterations), -N (cycles) and
# -J (JSON) must do what nccl-tests' do; ringfence's --fresh-send keeps results exact.
#
# usage: nccl_tests_cli.sh RINGFENCE_RUN BIN_DIR   (NCCL_TESTS_CLI_RANKS="2" narrows the rank counts)
set -uo pipefail
run=${1:?usage: nccl_tests_cli.sh RINGFENCE_RUN BIN_DIR}
bin=${2:?usage: nccl_tests_cli.sh RINGFENCE_RUN BIN_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
programs="all_reduce reduce_scatter all_gather broadcast reduce alltoall sendrecv"

# Rows as nccl-tests prints them: size count type redop root, then time algbw busbw #wrong twice.
rows() { grep -cE '^ +[0-9]+ +[0-9]+ +[a-z0-9]+ +[a-z]+ +-?[0-9]+( +[0-9.]+ +[0-9.]+ +[0-9.]+ +([0-9]+|N/A)| +N/A +N/A +N/A +N/A){2}$' "$1"; }

for n in ${NCCL_TESTS_CLI_RANKS:-2 4}; do
  for p in $programs; do
    out=$tmp/$p.$n.txt
    "$run" -n $n --timeout 300 "$bin/${p}_perf" -b 8 -e 128M -f 2 -g 1 >"$out" 2>&1
    rc=$?
    [ $rc = 0 ] || { tail -20 "$out"; fail "${p}_perf -b 8 -e 128M -f 2 -g 1 on $n ranks exited $rc"; }
    grep -q '^# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0$' "$out" ||
      { head -3 "$out"; fail "${p}_perf: no nccl-tests header line"; }
    grep -q '^# Out of bounds values : 0 OK$' "$out" || fail "${p}_perf on $n ranks: wrong values"
    grep -qE '^# Avg bus bandwidth    : [0-9.e+-]+$' "$out" || fail "${p}_perf: no average bus bandwidth line"
    r=$(rows "$out")
    # 8 B .. 128 MiB is 25 sizes; collectives over blocks skip sizes below one element per rank
    [ "$r" -ge 20 ] || { cat "$out"; fail "${p}_perf on $n ranks printed $r nccl-tests rows"; }
    echo "${p}_perf -b 8 -e 128M -f 2 -g 1, $n ranks: $r rows, 0 wrong"
  done
done

# One process driving 8 GPUs (the README's single-node line) cannot apply: one line, exit 2
# (the launcher adds its own line about the rank's exit).
"$run" -n 1 "$bin/all_reduce_perf" -b 8 -e 256M -f 2 -g 8 >"$tmp/g8.txt" 2>&1
rc=$?
[ $rc = 2 ] || fail "-g 8 exited $rc, expected 2"
grep -q -- "-g 8 cannot apply here: one GPU (or host buffer set) per rank" "$tmp/g8.txt" || { cat "$tmp/g8.txt"; fail "-g 8 message"; }
[ "$(grep -vc '^ringfence-run: ' "$tmp/g8.txt")" = 1 ] || { cat "$tmp/g8.txt"; fail "-g 8 printed more than one line"; }
echo "-g 8: refused in one line, exit 2"
# -m is nccl-tests' aggregation now; the old meaning names its new option.
"$run" -n 1 "$bin/all_reduce_perf" -m alloc >"$tmp/m.txt" 2>&1
[ $? = 2 ] && grep -q -- "--memory" "$tmp/m.txt" || { cat "$tmp/m.txt"; fail "-m alloc did not point to --memory"; }

# -m 4 -N 2 -J: two cycles of rows, and a JSON document with every row.
"$run" -n 2 "$bin/all_reduce_perf" -b 1K -e 64K -f 4 -m 4 -N 2 -J "$tmp/r.json" >"$tmp/j.txt" 2>&1 || { cat "$tmp/j.txt"; fail "-m 4 -N 2 -J"; }
grep -q "agg iters: 4" "$tmp/j.txt" || fail "-m 4 not in the header"
[ "$(rows "$tmp/j.txt")" = 8 ] || { cat "$tmp/j.txt"; fail "-N 2 over 4 sizes: expected 8 rows"; }
python3 - "$tmp/r.json" <<'PY' || fail "JSON output"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["program"] == "all_reduce_perf" and d["ranks"] == 2, d
assert d["parameters"]["agg_iters"] == 4 and d["parameters"]["run_cycles"] == 2, d["parameters"]
assert d["parameters"]["fresh_send"] is False, d["parameters"]
rows = d["results"]
assert len(rows) == 8, len(rows)
assert [r["cycle"] for r in rows] == [0] * 4 + [1] * 4
assert [r["size"] for r in rows[:4]] == [1024, 4096, 16384, 65536]
for r in rows:
    for k in ("out_of_place", "in_place"):
        m = r[k]
        assert m["wrong"] == 0 and m["time_us"] > 0 and m["busbw_gbps"] > 0, r
assert d["out_of_bounds"] == 0
print("JSON: %d rows, 2 cycles, every value checked" % len(rows))
PY
# -T: a per-call deadline; a value that is not a count is an error naming -T.
"$run" -n 2 "$bin/all_reduce_perf" -b 8 -e 8 -T 30 >"$tmp/t.txt" 2>&1 || { cat "$tmp/t.txt"; fail "-T 30"; }
"$run" -n 1 "$bin/all_reduce_perf" -T soon >"$tmp/t2.txt" 2>&1
[ $? = 2 ] && grep -q "invalid value 'soon' for -T" "$tmp/t2.txt" || { cat "$tmp/t2.txt"; fail "-T soon"; }
# --fresh-send 1: every call's send buffer stored again before it (untimed); results still exact
# (in place too, where the buffer holds the last call's result), and the header says so.
for p in all_reduce sendrecv all_gather; do
  "$run" -n 2 "$bin/${p}_perf" -b 1K -e 1M -f 32 -n 5 -w 2 -c 1 --fresh-send 1 -J "$tmp/f.json" >"$tmp/f.txt" 2>&1 ||
    { cat "$tmp/f.txt"; fail "${p}_perf --fresh-send 1"; }
  grep -q '"fresh_send": true' "$tmp/f.json" || fail "${p}_perf --fresh-send 1: not in the JSON parameters"
  grep -q "fresh-send: each call timed alone" "$tmp/f.txt" || { head -3 "$tmp/f.txt"; fail "--fresh-send not in the header"; }
  grep -q '^# Out of bounds values : 0 OK$' "$tmp/f.txt" || { cat "$tmp/f.txt"; fail "${p}_perf --fresh-send 1: wrong values"; }
  [ "$(rows "$tmp/f.txt")" = 3 ] || { cat "$tmp/f.txt"; fail "${p}_perf --fresh-send 1: expected 3 rows"; }
done
"$run" -n 1 "$bin/all_reduce_perf" --fresh-send yes >"$tmp/f2.txt" 2>&1
[ $? = 2 ] && grep -q "invalid value 'yes' for --fresh-send" "$tmp/f2.txt" || { cat "$tmp/f2.txt"; fail "--fresh-send yes"; }
echo "--fresh-send 1: exact, named in the header; a bad value refused"
# Under ringfence-run the output has the shape it has under mpirun (no prefix): the same lines
# once every number is masked.
if command -v mpirun >/dev/null; then
  "$run" -n 2 "$bin/all_reduce_perf" -b 8 -e 1K -f 4 >"$tmp/rf.txt" 2>&1 || fail "all_reduce_perf under ringfence-run"
  mpirun --allow-run-as-root --oversubscribe -np 2 "$bin/all_reduce_perf" -b 8 -e 1K -f 4 >"$tmp/mpi.txt" 2>&1 ||
    { cat "$tmp/mpi.txt"; fail "all_reduce_perf under mpirun"; }
  shape() { sed -E 's/[0-9]+(\.[0-9]+)?/N/g; s/ +/ /g' "$1"; }
  diff <(shape "$tmp/rf.txt") <(shape "$tmp/mpi.txt") || fail "output shape differs between ringfence-run and mpirun"
  echo "ringfence-run and mpirun: same output shape ($(wc -l <"$tmp/rf.txt") lines)"
fi
echo "nccl-tests command lines: all passed"
